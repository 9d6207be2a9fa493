"""The ``GET /acp`` SSE response: a connection's or a session's frames.

    stream = FrameStream(conn, heartbeat_s=15.0, on_close=release)
    stream = FrameStream(channel, heartbeat_s=15.0,
                         headers=[(b"x-qwen-event-epoch", epoch)], on_close=release)
    return stream                      # Starlette accepts any ASGI callable

Contracts:

* Beyond ``acp_server.http.sse.SseResponse``: one ``data:`` line per JSON-RPC message,
  preceded by ``id: N`` for bus events; ``: hb`` after ``heartbeat_s`` seconds of
  silence.
* The frames come from a ``FrameSource`` (an ``AcpConnection`` or a
  ``SessionChannel``): a session's bus events are translated as they are taken, so
  nothing runs beside the response.
* The stream ends when its source ends (session closed with this connection,
  DELETE, reaping) or when the client disconnects. ``on_close`` runs exactly once
  either way; after a client disconnect ``after_disconnect`` (the registry's
  grace-period sweep) runs too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from acp_server.acp_http.frames import HEARTBEAT_COMMENT, Frame, sse_bytes
from acp_server.http.sse import SseResponse


class FrameSource(Protocol):
    async def wait_ready(self) -> bool:
        """A frame is ready (``True``) or the source ended (``False``); consumes nothing."""

    def pop(self) -> Frame | None: ...

    def sent(self, count: int) -> None:
        """The reader wrote every frame it popped."""


class FrameStream(SseResponse):
    def __init__(self, source: FrameSource, *, heartbeat_s: float,
                 on_close: Callable[[], None],
                 after_disconnect: Callable[[], Awaitable[None]] | None = None,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(keepalive_comment=HEARTBEAT_COMMENT, heartbeat_s=heartbeat_s,
                         headers=headers, on_close=on_close, after_disconnect=after_disconnect)
        self.source = source

    async def wait_ready(self) -> bool:
        return await self.source.wait_ready()

    def pop_frame(self) -> bytes | None:
        frame = self.source.pop()
        return sse_bytes(frame) if frame is not None else None

    def frames_sent(self, count: int) -> None:
        self.source.sent(count)
