"""The wire vocabulary of events and errors, the one place the bridge names things as
the doors' clients see them (camelCase, as ``qwen serve`` does), encoded once.

    envelope(event)        # b'{"id":7,"v":1,"type":"turn_complete","promptId":"p1",
                           #    "data":{"sessionId":"s1",...},"_meta":{"serverTimestamp":...}}'
    wire_data(event)       # the ``data`` member in wire shape (``/acp``'s ``_qwen/notify``)
    decode_envelope(raw)   # EventEnvelope, e.g. in tests
    event_from_envelope(raw)   # the Event again, typed payload and all (a journal's read)
    error_details(exc)     # {"sessionId": "s1", "limit": 5, "pendingCount": 5}

Why here: the REST door sends every event as this envelope (``data:`` of an SSE
frame), ``/load`` hands the history over as envelopes, and the bus weighs events by
its length, so it is built once per event, on the hot path, and kept on the event
(``Event.encoded``). The doors frame it (REST's ``id:``/``event:`` lines,
``/acp``'s JSON-RPC notifications) and map errors to their own status codes; the
field names they share are here.

Contracts:

* ``envelope`` is built at most once per event; agents' payloads are written through
  as they came (``msgspec.Raw`` byte for byte, in-process agents' dicts as they are).
* The typed payloads of ``bridge.events`` are rendered as the Structs below: the same
  fields, in the same order, named in camelCase, ``None`` fields left out (a test
  checks that every payload has its twin). A ``permission_request`` and an
  ``elicitation_request`` are the agent's params plus ``requestId`` and ``sessionId``;
  an ``elicitation_complete`` the agent's params plus ``sessionId``.
* ``event_from_envelope(envelope(e))`` is ``e`` again: id, type, prompt id, originator,
  timestamp, typed payload (agents' payloads as the exact bytes they were; an agent's
  params in a request or completion keep the ``sessionId`` the wire added), and its
  ``envelope`` is the same bytes. So an envelope is a complete record of an event (what
  a session journal can store, issue #23).
* ``error_details`` gives a bridge error's typed fields under the peer's names, in
  the peer's order (both doors put them in their error bodies).
* ``agent_error`` is an agent's JSON-RPC error as the bridge holds it, and so as every
  door passes it on (a setter's refusal, a forwarded request's, an extension's, a
  refused ``session/new``, ``load`` or ``delete``, a failed prompt's ``turn_error``,
  REST's ``data``, ``/acp``'s ``message`` and ``data``): its ``message`` cut at
  ``MAX_AGENT_MESSAGE`` characters, its ``data`` as it is when it encodes to at most
  ``MAX_AGENT_DATA`` bytes of JSON, else the marker ``{errorKind?, truncated: true,
  bytes}`` (``cut_agent_data``; ``bytes`` is ``null`` for an in-process agent's value
  that does not encode). ``AgentError`` bounds itself as it is made, so an embedder's
  own connection's errors are bounded too: a hostile agent does not make answers
  megabytes.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import msgspec

from bridge import errors
from bridge import events as ev
from bridge.events import Event


# -- the event envelope -------------------------------------------------------------------
class EventMeta(msgspec.Struct, omit_defaults=True):
    serverTimestamp: int


class EventEnvelope(msgspec.Struct, omit_defaults=True, kw_only=True):
    """The JSON object of one event frame (``data:`` of a REST SSE frame). ``id`` is
    absent on stream-control frames."""

    id: int | None = None
    v: int
    type: str
    promptId: str | None = None
    originatorClientId: str | None = None
    data: Any
    meta: EventMeta | None = msgspec.field(default=None, name="_meta")


# -- the payloads' wire twins (bridge.events) --------------------------------------------
class _Data(msgspec.Struct, omit_defaults=True):
    """Base of the wire payloads; ``None`` fields are left out."""


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
    state: str


class TurnComplete(_Data):
    sessionId: str
    stopReason: str
    promptId: str


class TurnError(_Data):
    sessionId: str
    message: str
    code: str
    promptId: str
    errorKind: str | None = None   # an agent's own kind of error, when it names one


class PromptCancelled(_Data):
    sessionId: str
    reason: str | None = None


class ElicitationResolved(_Data):
    requestId: str
    sessionId: str
    action: Any
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


class AgentAbandoned(_Data):
    sessionId: str
    action: str   # agent_stopped | session_detached
    waitedMs: int
    message: str
    promptId: str | None = None


class ApprovalModeChanged(_Data):
    sessionId: str
    previous: str
    next: str
    persisted: bool


class ModelSwitched(_Data):
    sessionId: str
    modelId: str


class ModelSwitchFailed(_Data):
    sessionId: str
    requestedModelId: str
    error: str


class ReplayComplete(_Data):
    lastReplayedEventId: int
    lastEventId: int
    replayedCount: int


class StateResyncRequired(_Data):
    reason: str
    lastDeliveredId: int
    earliestAvailableId: int
    detail: str | None = None


class SlowClientWarning(_Data):
    queueSize: int
    maxQueued: int
    lastEventId: int
    queuedBytes: int
    maxQueuedBytes: int
    threshold: str   # frames | bytes | frames_and_bytes: the bound(s) at 75 %


class ClientEvicted(_Data):
    reason: str
    droppedAfter: int
    queueSize: int
    maxQueued: int
    queuedBytes: int
    maxQueuedBytes: int


# bridge payload type → its wire twin (same fields, same order).
TWINS: dict[type[ev.Payload], type[_Data]] = {
    ev.PendingPromptAdded: PendingPromptAdded,
    ev.PendingPromptStarted: PendingPromptStarted,
    ev.PendingPromptCompleted: PendingPromptCompleted,
    ev.TurnComplete: TurnComplete,
    ev.TurnError: TurnError,
    ev.PromptCancelled: PromptCancelled,
    ev.PermissionResolved: PermissionResolved,
    ev.ElicitationResolved: ElicitationResolved,
    ev.SessionClosed: SessionClosed,
    ev.SessionDied: SessionDied,
    ev.AgentAbandoned: AgentAbandoned,
    ev.ApprovalModeChanged: ApprovalModeChanged,
    ev.ModelSwitched: ModelSwitched,
    ev.ModelSwitchFailed: ModelSwitchFailed,
    ev.ReplayComplete: ReplayComplete,
    ev.StateResyncRequired: StateResyncRequired,
    ev.SlowClientWarning: SlowClientWarning,
    ev.ClientEvicted: ClientEvicted,
}


def iso(timestamp: float) -> str:
    """Epoch seconds as the peer writes times: ISO 8601, UTC, milliseconds, ``Z`` (the
    one formatter of every time a door writes). A time ``datetime`` cannot hold (a
    journal row written by something else, ``nan``) is shown as the nearer bound, never
    an error."""
    try:
        moment = datetime.datetime.fromtimestamp(timestamp, datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return "9999-12-31T23:59:59.999Z" if timestamp > 0 else "0001-01-01T00:00:00.000Z"
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def wire_data(event: Event) -> Any:
    """The event's ``data`` in wire shape: agents' payloads as they came, the bridge's
    typed payloads as their wire twins."""
    data = event.data
    twin = TWINS.get(type(data))
    if twin is not None:
        return twin(*msgspec.structs.astuple(data))
    kind = type(data)
    if kind is ev.PermissionRequest or kind is ev.ElicitationRequest:
        params = dict(data.params)
        params["requestId"] = data.request_id
        params["sessionId"] = data.session_id
        return params
    if kind is ev.ElicitationComplete:
        return {**data.params, "sessionId": data.session_id}
    return data


_encoder = msgspec.json.Encoder()
_envelope_decoder = msgspec.json.Decoder(EventEnvelope)


def encode_envelope(event: Event) -> bytes:
    """The envelope's format (``Event.encoded``'s key): encodes anew; ``envelope``
    keeps it."""
    return _encoder.encode(EventEnvelope(
        v=1, type=event.type, data=wire_data(event), id=event.id, promptId=event.prompt_id,
        originatorClientId=event.originator_client_id,
        meta=EventMeta(serverTimestamp=event.timestamp_ms)))


def envelope(event: Event) -> bytes:
    """The event's JSON envelope, built once per event."""
    return event.encoded(encode_envelope)


def decode_envelope(raw: bytes | msgspec.Raw) -> EventEnvelope:
    return _envelope_decoder.decode(raw)


class _RawEnvelope(msgspec.Struct, kw_only=True):
    id: int | None = None
    type: str
    promptId: str | None = None
    originatorClientId: str | None = None
    data: msgspec.Raw
    meta: EventMeta | None = msgspec.field(default=None, name="_meta")


class _Asked(msgspec.Struct):
    """The ids the wire adds to an agent's request params (other members: the agent's)."""

    requestId: str
    sessionId: str


class _Completed(msgspec.Struct):
    sessionId: str


_raw_envelope_decoder = msgspec.json.Decoder(_RawEnvelope)
_params_decoder = msgspec.json.Decoder(dict[str, Any])


def event_from_envelope(raw: bytes) -> Event:
    """The event an envelope records (see the module contracts). Raises
    ``msgspec.DecodeError`` / ``msgspec.ValidationError``, and nothing else, for a
    record it cannot read: one whose members have the wrong types (a request's
    ``data`` not an object, its ``requestId`` not a string) is one."""
    found = _raw_envelope_decoder.decode(raw)
    payload = ev.PAYLOADS.get(found.type)
    data: Any = found.data
    if payload is ev.PermissionRequest or payload is ev.ElicitationRequest:
        params = _params_decoder.decode(found.data)   # the agent's, plus requestId last
        asked = msgspec.convert(params, _Asked)
        del params["requestId"]
        data = payload(request_id=asked.requestId, session_id=asked.sessionId, params=params)
    elif payload is ev.ElicitationComplete:
        params = _params_decoder.decode(found.data)
        data = ev.ElicitationComplete(session_id=msgspec.convert(params, _Completed).sessionId,
                                      params=params)
    elif payload is not None:
        twin = msgspec.json.decode(found.data, type=TWINS[payload])
        data = payload(*msgspec.structs.astuple(twin))
    event = Event(found.id, found.type, data, prompt_id=found.promptId,
                  originator_client_id=found.originatorClientId,
                  timestamp_ms=found.meta.serverTimestamp if found.meta else None)
    event.size = len(raw)
    return event


# -- errors -------------------------------------------------------------------------------
def _session(exc: Any) -> dict[str, Any]:
    return {"sessionId": exc.session_id}


def _limit(exc: Any) -> dict[str, Any]:
    return {"limit": exc.limit}


def _session_limit(exc: Any) -> dict[str, Any]:
    details = {"limit": exc.limit, "scope": exc.scope}
    if exc.agent is not None:
        details["agent"] = exc.agent
    return details


def _permission_not_found(exc: Any) -> dict[str, Any]:
    details = {} if exc.session_id is None else {"sessionId": exc.session_id}
    return details | {"requestId": exc.request_id}


# The camelCase details of each error, looked up along its class's MRO (a subclass
# shows its parent's fields unless it has its own entry); none by default.
DETAILS: dict[type[errors.BridgeError], Callable[[Any], dict[str, Any]]] = {
    errors.SessionNotFoundError: _session,
    errors.SessionLimitExceededError: _session_limit,
    errors.PromptQueueFullError: lambda exc: {"sessionId": exc.session_id, "limit": exc.limit,
                                              "pendingCount": exc.pending_count},
    errors.BranchWhilePromptActiveError: _session,
    errors.WorkspaceMismatchError: lambda exc: {"boundWorkspace": exc.bound_workspace,
                                                "requestedWorkspace": exc.requested_workspace},
    errors.InvalidClientIdError: lambda exc: {"sessionId": exc.session_id,
                                              "clientId": exc.client_id},
    errors.SessionIdNotHonoredError: lambda exc: {"requestedSessionId": exc.requested,
                                                  "sessionId": exc.actual},
    errors.SubscriberLimitExceededError: _limit,
    errors.PermissionNotFoundError: _permission_not_found,
    errors.InvalidPermissionOptionError: lambda exc: {"requestId": exc.request_id,
                                                      "optionId": exc.option_id},
    errors.PromptNotFoundError: lambda exc: {"sessionId": exc.session_id,
                                             "promptId": exc.prompt_id},
    errors.AgentNotFoundError: lambda exc: {"agent": exc.name, "available": exc.available},
    errors.PromptDeadlineExceededError: lambda exc: {"deadlineMs": exc.deadline_ms},
    errors.SessionClosedError: lambda exc: {"sessionId": exc.session_id, "reason": exc.reason},
    errors.AgentError: lambda exc: {"data": exc.data},
    errors.AgentStartError: lambda exc: {"agent": exc.agent, "reason": exc.reason,
                                         "exitCode": exc.exit_code},
    errors.AgentUnavailableError: lambda exc: {"agent": exc.agent, "reason": exc.reason},
    errors.AgentDiedError: lambda exc: {"exitCode": exc.exit_code},
    errors.AgentTimeoutError: lambda exc: {"phase": exc.phase, "timeoutMs": exc.timeout_ms},
    errors.AgentProtocolError: lambda exc: {"agent": exc.agent},
    errors.TooManyContentBlocksError: _limit,
    errors.SessionNotRestorableError: _session,
}


def error_details(exc: BaseException) -> dict[str, Any]:
    """A bridge error's fields under the peer's names, in the peer's order."""
    for cls in type(exc).__mro__:
        render = DETAILS.get(cls)
        if render is not None:
            return render(exc)
    return {}


__all__ = ["DETAILS", "TWINS", "EventEnvelope", "EventMeta", "decode_envelope",
           "encode_envelope", "envelope", "error_details", "event_from_envelope", "wire_data"]


CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"   # an agent's: over the model's context


def agent_error_data(kind: str) -> dict[str, Any]:
    """The ``data`` of an in-process agent's JSON-RPC error that has a kind a client may
    switch on (``/acp`` passes it as it is: ``data.errorKind``, like the bridge's own)."""
    return {"errorKind": kind}


MAX_KIND = 128   # characters of an agent's errorKind kept in a cut data's marker
MAX_AGENT_MESSAGE, MAX_AGENT_DATA = errors.MAX_AGENT_MESSAGE, errors.MAX_AGENT_DATA


def agent_error(rpc_code: int, message: Any, data: Any = None) -> errors.AgentError:
    """An agent's JSON-RPC error, bounded (``bridge.errors.AgentError`` cuts it)."""
    return errors.AgentError(rpc_code, message, data)


def cut_agent_data(data: Any, size: int | None) -> dict[str, Any]:
    """What stands for an agent error's ``data`` too big to pass on (``size``: its
    JSON-encoded bytes, ``None`` when it does not encode): ``{"truncated": true,
    "bytes": size}``, with its ``errorKind`` (``agent_error_kind``) when it had one of
    at most ``MAX_KIND`` characters, so a client that switches on it still can."""
    marker: dict[str, Any] = {"truncated": True, "bytes": size}
    kind = agent_error_kind(data)
    if kind is not None and len(kind) <= MAX_KIND:
        marker = {"errorKind": kind, **marker}
    return marker


def agent_error_kind(data: Any) -> str | None:
    """The kind of an agent error's ``data`` (``agent_error_data``), if it has one."""
    kind = data.get("errorKind") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else None
