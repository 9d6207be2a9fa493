"""A request body that stops arriving is answered 408 in its door's shape
(``acp_server.http.body_clock``), over real HTTP/1.1 on the in-process server (both
backends); HTTP/2 against the shipped daemon: ``tests/hostile/test_h2_abuse.py``."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import pytest

from tests.harness import ServeProcess
from tests.rest.server import running_server

pytestmark = pytest.mark.anyio
BOUND_S = 30   # generous: the answer is waited on, not timed


async def answer_to_a_stalled_body(base_url: str, path: str) -> tuple[int, dict[str, object]]:
    """``POST path`` declaring 100 bytes, sending 10 and then nothing: the answer."""
    url = urlsplit(base_url)
    async with await anyio.connect_tcp(url.hostname or "127.0.0.1", url.port or 80) as sock:
        await sock.send(f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                        '{"a": 1, '.encode())
        received = b""
        with anyio.fail_after(BOUND_S):
            while b"\r\n\r\n" not in received:
                received += await sock.receive()
            head, _, body = received.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = next(int(line.split(":", 1)[1]) for line in lines
                          if line.lower().startswith("content-length:"))
            while len(body) < length:
                body += await sock.receive()
    return int(lines[0].split()[1]), json.loads(body)


async def test_each_door_answers_408(tmp_path: Path) -> None:
    async with running_server(tmp_path, header_timeout_ms=300) as srv:
        status, rest = await answer_to_a_stalled_body(srv.base_url, "/session")
        assert status == 408 and rest["code"] == "request_timeout", rest
        status, acp = await answer_to_a_stalled_body(srv.base_url, "/acp")
        assert status == 408 and acp["error"]["data"]["errorKind"] == "request_timeout", acp
        status, lmsp = await answer_to_a_stalled_body(srv.base_url, "/lmsp/v1/responses")
        assert status == 408 and lmsp["code"] == "request_timeout", lmsp
        assert lmsp["title"] == "Request timeout"
        # the server goes on: a whole body is served as before
        created = await srv.client.post("/session", json={})
        assert created.status_code == 200, created.text


@pytest.mark.parametrize("server", ["granian", "uvicorn"])
async def test_the_daemon_answers_408_over_http1(tmp_path: Path, server: str) -> None:
    async with ServeProcess(tmp_path, "--session-journal", "memory", "--http-server", server,
                            "--header-timeout-ms", "500") as daemon:
        status, rest = await answer_to_a_stalled_body(daemon.base_url, "/session")
        assert status == 408 and rest["code"] == "request_timeout", rest
