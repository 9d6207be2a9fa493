"""A request body that stops arriving is answered 408 in its door's shape
(``acp_server.http.body_clock``), over real HTTP/1.1 on the in-process server (both
backends), with ``Connection: close`` and the connection closed with it; HTTP/2
against the shipped daemon: ``tests/hostile/test_h2_abuse.py``."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import pytest

from acp_server.http.body_clock import BodyClock
from tests.harness import ServeProcess
from tests.rest.server import running_server

pytestmark = pytest.mark.anyio
BOUND_S = 30   # generous: the answer is waited on, not timed


async def answer_to_a_stalled_body(base_url: str, path: str
                                   ) -> tuple[int, dict[str, object], dict[str, str]]:
    """``POST path`` declaring 100 bytes, sending 10 and then nothing: the answer (its
    status, its JSON body, its headers, lowercased), read to the end of the connection:
    the server closes it with the 408 (``Connection: close``) rather than waiting on for
    a body it gave up on. A connection closed with no answer at all is the header
    timeout's (the head did not come within it: on a loaded machine the test's process
    may not run between its connect and its send for that long, 500 ms against the
    daemon): another is tried."""
    url = urlsplit(base_url)
    with anyio.fail_after(BOUND_S):
        while True:
            async with await anyio.connect_tcp(url.hostname or "127.0.0.1",
                                               url.port or 80) as sock:
                received = b""
                try:
                    await sock.send(f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                                    "Content-Type: application/json\r\nContent-Length: 100"
                                    "\r\n\r\n" '{"a": 1, '.encode())
                    while b"\r\n\r\n" not in received:
                        received += await sock.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                    if received:
                        raise
                    continue   # closed before the head came: the header timeout's
                head, _, body = received.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {name.strip().lower(): value.strip() for name, _, value in
                           (line.partition(":") for line in lines[1:])}
                while True:   # to the end: the server closes the connection
                    try:
                        body += await sock.receive()
                    except anyio.EndOfStream:
                        break
            assert len(body) == int(headers["content-length"]), (headers, body)
            return int(lines[0].split()[1]), json.loads(body), headers


async def test_each_door_answers_408(tmp_path: Path) -> None:
    async with running_server(tmp_path, header_timeout_ms=300) as srv:
        status, rest, headers = await answer_to_a_stalled_body(srv.base_url, "/session")
        assert status == 408 and rest["code"] == "request_timeout", rest
        assert headers["connection"] == "close", headers
        status, acp, headers = await answer_to_a_stalled_body(srv.base_url, "/acp")
        assert status == 408 and acp["error"]["data"]["errorKind"] == "request_timeout", acp
        assert headers["connection"] == "close", headers
        status, lmsp, headers = await answer_to_a_stalled_body(srv.base_url,
                                                              "/lmsp/v1/responses")
        assert status == 408 and lmsp["code"] == "request_timeout", lmsp
        assert lmsp["title"] == "Request timeout" and headers["connection"] == "close"
        # the server goes on: a whole body is served as before
        created = await srv.client.post("/session", json={})
        assert created.status_code == 200, created.text


@pytest.mark.parametrize("server", ["granian", "uvicorn"])
async def test_the_daemon_answers_408_over_http1(tmp_path: Path, server: str) -> None:
    async with ServeProcess(tmp_path, "--session-journal", "memory", "--http-server", server,
                            "--header-timeout-ms", "500") as daemon:
        status, rest, headers = await answer_to_a_stalled_body(daemon.base_url, "/session")
        assert status == 408 and rest["code"] == "request_timeout", rest
        # closed with its answer: uvicorn kept it open for its keep-alive timeout (5 s)
        assert headers["connection"] == "close", headers


# -- the clock itself, under both backends ------------------------------------------------
BODY = {"type": "http.request", "body": b"{}", "more_body": False}


async def test_a_body_already_there_passes_and_then_the_clock_stops() -> None:
    async def receive() -> dict[str, object]:
        return BODY
    clock = BodyClock(receive, timeout_s=0.01)
    assert await clock.receive() is BODY and not clock.timed_out


async def test_a_piece_that_comes_after_a_wait_passes() -> None:
    arrived = anyio.Event()

    async def receive() -> dict[str, object]:
        await arrived.wait()
        return BODY
    async def arrive() -> None:
        arrived.set()
    clock = BodyClock(receive, timeout_s=BOUND_S)
    async with anyio.create_task_group() as tg:
        tg.start_soon(arrive)
        assert await clock.receive() is BODY
    assert not clock.timed_out


async def test_a_piece_that_never_comes_is_a_disconnect_then_an_answer() -> None:
    async def receive() -> dict[str, object]:
        await anyio.Event().wait()
        raise AssertionError("unreachable")
    sent: list[object] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    async def answer(send: object) -> None:
        sent.append("408")
    clock = BodyClock(receive, timeout_s=0.05)
    guarded = clock.bind(send, answer)   # type: ignore[arg-type]
    assert (await clock.receive())["type"] == "http.disconnect" and clock.timed_out
    assert (await clock.receive())["type"] == "http.disconnect"
    await guarded({"type": "http.response.start", "status": 400})
    await guarded({"type": "http.response.body", "body": b""})
    await clock.settle()
    assert sent == ["408"]


async def test_an_outer_cancellation_is_not_taken_for_a_timeout() -> None:
    async def receive() -> dict[str, object]:
        await anyio.Event().wait()
        raise AssertionError("unreachable")
    clock = BodyClock(receive, timeout_s=BOUND_S)
    with anyio.CancelScope() as outer:
        outer.cancel()
        await clock.receive()
    assert outer.cancelled_caught and not clock.timed_out
