"""``acp_server.http.starting``: the socket's 503 while the store keeps the server from
starting, over a real loopback socket on both backends, with hostile heads."""

from __future__ import annotations

import json
import socket

import anyio
import pytest

from acp_server.app import DOORS
from acp_server.http.starting import MAX_HEAD_BYTES, answer_starting, request_path

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(("head", "path"), [
    (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", "/health"),
    (b"POST /lmsp/v1/tasks?x=1 HTTP/1.0\r\n\r\n", "/lmsp/v1/tasks"),
    (b"GET http://h:1/acp?x HTTP/1.1\r\n\r\n", "/acp"),
    (b"GET http://h:1 HTTP/1.1\r\n\r\n", "/"),
    (b"GET /a b HTTP/1.1\r\n\r\n", None),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", None),
    (b"\x16\x03\x01\x02\x00\x01", None),
    (b"", None),
])
def test_request_path(head: bytes, path: str | None) -> None:
    assert request_path(head) == path


async def _ask(port: int, data: bytes) -> bytes:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(data)
        answer = b""
        with anyio.fail_after(10):
            while True:
                try:
                    answer += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return answer


async def test_each_door_gets_its_503_and_hostile_heads_get_nothing() -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    answers: dict[str, bytes] = {}
    with sock:
        async with anyio.create_task_group() as tg:
            async def serve() -> None:
                await answer_starting(sock, DOORS, seconds=30)   # cancelled below

            tg.start_soon(serve)
            idle = await anyio.connect_tcp("127.0.0.1", port)   # sends nothing
            for name, head in [("health", b"GET /health HTTP/1.1\r\n\r\n"),
                               ("lmsp", b"GET /lmsp/v1/tasks HTTP/1.1\r\n\r\n"),
                               ("acp", b"POST /acp HTTP/1.1\r\n\r\n"),
                               ("rest", b"GET /session/x/status HTTP/1.1\r\n\r\n"),
                               ("huge", b"GET /x HTTP/1.1\r\nX: " + b"a" * MAX_HEAD_BYTES),
                               ("garbage", b"\x00\xff garbage\r\n\r\n")]:
                answers[name] = await _ask(port, head)
            await idle.aclose()
            tg.cancel_scope.cancel()
        # the socket still listens for the server that takes it next
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    assert answers["huge"] == answers["garbage"] == b""
    bodies = {}
    for name in ("health", "lmsp", "acp", "rest"):
        head, _, body = answers[name].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ")
        assert b"\r\nretry-after: 5" in head and b"\r\nconnection: close" in head
        bodies[name] = json.loads(body)
    assert bodies["health"] == {"status": "starting"}
    assert bodies["lmsp"]["code"] == bodies["rest"]["code"] == "store_unavailable"
    assert bodies["acp"]["error"]["data"]["errorKind"] == "store_unavailable"
    assert b"application/problem+json" in answers["lmsp"]
