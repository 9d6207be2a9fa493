"""Event wire types: the envelope every front door sends, encoded once per event.

    event = Event.build(7, "turn_complete", {"sessionId": sid, "stopReason": "end_turn"},
                        prompt_id=pid)
    event.json   # b'{"id":7,"v":1,"type":"turn_complete","promptId":...,"data":{...},"_meta":{...}}'

The SSE frame of an event is built by the front doors (``acp_server.http.sse.event_frame``),
once per event: ``sse_cache`` holds it for every subscriber.

Synthetic stream-control frames (``replay_complete``, ``state_resync_required``,
``slow_client_warning``, ``client_evicted``) have no id and no ``id:`` line.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

# Event types published on a session bus.
SESSION_UPDATE = "session_update"
PENDING_PROMPT_ADDED = "pending_prompt_added"
PENDING_PROMPT_STARTED = "pending_prompt_started"
PENDING_PROMPT_COMPLETED = "pending_prompt_completed"
TURN_COMPLETE = "turn_complete"
TURN_ERROR = "turn_error"
PROMPT_CANCELLED = "prompt_cancelled"
PERMISSION_REQUEST = "permission_request"
PERMISSION_RESOLVED = "permission_resolved"
SESSION_CLOSED = "session_closed"
SESSION_DIED = "session_died"

# Synthetic frames (never stored in the ring, no id).
REPLAY_COMPLETE = "replay_complete"
STATE_RESYNC_REQUIRED = "state_resync_required"
SLOW_CLIENT_WARNING = "slow_client_warning"
CLIENT_EVICTED = "client_evicted"

ELICITATION_REQUEST = "elicitation_request"     # bridge.elicitation
ELICITATION_RESOLVED = "elicitation_resolved"
ELICITATION_COMPLETE = "elicitation_complete"

BUS_EVENT_TYPES = (
    SESSION_UPDATE, PENDING_PROMPT_ADDED, PENDING_PROMPT_STARTED, PENDING_PROMPT_COMPLETED,
    TURN_COMPLETE, TURN_ERROR, PROMPT_CANCELLED, PERMISSION_REQUEST, PERMISSION_RESOLVED,
    SESSION_CLOSED, SESSION_DIED, ELICITATION_REQUEST, ELICITATION_RESOLVED,
    ELICITATION_COMPLETE,
)
SYNTHETIC_EVENT_TYPES = (REPLAY_COMPLETE, STATE_RESYNC_REQUIRED, SLOW_CLIENT_WARNING, CLIENT_EVICTED)


class EventMeta(msgspec.Struct, omit_defaults=True):
    serverTimestamp: int


class EventEnvelope(msgspec.Struct, omit_defaults=True, kw_only=True):
    """The JSON object of one event frame (``data:`` of an SSE frame). ``id`` is
    absent on synthetic frames."""

    id: int | None = None
    v: int
    type: str
    promptId: str | None = None
    originatorClientId: str | None = None
    data: Any
    meta: EventMeta | None = msgspec.field(default=None, name="_meta")


class _Data(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Base of the typed ``data`` payloads; ``None`` fields are left out."""


class PendingPromptAdded(_Data):
    sessionId: str
    promptId: str
    text: str
    queuedAt: int


class PendingPromptStarted(_Data):
    sessionId: str
    promptId: str
    text: str


class PendingPromptCompleted(_Data):
    sessionId: str
    promptId: str
    state: str  # completed | cancelled | failed


class TurnComplete(_Data):
    sessionId: str
    stopReason: str
    promptId: str


class TurnError(_Data):
    sessionId: str
    message: str
    code: str  # a string, as the peer sends it ("-32603", "prompt_deadline_exceeded", ...)
    promptId: str


class PromptCancelled(_Data):
    sessionId: str
    reason: str | None = None


class PermissionResolved(_Data):
    requestId: str
    sessionId: str
    outcome: dict[str, Any]
    voterClientId: str | None = None
    reason: str | None = None


class SessionClosed(_Data):
    sessionId: str
    reason: str
    closedBy: str | None = None


class SessionDied(_Data):
    sessionId: str
    reason: str
    message: str
    exitCode: int | None = None


class ReplayComplete(_Data):
    lastReplayedEventId: int
    lastEventId: int  # deprecated alias of lastReplayedEventId
    replayedCount: int


class StateResyncRequired(_Data):
    reason: str  # epoch_reset | ring_evicted | replay_budget_exceeded
    lastDeliveredId: int
    earliestAvailableId: int
    detail: str | None = None


class SlowClientWarning(_Data):
    queueSize: int
    maxQueued: int
    lastEventId: int
    queuedBytes: int
    maxQueuedBytes: int
    threshold: float


class ClientEvicted(_Data):
    reason: str  # queue_overflow | queue_bytes_overflow
    droppedAfter: int
    queueSize: int
    maxQueued: int
    queuedBytes: int
    maxQueuedBytes: int


_encoder = msgspec.json.Encoder()
_envelope_decoder = msgspec.json.Decoder(EventEnvelope)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Event:
    """One published (or synthetic) event; JSON and SSE bytes are built once."""

    __slots__ = ("id", "type", "data", "prompt_id", "timestamp_ms", "json", "sse_cache")

    def __init__(self, event_id: int | None, type_: str, data: Any, prompt_id: str | None,
                 timestamp_ms: int, json: bytes) -> None:
        self.id = event_id
        self.type = type_
        self.data = data
        self.prompt_id = prompt_id
        self.timestamp_ms = timestamp_ms
        self.json = json
        self.sse_cache: bytes | None = None   # owned by acp_server.http.sse.event_frame

    @classmethod
    def build(cls, event_id: int | None, type_: str, data: Any, *,
              prompt_id: str | None = None, originator_client_id: str | None = None) -> Event:
        ts = now_ms()
        envelope = EventEnvelope(v=1, type=type_, data=data, id=event_id, promptId=prompt_id,
                                 originatorClientId=originator_client_id,
                                 meta=EventMeta(serverTimestamp=ts))
        return cls(event_id, type_, data, prompt_id, ts, _encoder.encode(envelope))

    def envelope(self) -> EventEnvelope:
        return _envelope_decoder.decode(self.json)

    def __repr__(self) -> str:
        return f"Event(id={self.id!r}, type={self.type!r}, prompt_id={self.prompt_id!r})"
