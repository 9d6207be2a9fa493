"""The SSE response: a bridge ``Subscription`` written as a ``text/event-stream``.

    subscription = bridge.subscribe(session_id, last_event_id=12, epoch=epoch)
    return EventStreamResponse(subscription, epoch=epoch, heartbeat_s=15.0)

Contracts:

* The first write is ``retry: 3000\\n\\n``; then each event's prebuilt ``sse`` frame;
  a ``: heartbeat\\n\\n`` comment after ``heartbeat_s`` seconds without a frame.
* Frames that are ready together are written in one ``send`` (at most
  ``MAX_BATCH_BYTES`` per write), so a replay costs few writes.
* The stream ends when the subscription ends (``session_closed``, ``client_evicted``,
  shutdown). It also ends as soon as the client disconnects; either way the
  subscription is closed exactly once, so a gone client never holds a bus slot.
"""

from __future__ import annotations

import uuid

import anyio
from starlette.types import Receive, Scope, Send

from bridge.bus import Subscription

RETRY_FRAME = b"retry: 3000\n\n"
HEARTBEAT_FRAME = b": heartbeat\n\n"
MAX_BATCH_BYTES = 256 * 1024


class EventStreamResponse:
    """An ASGI response (Starlette accepts any ASGI callable as an endpoint's answer)."""

    def __init__(self, subscription: Subscription, *, epoch: str, heartbeat_s: float,
                 extra_headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.subscription = subscription
        self.heartbeat_s = heartbeat_s
        self.stream_id = str(uuid.uuid4())
        self.disconnected = False
        self.headers = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache, no-transform"),
            (b"x-accel-buffering", b"no"),
            (b"x-qwen-event-epoch", epoch.encode()),
            (b"x-qwen-sse-stream-id", self.stream_id.encode()),
            *(extra_headers or ()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            await send({"type": "http.response.body", "body": RETRY_FRAME, "more_body": True})
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_disconnect, receive, tg.cancel_scope)
                await self._pump(send)
                tg.cancel_scope.cancel()
            if not self.disconnected:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client went away mid-write
        finally:
            self.subscription.close()

    async def _watch_disconnect(self, receive: Receive, scope: anyio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                self.subscription.close()
                scope.cancel()
                return

    async def _pump(self, send: Send) -> None:
        subscription = self.subscription
        while True:
            event = subscription.receive_nowait()
            if event is None:
                if subscription.ended:
                    return
                with anyio.move_on_after(self.heartbeat_s):
                    try:
                        event = await subscription.__anext__()
                    except StopAsyncIteration:
                        return
                if event is None:
                    await send({"type": "http.response.body", "body": HEARTBEAT_FRAME,
                                "more_body": True})
                    continue
            chunk = [event.sse]
            size = len(chunk[0])
            while size < MAX_BATCH_BYTES:
                more = subscription.receive_nowait()
                if more is None:
                    break
                chunk.append(more.sse)
                size += len(more.sse)
            await send({"type": "http.response.body", "body": b"".join(chunk),
                        "more_body": True})
