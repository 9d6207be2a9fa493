"""``acp_server.http.http2`` with ASGI apps of the test's own, in this process (uvicorn
with the connection guard, real loopback, a raw HTTP/2 client reading the frames): what
an app's messages become on the wire, and what an app is given. asyncio only: uvicorn's
event loop is the test's."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from acp_server.http.guard import guarded_protocol
from acp_server.http.h2_machine import Http2Limits
from tests.hostile.h2frames import (
    INITIAL_WINDOW_SIZE, RawH2, data, headers, request_head, window_update)

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]
BOUND_S = 20
END_STREAM = 0x1


@contextlib.asynccontextmanager
async def h2_serving(app: Any, idle_s: float = 10.0) -> AsyncIterator[int]:
    """``app`` served by uvicorn with the guard and HTTP/2, as ``servers.UvicornServer``
    does; yields its port."""
    import uvicorn

    protocol = guarded_protocol(header_timeout_s=idle_s, max_connections=100,
                                http2=Http2Limits(idle_s=idle_s, max_header_list=65536))
    config = uvicorn.Config(app, host="127.0.0.1", port=0, http=protocol, lifespan="off",
                            log_level="warning", access_log=False, timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(BOUND_S):
            while not server.started:
                await anyio.sleep(0.005)
        try:
            yield server.servers[0].sockets[0].getsockname()[1]
        finally:
            server.should_exit = True


async def until(raw: RawH2, done: Any) -> None:
    with anyio.fail_after(BOUND_S):
        while not done() and not raw.got.closed:
            await raw.changed.wait()


def ended(raw: RawH2, stream_id: int) -> bool:
    return any(sid == stream_id and flags & END_STREAM for sid, _, flags in raw.got.data_frames)


async def test_an_empty_chunk_with_more_body_writes_no_frame() -> None:
    """``http.response.body`` with ``body=b""`` and ``more_body=True`` (a flush, a
    heartbeat with nothing in it) sends no DATA frame; the empty final one ends the
    stream (END_STREAM). Was an empty DATA frame each (a peer counting them as a
    CVE-2019-9518 flood could end the connection)."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for chunk, more in ((b"", True), (b"a", True), (b"", True), (b"", True),
                            (b"b", True), (b"", False)):
            await send({"type": "http.response.body", "body": chunk, "more_body": more})

    async with h2_serving(app) as port, anyio.create_task_group() as tg:
        raw = await RawH2.connect(port, tg)
        async with raw:
            await raw.send(headers(1, raw.block(request_head(port, "/")), end_stream=True))
            await until(raw, lambda: ended(raw, 1))
    assert raw.got.statuses == {1: 200}, raw.got
    assert raw.got.data_frames == [(1, 1, 0), (1, 1, 0), (1, 0, END_STREAM)], raw.got


async def test_split_cookie_fields_are_one_header() -> None:
    """Three ``cookie`` fields (HTTP/2 clients split them for HPACK, RFC 9113 8.2.3)
    reach the app as one ``cookie`` header joined with "; " (after the other fields),
    as an HTTP/1.1-style app (Starlette's ``request.cookies``) reads it: h2's own
    ``normalize_inbound_headers`` joins them, kept on here by this test."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = json.dumps([[n.decode(), v.decode()] for n, v in scope["headers"]]).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    async with h2_serving(app) as port, anyio.create_task_group() as tg:
        raw = await RawH2.connect(port, tg)
        async with raw:
            await raw.send(headers(1, raw.block(request_head(port, "/", [
                ("cookie", "a=1"), ("accept", "x"), ("cookie", "b=2"), ("cookie", "c=3")])),
                end_stream=True))
            await until(raw, lambda: ended(raw, 1))
    fields = json.loads(raw.got.bodies[1])
    assert fields == [["accept", "x"], ["cookie", "a=1; b=2; c=3"],
                      ["host", f"127.0.0.1:{port}"]], fields


async def test_two_tasks_receiving_at_once_are_both_given_the_body() -> None:
    """Two tasks of one app await ``receive()`` on one stream at once (as on uvicorn's
    HTTP/1.1, both may wait): each chunk goes to one of them and neither is left waiting.
    Was one wake-up per stream, the second waiter's overwriting the first's: the first
    hung for ever (and with it the stream and its app)."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        waiting, got = 0, []

        async def one() -> None:
            nonlocal waiting
            waiting += 1
            got.append((await receive())["body"])

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            tg.start_soon(one)
            while waiting < 2:   # both inside receive (it waits at once: no body yet)
                await anyio.sleep(0)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ready;", "more_body": True})
        await send({"type": "http.response.body", "body": b",".join(sorted(got))})

    async with h2_serving(app) as port, anyio.create_task_group() as tg:
        raw = await RawH2.connect(port, tg)
        async with raw:
            await raw.send(headers(1, raw.block(request_head(port, "/", method="POST"))))
            await until(raw, lambda: raw.got.data_bytes > 0)
            await raw.send(data(1, b"one"))
            await raw.send(data(1, b"two", end_stream=True))
            await until(raw, lambda: ended(raw, 1))
    assert raw.got.bodies[1] == b"ready;one,two", raw.got


async def test_an_event_stream_read_promptly_is_not_reset_by_a_stall_long_past() -> None:
    """An event stream to a client with a 512-byte window that gives back each byte as
    it reads it: an event of 600 bytes waits for the window (briefly), the next one, a
    header timeout later (the app's own pause), waits again. The stall's clock ran on
    from the first wait through the app's pause (600 bytes are short of
    ``PROGRESS_BYTES``), so the second wait reset the stream (CANCEL) at once: only the
    time an answer spends waiting for its window counts."""
    idle_s = 2.0
    event = b"data: " + b"x" * 592 + b"\n\n"

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": event, "more_body": True})
        await anyio.sleep(idle_s * 1.5)   # the app's pause between events, not a wait
        await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async with h2_serving(app, idle_s) as port, anyio.create_task_group() as tg:
        raw = await RawH2.connect(port, tg, local={INITIAL_WINDOW_SIZE: 512},
                                  answer_pings=True)
        async with raw:
            await raw.send(headers(1, raw.block(request_head(port, "/")), end_stream=True))
            given = 0
            with anyio.fail_after(BOUND_S):
                while not ended(raw, 1) and 1 not in raw.got.resets and not raw.got.closed:
                    if raw.got.data_bytes > given:   # a reader as fast as the wire
                        more, given = raw.got.data_bytes - given, raw.got.data_bytes
                        await raw.send(window_update(1, more) + window_update(0, more))
                        continue
                    await raw.changed.wait()
    assert raw.got.resets == {} and raw.got.bodies[1] == event * 2, raw.got


async def test_streams_sharing_a_connection_window_refilled_in_chunks_all_progress() -> None:
    """Two answers past the connection's window (65,535 bytes, the default) to a client
    that reads steadily and gives the connection window back 8 KiB at a time: each
    chunk woke the waiting streams in the order they were opened, so the first took it
    whole every time and the second, sent nothing, was reset (CANCEL) once it had
    waited the header timeout, while the first went on. The stream that waited longest
    goes first: both get through."""
    body = b"x" * (512 * 1024)   # 3.2 s alone at the client's pace: past the timeout

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    def done(raw: RawH2, sid: int) -> bool:
        return ended(raw, sid) or sid in raw.got.resets

    # a header timeout of 2 s: a stream that gets through waits ~0.1 s at a time, so a
    # loaded machine's stall of this process is not taken for a starved stream
    async with h2_serving(app, 2.0) as port, anyio.create_task_group() as tg:
        raw = await RawH2.connect(port, tg, local={INITIAL_WINDOW_SIZE: 1 << 24},
                                  answer_pings=True)
        async with raw:
            await raw.send(headers(1, raw.block(request_head(port, "/")), end_stream=True)
                           + headers(3, raw.block(request_head(port, "/")), end_stream=True))
            given = 0
            with anyio.fail_after(BOUND_S * 3):
                while not (done(raw, 1) and done(raw, 3)) and not raw.got.closed:
                    await anyio.sleep(0.05)   # the client's pace: 160 KiB a second
                    more = min(raw.got.data_bytes - given, 8192)
                    if more:
                        given += more
                        await raw.send(window_update(0, more))
    assert raw.got.resets == {} and raw.got.bodies == {1: body, 3: body}, (
        raw.got.resets, {sid: len(got) for sid, got in raw.got.bodies.items()})
