"""The REST event stream: a bridge ``Subscription`` written as ``text/event-stream``.

    subscription = bridge.subscribe(session_id, last_event_id=12, epoch=epoch)
    return EventStreamResponse(subscription, epoch=subscription.epoch, heartbeat_s=15.0)

Contracts (beyond ``acp_server.http.sse.SseResponse``): each frame is the event's
``event_frame`` (``id:`` for bus events, ``event:`` its type, ``data:`` its
``bridge.wire`` envelope), built once per event and kept on it (``Event.encoded``)
for every subscriber; ``: heartbeat`` after silence; the response carries
``X-Qwen-Event-Epoch`` and a fresh ``X-Qwen-SSE-Stream-Id``; the subscription is closed
exactly once when the stream ends or the client goes, so a gone client never holds a
bus slot.
"""

from __future__ import annotations


from acp_server.http.sse import SseResponse, frame
from bridge.bus import Subscription
from bridge.events import Event
from bridge.ids import uuid4_str
from bridge.wire import envelope

HEARTBEAT_COMMENT = b"heartbeat"

__all__ = ["HEARTBEAT_COMMENT", "EventStreamResponse", "event_frame"]


def _sse_frame(event: Event) -> bytes:
    return frame(envelope(event), event=event.type, event_id=event.id)


def event_frame(event: Event) -> bytes:
    """An event's SSE frame, built once per event for every subscriber."""
    return event.encoded(_sse_frame)


class EventStreamResponse(SseResponse):
    def __init__(self, subscription: Subscription, *, epoch: str, heartbeat_s: float) -> None:
        self.subscription = subscription
        self.stream_id = uuid4_str()
        super().__init__(keepalive_comment=HEARTBEAT_COMMENT, heartbeat_s=heartbeat_s,
                         headers=[(b"x-qwen-event-epoch", epoch.encode()),
                                  (b"x-qwen-sse-stream-id", self.stream_id.encode())],
                         on_close=subscription.close)

    async def wait_ready(self) -> bool:
        return await self.subscription.wait_ready()

    def pop_frame(self) -> bytes | None:
        event = self.subscription.receive_nowait()
        return event.encoded(_sse_frame) if event is not None else None   # event_frame

    def pop_frames(self, max_bytes: int) -> list[bytes]:
        """A write's batch in one call (``Subscription.take``: its budget counts the
        events' envelopes, each frame ~40 bytes more)."""
        return [event.encoded(_sse_frame) for event in self.subscription.take(max_bytes)]
