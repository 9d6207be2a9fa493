"""A WebSocket connection's writer (``_forward``), driven with a hand-made source and
socket: a write that finds the client gone cancels the connection's scope and counts no
frame as sent; an ``OSError`` of the frames' own source is not taken for a disconnect;
a cancel from outside arriving while the connection unwinds a failed write propagates
(anyio's scope, and asyncio's own ``task.cancel()``). And the app driven with a
hand-made peer gone at the ``initialize`` answer: no connection kept."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import anyio
import anyio.abc
import anyio.lowlevel
import pytest
from starlette.websockets import WebSocketDisconnect

from acp_server.acp_http.frames import Frame
from acp_server.acp_http.websocket import _forward
from tests.acp_http.server import request, running_acp_server

INIT = request(0, "initialize", {"protocolVersion": 1})

pytestmark = pytest.mark.anyio


class Source:
    """Two frames, then the end; ``fail`` raises from ``wait_ready`` instead."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.fail = fail
        self.left = [Frame(2, b'{"n":2}'), Frame(1, b'{"n":1}')]
        self.counted = 0

    async def wait_ready(self) -> bool:
        if self.fail is not None:
            raise self.fail
        return bool(self.left)

    def pop(self) -> Frame | None:
        return self.left.pop() if self.left else None

    def sent(self, count: int) -> None:
        self.counted += count


class Socket:
    """Takes frames until the ``fail_at``-th, which finds the client gone."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.payloads: list[bytes] = []
        self.fail_at = fail_at
        self.failed = anyio.Event()

    async def send(self, payload: bytes) -> None:
        if self.fail_at is not None and len(self.payloads) + 1 >= self.fail_at:
            self.failed.set()
            raise WebSocketDisconnect(1006)
        self.payloads.append(payload)


async def _shielded_until(event: anyio.Event) -> None:
    """The connection's reader, still waiting for the client: keeps the group open."""
    with anyio.CancelScope(shield=True):
        await event.wait()


async def test_every_frame_is_written_and_counted() -> None:
    source, socket = Source(), Socket()
    connection = anyio.CancelScope()
    await _forward(source, socket, connection)  # type: ignore[arg-type]
    assert socket.payloads == [b'{"n":1}', b'{"n":2}'] and source.counted == 2
    assert not connection.cancel_called


async def test_a_failed_write_ends_the_connection_and_counts_nothing() -> None:
    source, socket = Source(), Socket(fail_at=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_forward, source, socket, tg.cancel_scope)
        await anyio.sleep_forever()   # the connection: cancelled by the writer
    assert tg.cancel_scope.cancel_called
    assert socket.payloads == [b'{"n":1}']
    assert source.counted == 1 and source.left == []   # the lost frame popped, not counted


async def test_an_oserror_of_the_source_is_not_a_disconnect() -> None:
    source, socket = Source(fail=TimeoutError("the store did not answer")), Socket()
    connection = anyio.CancelScope()
    with pytest.raises(TimeoutError):
        await _forward(source, socket, connection)  # type: ignore[arg-type]
    assert not connection.cancel_called


async def test_a_cancel_from_outside_during_a_failed_write_propagates() -> None:
    source, socket = Source(), Socket(fail_at=1)
    release, outer = anyio.Event(), anyio.CancelScope()

    async def serve() -> None:
        with outer:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_shielded_until, release)
                tg.start_soon(_forward, source, socket, tg.cancel_scope)
            await anyio.lowlevel.checkpoint()   # trio delivers a scope's cancel here

    async with anyio.create_task_group() as host:
        host.start_soon(serve)
        await socket.failed.wait()   # the write failed; the group waits on its reader
        outer.cancel()
        release.set()
    assert outer.cancelled_caught
    assert source.counted == 0


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_asyncio_task_cancel_during_a_failed_write_is_not_swallowed() -> None:
    """A server's own ``task.cancel()`` (uvicorn's graceful timeout, the loop's end)
    arriving while the connection's task group unwinds a failed write."""
    source, socket = Source(), Socket(fail_at=1)
    release = anyio.Event()

    async def connection() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_shielded_until, release)
            tg.start_soon(_forward, source, socket, tg.cancel_scope)

    task = asyncio.ensure_future(connection())
    await socket.failed.wait()
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


class GoneAtAnswer:
    """An ASGI WebSocket peer: it connects, sends ``initialize``, and is gone when the
    server writes the answer (the server's send raises ``OSError``, as uvicorn's does
    on a closed transport)."""

    def __init__(self, host: str) -> None:
        self.scope = {"type": "websocket", "path": "/acp", "raw_path": b"/acp",
                      "query_string": b"", "root_path": "", "scheme": "ws",
                      "headers": [(b"host", host.encode())], "subprotocols": [],
                      "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 80),
                      "asgi": {"version": "3.0"}}
        self.inbox: list[dict[str, object]] = [
            {"type": "websocket.connect"},
            {"type": "websocket.receive", "text": json.dumps(INIT)}]
        self.sent: list[str] = []

    async def receive(self) -> dict[str, object]:
        if self.inbox:
            return self.inbox.pop(0)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(self, message: dict[str, object]) -> None:
        self.sent.append(str(message["type"]))
        if message["type"] == "websocket.send":
            raise OSError("the client went away")


async def test_a_client_gone_before_the_initialize_answer_takes_no_connection(
        tmp_path: Path) -> None:
    """Deterministically, what the real-socket tests reach only by chance: the write of
    the ``initialize`` answer fails; the connection it made is closed again (its slot
    under ``--max-acp-connections`` free), the handler returns quietly."""
    async with running_acp_server(tmp_path, max_connections=1) as srv:
        peer = GoneAtAnswer(srv.base_url.removeprefix("http://"))
        with anyio.fail_after(10):
            await srv.server.app(peer.scope, peer.receive, peer.send)
        assert peer.sent[:2] == ["websocket.accept", "websocket.send"]
        assert not srv.registry.connections
        conn_id, _ = await srv.initialize()   # the one slot is free
        assert conn_id
