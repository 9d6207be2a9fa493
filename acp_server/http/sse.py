"""Server-Sent Events for every stream the server writes: framing, ``retry``,
keep-alive, response headers.

    frame(payload, event="turn_complete", event_id=7)  # b'id: 7\\nevent: turn_complete\\ndata: ...\\n\\n'
    keepalive(b"heartbeat")                            # b': heartbeat\\n'

    class MyStream(SseResponse):
        async def wait_ready(self) -> bool: ...     # frames ready (True) or the end (False)
        def pop_frame(self) -> bytes | None: ...     # one complete SSE frame, or None
        # optional: def pop_frames(self, max_bytes) -> list[bytes] (a batch in one call)

    return MyStream(keepalive_comment=b"heartbeat", heartbeat_s=15.0,
                    headers=[(b"x-qwen-event-epoch", epoch)], on_close=subscription.close)

The framing rule (one for the three doors): **no blank line ever ends a frame that has
no ``data:``.** Decoders that dispatch on any blank line once a field was set — the
OpenAI SDK's, httpx-sse's, both of which keep the last event id across events — would
otherwise yield an event with empty data. So:

* the first write is the field line ``retry: 3000`` *without* a blank line: it becomes
  part of the first event's frame (a browser ``EventSource`` applies it at once);
* a keep-alive is one comment line (``: heartbeat``) *without* a blank line: comment
  lines are ignored wherever they stand, so it prefixes the next frame harmlessly;
* every frame has exactly one ``data:`` line (JSON is one line), ``id:`` only when
  given, and ends with the one blank line.

``SseResponse`` contracts:

* Headers: ``SSE_HEADERS`` plus the door's own; status 200.
* Then the frames, several ready ones in one write (``pop_frames``: about
  ``MAX_BATCH_BYTES`` at most, one frame past it); the keep-alive after
  ``heartbeat_s`` seconds of silence.
* ``wait_ready`` consumes nothing, so the heartbeat timeout may cancel it safely;
  ``frames_sent`` reports each write of popped frames once it returned. A
  subclass may instead override ``write_frames`` (e.g. to pull from an iterator that
  produces its own keep-alive ticks).
* The stream ends when ``wait_ready`` answers ``False`` or the client disconnects;
  ``on_close`` runs exactly once either way, and after a client disconnect
  ``after_disconnect`` runs too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
from starlette.types import Message, Receive, Scope, Send

RETRY_MS = 3000
RETRY_LINE = b"retry: %d\n" % RETRY_MS
MAX_BATCH_BYTES = 256 * 1024
SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]

__all__ = ["MAX_BATCH_BYTES", "RETRY_LINE", "SSE_HEADERS", "SseResponse", "frame", "keepalive"]


def frame(data: bytes, *, event: str | None = None, event_id: int | None = None) -> bytes:
    """One complete SSE frame. ``data`` must be one line (compact JSON)."""
    if event is not None and type(event_id) is int:   # a bus event's: one allocation
        return b"id: %d\nevent: %s\ndata: %s\n\n" % (event_id, event.encode(), data)
    head = b"data: "
    if event is not None:
        head = b"event: " + event.encode() + b"\n" + head
    if event_id is not None:
        head = b"id: " + str(event_id).encode() + b"\n" + head
    return head + data + b"\n\n"


def keepalive(comment: bytes) -> bytes:
    """A keep-alive: one comment line, no blank line (see the framing rule)."""
    return b": " + comment + b"\n"


class SseResponse:
    """An ASGI response (Starlette accepts any ASGI callable as an endpoint's answer)."""

    def __init__(self, *, keepalive_comment: bytes, heartbeat_s: float,
                 headers: list[tuple[bytes, bytes]] | None = None,
                 on_close: Callable[[], None] | None = None,
                 after_disconnect: Callable[[], Awaitable[None]] | None = None) -> None:
        self.keepalive_frame = keepalive(keepalive_comment)
        self.heartbeat_s = heartbeat_s
        self.headers = [*SSE_HEADERS, *(headers or ())]
        self.on_close = on_close
        self.after_disconnect = after_disconnect
        self.disconnected = False
        self.finished = False   # the frames ended (not a disconnect)

    async def wait_ready(self) -> bool:
        raise NotImplementedError

    def pop_frame(self) -> bytes | None:
        raise NotImplementedError

    def pop_frames(self, max_bytes: int) -> list[bytes]:
        """Ready frames until ``max_bytes`` (at least one when any is ready): by
        default ``pop_frame`` one by one; a source may take them in one call."""
        chunk: list[bytes] = []
        size = 0
        while size < max_bytes:
            next_frame = self.pop_frame()
            if next_frame is None:
                break
            chunk.append(next_frame)
            size += len(next_frame)
        return chunk

    def frames_sent(self, count: int) -> None:
        """Called after ``count`` popped frames were handed to the server's transport."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            await send({"type": "http.response.body", "body": RETRY_LINE, "more_body": True})
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_disconnect, receive, tg.cancel_scope)
                try:
                    await self.write_frames(_WriteFailures(send))
                    self.finished = True
                except _ClientGone:   # caught here, not by the group: a cancel from
                    self.disconnected = True   # outside still propagates (no error group)
                tg.cancel_scope.cancel()
            if not self.disconnected:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:   # the client went away during the head or the final chunk
            self.disconnected = True
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

    async def write_frames(self, send: Send) -> None:
        """Write frames until the source ends; the keep-alive on silence."""
        while True:
            ready: bool | None = None
            with anyio.move_on_after(self.heartbeat_s):
                ready = await self.wait_ready()
            if ready is None:
                await send({"type": "http.response.body", "body": self.keepalive_frame,
                            "more_body": True})
                continue
            if not ready:
                return
            chunk = self.pop_frames(MAX_BATCH_BYTES)
            if chunk:
                await send({"type": "http.response.body", "body": b"".join(chunk),
                            "more_body": True})
                self.frames_sent(len(chunk))


class _ClientGone(Exception):
    """A write of the stream's frames failed: the client's transport is gone."""


class _WriteFailures:
    """``send`` with a failed write (the server's ``OSError``: uvicorn's
    ``ClientDisconnected``, granian's closed transport) raised as ``_ClientGone``, so
    that only the server's own write counts as the client gone, never an ``OSError``
    (a ``TimeoutError``) of the frames' source."""

    __slots__ = ("send",)

    def __init__(self, send: Send) -> None:
        self.send = send

    async def __call__(self, message: Message) -> None:
        try:
            await self.send(message)
        except OSError as exc:
            raise _ClientGone from exc
