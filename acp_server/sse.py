"""One Server-Sent Events response for every stream the server writes.

    class MyStream(SseResponse):
        async def wait_ready(self) -> bool: ...     # frames ready (True) or the end (False)
        def pop_frame(self) -> bytes | None: ...     # one complete SSE frame, or None

    return MyStream(heartbeat_frame=b": heartbeat\\n\\n", heartbeat_s=15.0,
                    headers=[(b"x-qwen-event-epoch", epoch)], on_close=subscription.close)

Contracts:

* The first write is ``retry: 3000``; then the frames, several ready ones in one write
  (at most ``MAX_BATCH_BYTES``); ``heartbeat_frame`` after ``heartbeat_s`` seconds of
  silence.
* ``wait_ready`` consumes nothing, so the heartbeat timeout may cancel it safely.
* ``pump`` (a task feeding the frames) runs only while the response is open.
* The stream ends when ``wait_ready`` answers ``False`` or the client disconnects;
  ``on_close`` runs exactly once either way, and after a client disconnect
  ``after_disconnect`` runs too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
from starlette.types import Receive, Scope, Send

RETRY_FRAME = b"retry: 3000\n\n"
MAX_BATCH_BYTES = 256 * 1024
SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]


class SseResponse:
    """An ASGI response (Starlette accepts any ASGI callable as an endpoint's answer)."""

    def __init__(self, *, heartbeat_frame: bytes, heartbeat_s: float,
                 headers: list[tuple[bytes, bytes]] | None = None,
                 on_close: Callable[[], None] | None = None,
                 pump: Callable[[], Awaitable[None]] | None = None,
                 after_disconnect: Callable[[], Awaitable[None]] | None = None) -> None:
        self.heartbeat_frame = heartbeat_frame
        self.heartbeat_s = heartbeat_s
        self.headers = [*SSE_HEADERS, *(headers or ())]
        self.on_close = on_close
        self.pump = pump
        self.after_disconnect = after_disconnect
        self.disconnected = False

    async def wait_ready(self) -> bool:
        raise NotImplementedError

    def pop_frame(self) -> bytes | None:
        raise NotImplementedError

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
            if self.on_close is not None:
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
        while True:
            ready: bool | None = None
            with anyio.move_on_after(self.heartbeat_s):
                ready = await self.wait_ready()
            if ready is None:
                await send({"type": "http.response.body", "body": self.heartbeat_frame,
                            "more_body": True})
                continue
            if not ready:
                return
            chunk: list[bytes] = []
            size = 0
            while size < MAX_BATCH_BYTES:
                frame = self.pop_frame()
                if frame is None:
                    break
                chunk.append(frame)
                size += len(frame)
            if chunk:
                await send({"type": "http.response.body", "body": b"".join(chunk),
                            "more_body": True})
