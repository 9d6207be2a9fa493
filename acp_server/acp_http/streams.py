"""The ``GET /acp`` SSE response: a connection's or a session's frames.

    stream = FrameStream(conn.frames, heartbeat_s=15.0, on_close=release)
    stream = FrameStream(channel.frames, pump=channel.pump, heartbeat_s=15.0,
                         headers=[(b"x-qwen-event-epoch", epoch)], on_close=release)
    return stream                      # Starlette accepts any ASGI callable

Contracts:

* The first write is ``retry: 3000``; then one ``data:`` line per JSON-RPC message,
  preceded by ``id: N`` for bus events; ``: hb`` after ``heartbeat_s`` seconds of
  silence. Frames that are ready together go out in one write (at most
  ``MAX_BATCH_BYTES``).
* ``pump`` (a session stream's bus pump) runs only while the response is open.
* The stream ends when its frame source ends (session closed with this
  connection, DELETE, reaping) or when the client disconnects. ``on_close`` runs
  exactly once either way; after a client disconnect ``after_disconnect`` (the
  registry's grace-period sweep) runs too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
from starlette.types import Receive, Scope, Send

from acp_server.acp_http.buffer import FrameBuffer
from acp_server.acp_http.frames import HEARTBEAT_FRAME, RETRY_FRAME, sse_bytes

MAX_BATCH_BYTES = 256 * 1024
SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]


class FrameStream:
    def __init__(self, frames: FrameBuffer, *, heartbeat_s: float,
                 on_close: Callable[[], None],
                 pump: Callable[[], Awaitable[None]] | None = None,
                 after_disconnect: Callable[[], Awaitable[None]] | None = None,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.frames = frames
        self.heartbeat_s = heartbeat_s
        self.on_close = on_close
        self.pump = pump
        self.after_disconnect = after_disconnect
        self.headers = [*SSE_HEADERS, *(headers or ())]
        self.disconnected = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            await send({"type": "http.response.body", "body": RETRY_FRAME, "more_body": True})
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_disconnect, receive, tg.cancel_scope)
                if self.pump is not None:
                    tg.start_soon(self.pump)
                await self._write(send)
                tg.cancel_scope.cancel()
            if not self.disconnected:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            self.disconnected = True   # the client went away mid-write
        finally:
            self.on_close()
        if self.disconnected and self.after_disconnect is not None:
            await self.after_disconnect()

    async def _watch_disconnect(self, receive: Receive, scope: anyio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                scope.cancel()
                return

    async def _write(self, send: Send) -> None:
        frames = self.frames
        while True:
            ready: bool | None = None
            with anyio.move_on_after(self.heartbeat_s):
                ready = await frames.wait()     # consumes nothing: safe to cancel
            if ready is None:
                await send({"type": "http.response.body", "body": HEARTBEAT_FRAME,
                            "more_body": True})
                continue
            if not ready:
                return
            chunk: list[bytes] = []
            size = 0
            while size < MAX_BATCH_BYTES:
                frame = frames.pop()
                if frame is None:
                    break
                chunk.append(sse_bytes(frame))
                size += len(chunk[-1])
            await send({"type": "http.response.body", "body": b"".join(chunk),
                        "more_body": True})
