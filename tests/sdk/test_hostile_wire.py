"""``DaemonClient`` and ``TaskClient`` against a raw server that sends what no daemon
should, byte for byte (``tests.sdk.rawserver``, real loopback HTTP): answers that never
come or trickle in, redirects to another host, a proxy's HTML page, error bodies that
never end, numbers too large for a float, ``Retry-After`` of a day, event epochs that
cannot be sent back, an event replayed for ever, an event stream that trickles a byte
at a time. Each call ends, in the SDK's own error, without the token leaving for
another host.
"""

from __future__ import annotations

import contextlib

import anyio
import httpx
import pytest

from acp_server.client import (DaemonClient, DaemonConnectionError, DaemonError, DaemonHttpError,
                               DaemonProtocolError, DaemonRateLimitError, DaemonStreamError)
from acp_server.client.events import StreamCursor, subscribe_events
from acp_server.client.tasks import RateLimitedError, TaskClient
from tests.sdk.rawserver import Conn, json_answer, raw_server, routes

pytestmark = pytest.mark.anyio

CEILING = 30   # what a broken client would wait for ever for: fail instead of hanging
PACE = 0.05    # a slow-loris server's pace (its own, not a wait of the test)


async def never_answer(conn: Conn) -> None:
    await conn.until_gone()


async def trickle_body(conn: Conn) -> None:
    await conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000000\r\n\r\n{")
    while await conn.send(b" "):
        await anyio.sleep(PACE)


async def trickle_head(conn: Conn) -> None:
    for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100_000:
        if not await conn.send(bytes([byte])):
            return
        await anyio.sleep(PACE)


# -- timeouts ----------------------------------------------------------------------------------
@pytest.mark.parametrize("script", [never_answer, trickle_body, trickle_head],
                         ids=["never", "trickled-body", "trickled-head"])
async def test_a_call_that_does_not_finish_within_the_timeout_fails(script) -> None:
    async with raw_server(script) as server, DaemonClient(server.url, timeout=0.5) as client:
        with anyio.fail_after(CEILING), pytest.raises(DaemonConnectionError,
                                                      match="GET /health failed: timed out"):
            await client.health()


async def test_the_task_client_times_out_a_trickled_answer() -> None:
    async with raw_server(trickle_body) as server, TaskClient(server.url, timeout=0.5) as tasks:
        with anyio.fail_after(CEILING), pytest.raises(DaemonConnectionError, match="timed out"):
            await tasks.get("task_1")


# -- redirects -----------------------------------------------------------------------------------
async def test_a_redirect_is_not_followed_and_the_token_stays() -> None:
    async with raw_server(json_answer(b'{"status": "ok"}')) as other:
        moved = json_answer(b"", 307, headers={"Location": f"{other.url}/health"})
        async with raw_server(moved) as server, \
                DaemonClient(server.url, token="secret-token") as client:
            with pytest.raises(DaemonHttpError) as caught:
                await client.health()
            with pytest.raises(DaemonHttpError):
                async with contextlib.aclosing(client.subscribe_events("s-1")) as events:
                    async for _ in events:
                        pass
        async with raw_server(moved) as server, \
                TaskClient(server.url, token="secret-token") as tasks:
            with pytest.raises(DaemonError) as task_caught:
                await tasks.get("task_1")
        assert server.requests[0].headers["authorization"] == "Bearer secret-token"
    assert other.requests == []
    assert caught.value.status == 307
    assert str(caught.value) == f"HTTP 307: redirected to {other.url}/health (not followed)"
    assert "redirected to" in str(task_caught.value)


# -- error answers ---------------------------------------------------------------------------------
PROXY_PAGE = (b"<!DOCTYPE html>\n<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n"
              b"<center><h1>502 Bad Gateway</h1></center>\n<hr><center>nginx</center>\n"
              b"</body>\n</html>\n")


async def test_a_proxy_page_is_one_line() -> None:
    page = json_answer(PROXY_PAGE, 502, content_type="text/html")
    async with raw_server(page) as server, DaemonClient(server.url) as client:
        with pytest.raises(DaemonHttpError) as caught:
            await client.create_or_attach_session()
    assert str(caught.value) == "HTTP 502: 502 Bad Gateway (a text/html answer)"
    assert caught.value.body == PROXY_PAGE.decode()


async def test_an_error_body_is_read_only_as_far_as_kept() -> None:
    sent = 0

    async def endless_error(conn: Conn) -> None:
        nonlocal sent
        await conn.head(500, content_type="application/json")
        while await conn.send(b"x" * 65536):
            sent += 65536

    async with raw_server(endless_error) as server, DaemonClient(server.url) as client:
        with anyio.fail_after(CEILING), pytest.raises(DaemonHttpError) as caught:
            await client.health()
    assert caught.value.status == 500
    assert len(caught.value.body) == 64 * 1024
    assert len(str(caught.value)) < 300


@pytest.mark.parametrize("body", [b'{"sessionId": 5}', b'[1, 2]', b'{"sessionId": "s", '
                                  b'"lastEventId": 1e400}', b'"just a string"'])
async def test_valid_json_of_the_wrong_shape_is_a_protocol_error(body: bytes) -> None:
    async with raw_server(json_answer(body)) as server, DaemonClient(server.url) as client:
        with pytest.raises(DaemonProtocolError, match="Malformed daemon answer"):
            await client.create_or_attach_session()


async def test_numbers_too_large_for_a_float_do_not_break_the_errors() -> None:
    huge = b"1" + b"0" * 400
    daemon_429 = json_answer(b'{"error": "slow down", "code": "rate_limit_exceeded", '
                             b'"retryAfterMs": ' + huge + b'}', 429)
    lmsp_429 = json_answer(b'{"code": "rate_limit_exceeded", "retry_after_ms": ' + huge
                           + b'}', 429)
    async with raw_server(daemon_429) as server, DaemonClient(server.url) as client:
        with pytest.raises(DaemonRateLimitError) as caught:
            await client.health()
    async with raw_server(lmsp_429) as server, TaskClient(server.url) as tasks:
        with pytest.raises(RateLimitedError) as task_caught:
            await tasks.get("task_1")
    assert caught.value.retry_after_s == float("inf")
    assert task_caught.value.retry_after_s == float("inf")


async def test_a_503_with_retry_after_is_raised_at_once_not_waited() -> None:
    busy = json_answer(b'{"error": "busy"}', 503, headers={"Retry-After": "86400"})
    async with raw_server(busy) as server, DaemonClient(server.url) as client:
        with anyio.fail_after(CEILING), pytest.raises(DaemonHttpError) as caught:
            await client.health()
    assert caught.value.status == 503 and len(server.requests) == 1


# -- event streams ------------------------------------------------------------------------------------
def _stream(*frames: bytes, epoch: str | None = None, then=None):
    async def script(conn: Conn) -> None:
        headers = {"X-Qwen-Event-Epoch": epoch} if epoch is not None else {}
        await conn.head(headers=headers)
        for frame in frames:
            await conn.send(frame)
        if then is not None:
            await then(conn)
    return script


async def _drain(http: httpx.AsyncClient, **options) -> list[object]:
    seen = []
    events = subscribe_events(http, "/session/s-1/events", reconnect_delay=0.01, **options)
    async with contextlib.aclosing(events) as stream:
        async for event in stream:
            seen.append(event)
    return seen


async def test_the_same_event_for_ever_is_not_progress() -> None:
    """A server that answers each reconnect with the event already seen, then ends."""
    replay = _stream(b'id: 1\ndata: {"type": "session_update", "id": 1}\n\n')
    async with raw_server(replay) as server, httpx.AsyncClient(base_url=server.url) as http:
        with anyio.fail_after(CEILING), pytest.raises(DaemonStreamError, match="after 3 attempts"):
            await _drain(http, cursor=StreamCursor(0), max_reconnects=3)
    assert len(server.requests) == 4


@pytest.mark.parametrize("epoch", ["\u00e9poque", "e" * 300, ""], ids=["latin-1", "long", "empty"])
async def test_an_epoch_that_cannot_be_sent_back_is_a_protocol_error(epoch: str) -> None:
    first = _stream(b'data: {"type": "session_update", "id": 1}\n\n', epoch=epoch)
    async with raw_server(first) as server, httpx.AsyncClient(base_url=server.url) as http:
        if not epoch:   # no epoch at all is not one: the stream is read as before
            with pytest.raises(DaemonStreamError):
                await _drain(http, cursor=StreamCursor(0), max_reconnects=1)
            return
        with pytest.raises(DaemonProtocolError, match="event epoch"):
            await _drain(http, cursor=StreamCursor(0), max_reconnects=1)


async def test_an_epoch_in_the_prompt_envelope_is_checked_too() -> None:
    script = routes({
        "POST /session/s-1/prompt": json_answer(
            b'{"promptId": "p-1", "lastEventId": 0, "eventEpoch": "a\\r\\nX-Injected: 1"}', 202),
        "GET /session/s-1/events": _stream(then=never_answer),
        "POST /session/s-1/cancel": json_answer(b"", 204),
    })
    async with raw_server(script) as server, DaemonClient(server.url) as client:
        with anyio.fail_after(CEILING), pytest.raises(DaemonProtocolError, match="event epoch"):
            await client.prompt("s-1", "hi")
    assert not any("x-injected" in r.headers for r in server.requests)


async def test_hostile_fields_are_ignored_and_the_events_read() -> None:
    frames = (b"retry: 99999999999999999999\n\nretry: -1\n\n", b"id: " + b"9" * 1_000_000 + b"\n",
              b'data: {"type": "session_update", "id": 1}\n\n',
              b'data: {"type": "session_closed", "id": 2}\n\n')
    async with raw_server(_stream(*frames)) as server, \
            httpx.AsyncClient(base_url=server.url) as http:
        seen = await _drain(http, cursor=StreamCursor(0))
    assert [e.type for e in seen] == ["session_update", "session_closed"]


@pytest.mark.parametrize("data", [b"[1, 2]", b'{"type": 5}', b'{"type": "x", "id": "one"}',
                                  b'{"type": "x", "id": 1' + b"0" * 5000 + b"}", b"{"])
async def test_an_event_of_the_wrong_shape_is_a_protocol_error(data: bytes) -> None:
    async with raw_server(_stream(b"data: " + data + b"\n\n")) as server, \
            httpx.AsyncClient(base_url=server.url) as http:
        with pytest.raises(DaemonProtocolError, match="Malformed daemon answer"):
            await _drain(http, cursor=StreamCursor(0))


async def test_a_task_event_of_the_wrong_shape_is_a_protocol_error() -> None:
    bad = _stream(b'data: {"type": "response.created", "sequence_number": "one"}\n\n')
    async with raw_server(bad) as server, TaskClient(server.url) as tasks:
        with pytest.raises(DaemonProtocolError, match="Malformed LMSP answer"):
            async with contextlib.aclosing(tasks.events("task_1")) as events:
                async for _ in events:
                    pass


async def _trickle_comment(conn: Conn) -> None:
    await conn.send(b": ")
    while await conn.send(b"x"):
        await anyio.sleep(PACE)


@pytest.mark.parametrize("then", [never_answer, _trickle_comment], ids=["silent", "trickled"])
async def test_a_stream_that_completes_no_line_is_dropped_and_bounded(then) -> None:
    """No complete line within the stream's read timeout is a drop (resumed, bounded by
    max_reconnects): a server trickling one line for ever cannot hold the client."""
    async with raw_server(_stream(then=then)) as server, \
            httpx.AsyncClient(base_url=server.url) as http:
        with anyio.fail_after(CEILING), pytest.raises(DaemonStreamError, match="after 2 attempts"):
            await _drain(http, cursor=StreamCursor(0), max_reconnects=2,
                         timeout=httpx.Timeout(5.0, read=0.3))
    assert len(server.requests) == 3


async def test_task_ids_are_one_path_segment() -> None:
    async with raw_server(json_answer(b'{"id": "t", "status": "queued"}')) as server, \
            TaskClient(server.url) as tasks:
        await tasks.get("../../session/x?y=1")
    assert server.requests[0].target == "/lmsp/v1/tasks/..%2F..%2Fsession%2Fx%3Fy%3D1"


@pytest.mark.parametrize("dots", [".", ".."])
async def test_an_id_of_dots_names_no_parent_path(dots: str) -> None:
    """httpx resolves a bare ``.``/``..`` segment: ``/lmsp/v1/tasks/..`` was ``/lmsp/v1``."""
    escaped = dots.replace(".", "%2E")
    async with raw_server(json_answer(b'{"id": "t", "status": "queued"}')) as server, \
            TaskClient(server.url) as tasks:
        await tasks.get(dots)
    async with raw_server(json_answer(b'{"sessionId": "s"}')) as daemon_server, \
            DaemonClient(daemon_server.url) as client:
        await client.session_status(dots)
    assert server.requests[0].target == f"/lmsp/v1/tasks/{escaped}"
    assert daemon_server.requests[0].target == f"/session/{escaped}/status"


async def test_wait_does_not_poll_for_ever_a_task_its_events_ended() -> None:
    """The events say the task ended; the task object says it still runs, for ever."""
    script = routes({
        "GET /lmsp/v1/tasks/task_1/events": _stream(
            b'data: {"type": "response.completed", "sequence_number": 1}\n\n'),
        "GET /lmsp/v1/tasks/": json_answer(b'{"id": "task_1", "status": "running"}'),
    })
    async with raw_server(script) as server, TaskClient(server.url) as tasks:
        with anyio.fail_after(CEILING), pytest.raises(DaemonProtocolError,
                                                      match="still 'running'"):
            await tasks.wait("task_1", poll_interval=0.01)
    gets = [r for r in server.requests if not r.target.endswith("/events")]
    assert len(gets) == 1 + 25


async def test_a_head_without_end_is_a_connection_error() -> None:
    """A header line of megabytes (sent at once): httpx's parser refuses it, bounded."""
    async def huge_header(conn: Conn) -> None:
        await conn.send(b"HTTP/1.1 200 OK\r\nX-Huge: " + b"h" * (4 * 1024 * 1024))
        await conn.until_gone()

    async with raw_server(huge_header) as server, DaemonClient(server.url) as client:
        with anyio.fail_after(CEILING), pytest.raises(DaemonConnectionError,
                                                      match="GET /health failed"):
            await client.health()
