"""Session events: what the bridge publishes on a session's bus, typed, in no door's wire.

    event = bus.publish(TURN_COMPLETE, TurnComplete(session_id=sid, stop_reason="end_turn",
                                                    prompt_id=pid), prompt_id=pid)
    event.data.stop_reason              # "end_turn": typed, snake_case
    wire.envelope(event)                # b'{"id":7,"v":1,"type":"turn_complete",...}'
    event.encoded(my_frame)             # any format of the event, built once

Contracts:

* ``data`` is one of the typed payloads below (the bridge's own events and the bus's
  stream-control frames), or an agent's ACP payload passed through untouched: a
  ``session_update``'s data is the whole ``session/update`` params as the agent sent
  them (``msgspec.Raw`` from a stdio agent, a dict from an in-process one).
* The wire shapes (the REST envelope, camelCase names, ``_meta.serverTimestamp``) are
  ``bridge.wire``'s; each door frames events for its own wire from there.
* An event does not change once published. ``encoded(fmt)`` returns the event in
  format ``fmt`` (a function of the event, e.g. ``bridge.wire.envelope``'s encoder or a
  door's SSE frame): built by the first reader, kept on the event for every other
  one. The function object is the cache key, so formats are module-level functions.
* ``size`` is the event's weight on the bus in bytes (its JSON envelope's length, set
  by the bus at publish): what subscriber queues and the replay budget count.
* Stream-control frames (``replay_complete``, ``state_resync_required``,
  ``slow_client_warning``, ``client_evicted``) have no id and are never in the ring.
"""

from __future__ import annotations

import time
from collections.abc import Callable
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
AGENT_ABANDONED = "agent_abandoned"   # bridge.abandoning: a turn the agent never ended
APPROVAL_MODE_CHANGED = "approval_mode_changed"   # a setter's success (bridge.setting_changes)
MODEL_SWITCHED = "model_switched"
MODEL_SWITCH_FAILED = "model_switch_failed"

# Stream-control frames (never stored in the ring, no id).
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
    ELICITATION_COMPLETE, AGENT_ABANDONED, APPROVAL_MODE_CHANGED, MODEL_SWITCHED,
    MODEL_SWITCH_FAILED,
)
SYNTHETIC_EVENT_TYPES = (REPLAY_COMPLETE, STATE_RESYNC_REQUIRED, SLOW_CLIENT_WARNING, CLIENT_EVICTED)


class Payload(msgspec.Struct, kw_only=True, frozen=True):
    """Base of the typed event payloads. ``bridge.wire`` renders each one under the
    same field names in camelCase, in the same order, leaving out ``None`` fields."""


class PendingPromptAdded(Payload):
    session_id: str
    prompt_id: str
    text: str
    queued_at: int   # epoch milliseconds


class PendingPromptStarted(Payload):
    session_id: str
    prompt_id: str
    text: str


class PendingPromptCompleted(Payload):
    session_id: str
    prompt_id: str
    state: str  # completed | cancelled | failed


class TurnComplete(Payload):
    session_id: str
    stop_reason: str
    prompt_id: str


class TurnError(Payload):
    session_id: str
    message: str
    code: str  # a string, as the peer sends it ("-32603", "prompt_deadline_exceeded", ...)
    prompt_id: str
    # the agent's ``data.errorKind`` (``context_length_exceeded``: the prompt was not kept)
    error_kind: str | None = None


class PromptCancelled(Payload):
    session_id: str
    reason: str | None = None


class PermissionRequest(Payload):
    """An agent's ``session/request_permission``, waiting for a vote: ``params`` are
    the agent's ACP params (``toolCall``, ``options``, ...) as sent."""

    request_id: str
    session_id: str
    params: dict[str, Any]


class ElicitationRequest(Payload):
    """An agent's ``elicitation/create``, waiting for an answer: ``params`` as sent."""

    request_id: str
    session_id: str
    params: dict[str, Any]


class ElicitationResolved(Payload):
    request_id: str
    session_id: str
    action: Any          # accept | decline | cancel | an extension's
    reason: str | None = None


class ElicitationComplete(Payload):
    """An agent's ``elicitation/complete`` (a URL elicitation finished): ``params`` as
    sent."""

    session_id: str
    params: dict[str, Any]


class PermissionResolved(Payload):
    request_id: str
    session_id: str
    outcome: dict[str, Any]   # ACP: {"outcome": "selected", "optionId": ...} or cancelled
    voter_client_id: str | None = None
    # why it was cancelled: cancelled | timeout | request_cancelled | turn_ended | …
    reason: str | None = None


class SessionClosed(Payload):
    session_id: str
    reason: str
    closed_by: str | None = None


class SessionDied(Payload):
    session_id: str
    reason: str
    message: str
    exit_code: int | None = None


class AgentAbandoned(Payload):
    """The agent did not end a cancelled turn within ``abandoned_turn_timeout_ms`` past
    its grace: the bridge gave up on it (``bridge.abandoning``). ``action``:
    ``agent_stopped`` (its process was stopped: the session was its only user) or
    ``session_detached`` (other sessions share it); the session's next prompt runs on
    its agent side restored anew."""

    session_id: str
    action: str
    waited_ms: int
    message: str
    prompt_id: str | None = None


class ApprovalModeChanged(Payload):
    """A session's mode set through a setter (qwen's ``approval_mode_changed``)."""

    session_id: str
    previous: str
    next: str
    persisted: bool   # always False: no settings file is written


class ModelSwitched(Payload):
    """A session's model set through a setter (qwen's ``model_switched``)."""

    session_id: str
    model_id: str


class ModelSwitchFailed(Payload):
    """The session's agent refused a model (or failed to answer): qwen's
    ``model_switch_failed``."""

    session_id: str
    requested_model_id: str
    error: str


class ReplayComplete(Payload):
    last_replayed_event_id: int
    last_event_id: int  # deprecated alias of last_replayed_event_id
    replayed_count: int


class StateResyncRequired(Payload):
    reason: str  # epoch_reset | ring_evicted | replay_budget_exceeded
    last_delivered_id: int
    earliest_available_id: int
    detail: str | None = None


class SlowClientWarning(Payload):
    queue_size: int
    max_queued: int
    last_event_id: int
    queued_bytes: int
    max_queued_bytes: int
    threshold: str   # frames | bytes | frames_and_bytes: the bound(s) at 75 %


class ClientEvicted(Payload):
    reason: str  # queue_overflow | queue_bytes_overflow
    dropped_after: int
    queue_size: int
    max_queued: int
    queued_bytes: int
    max_queued_bytes: int


# The typed payload of each event type; the others carry an agent's payload as sent.
PAYLOADS: dict[str, type[Payload]] = {
    PENDING_PROMPT_ADDED: PendingPromptAdded,
    PENDING_PROMPT_STARTED: PendingPromptStarted,
    PENDING_PROMPT_COMPLETED: PendingPromptCompleted,
    TURN_COMPLETE: TurnComplete,
    TURN_ERROR: TurnError,
    PROMPT_CANCELLED: PromptCancelled,
    PERMISSION_REQUEST: PermissionRequest,
    PERMISSION_RESOLVED: PermissionResolved,
    ELICITATION_REQUEST: ElicitationRequest,
    ELICITATION_RESOLVED: ElicitationResolved,
    ELICITATION_COMPLETE: ElicitationComplete,
    SESSION_CLOSED: SessionClosed,
    SESSION_DIED: SessionDied,
    AGENT_ABANDONED: AgentAbandoned,
    APPROVAL_MODE_CHANGED: ApprovalModeChanged,
    MODEL_SWITCHED: ModelSwitched,
    MODEL_SWITCH_FAILED: ModelSwitchFailed,
    REPLAY_COMPLETE: ReplayComplete,
    STATE_RESYNC_REQUIRED: StateResyncRequired,
    SLOW_CLIENT_WARNING: SlowClientWarning,
    CLIENT_EVICTED: ClientEvicted,
}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Event:
    """One published event (or a stream-control frame, ``id`` ``None``)."""

    # The first two formats built (the bus's envelope, then a door's frame) are kept in
    # slots of their own, any further one in a dict: no dict per event on the hot path.
    __slots__ = ("id", "type", "data", "prompt_id", "originator_client_id", "timestamp_ms",
                 "size", "_fmt0", "_enc0", "_fmt1", "_enc1", "_encoded")

    def __init__(self, event_id: int | None, type_: str, data: Any,
                 prompt_id: str | None = None, originator_client_id: str | None = None,
                 *, timestamp_ms: int | None = None) -> None:
        self.id = event_id
        self.type = type_
        self.data = data
        self.prompt_id = prompt_id
        self.originator_client_id = originator_client_id
        self.timestamp_ms = time.time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms
        self.size = 0
        self._fmt0: Callable[[Event], bytes] | None = None
        self._fmt1: Callable[[Event], bytes] | None = None
        self._encoded: dict[Callable[[Event], bytes], bytes] | None = None

    def encode_first(self, fmt: Callable[[Event], bytes]) -> bytes:
        """``encoded(fmt)`` of an event nothing has encoded yet (the bus's publish),
        without the look-up."""
        self._fmt0, self._enc0 = fmt, fmt(self)
        return self._enc0  # type: ignore[no-any-return]

    def encoded(self, fmt: Callable[[Event], bytes]) -> bytes:
        """This event in format ``fmt``, built once and kept (see the module contracts)."""
        if self._fmt0 is fmt:
            return self._enc0  # type: ignore[no-any-return]
        if self._fmt1 is fmt:
            return self._enc1  # type: ignore[no-any-return]
        cache = self._encoded
        found = cache.get(fmt) if cache is not None else None
        if found is None:
            found = fmt(self)   # (it may build other formats of this event first)
            if self._fmt0 is None:
                self._fmt0, self._enc0 = fmt, found
            elif self._fmt1 is None:
                self._fmt1, self._enc1 = fmt, found
            else:
                if self._encoded is None:
                    self._encoded = {}
                self._encoded[fmt] = found
        return found

    def __repr__(self) -> str:
        return f"Event(id={self.id!r}, type={self.type!r}, prompt_id={self.prompt_id!r})"
