"""The ``GET /acp`` SSE response: a connection's or a session's frames.

    stream = FrameStream(conn.frames, heartbeat_s=15.0, on_close=release)
    stream = FrameStream(channel.frames, pump=channel.pump, heartbeat_s=15.0,
                         headers=[(b"x-qwen-event-epoch", epoch)], on_close=release)
    return stream                      # Starlette accepts any ASGI callable

Contracts:

* Beyond ``acp_server.sse.SseResponse``: one ``data:`` line per JSON-RPC message,
  preceded by ``id: N`` for bus events; ``: hb`` after ``heartbeat_s`` seconds of
  silence.
* ``pump`` (a session stream's bus pump) runs only while the response is open.
* The stream ends when its frame source ends (session closed with this
  connection, DELETE, reaping) or when the client disconnects. ``on_close`` runs
  exactly once either way; after a client disconnect ``after_disconnect`` (the
  registry's grace-period sweep) runs too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from acp_server.acp_http.buffer import FrameBuffer
from acp_server.acp_http.frames import HEARTBEAT_COMMENT, sse_bytes
from acp_server.sse import SseResponse


class FrameStream(SseResponse):
    def __init__(self, frames: FrameBuffer, *, heartbeat_s: float,
                 on_close: Callable[[], None],
                 pump: Callable[[], Awaitable[None]] | None = None,
                 after_disconnect: Callable[[], Awaitable[None]] | None = None,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(keepalive_comment=HEARTBEAT_COMMENT, heartbeat_s=heartbeat_s,
                         headers=headers, on_close=on_close, pump=pump,
                         after_disconnect=after_disconnect)
        self.frames = frames

    async def wait_ready(self) -> bool:
        return await self.frames.wait()

    def pop_frame(self) -> bytes | None:
        frame = self.frames.pop()
        return sse_bytes(frame) if frame is not None else None

    def frames_sent(self, count: int) -> None:
        self.frames.sent(count)
