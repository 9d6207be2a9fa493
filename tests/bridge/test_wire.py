"""``bridge.wire``: every typed payload has its camelCase twin, events are encoded once,
agent bytes pass through, and the per-format cache is generic."""

from __future__ import annotations

import inspect
import re

import msgspec
import pytest

from bridge import events as ev
from bridge import wire
from bridge.bus import EventBus
from bridge.errors import AgentError
from bridge.events import Event
from bridge.turn import prompt_result


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def test_every_payload_has_its_wire_twin_field_for_field() -> None:
    payloads = {cls for _, cls in inspect.getmembers(ev, inspect.isclass)
                if issubclass(cls, ev.Payload) and cls is not ev.Payload}
    assert payloads - set(wire.TWINS) == {   # an agent's params plus ids: rendered by hand
        ev.PermissionRequest, ev.ElicitationRequest, ev.ElicitationComplete}
    for payload, twin in wire.TWINS.items():
        assert twin.__struct_fields__ == tuple(_camel(f) for f in payload.__struct_fields__), \
            payload.__name__
        assert all(re.fullmatch(r"[a-z]+(_[a-z]+)*", f) for f in payload.__struct_fields__)


def test_typed_payloads_render_camel_case_without_nones() -> None:
    event = Event(3, ev.SESSION_CLOSED, ev.SessionClosed(session_id="s", reason="client_close"),
                  timestamp_ms=1700000000000)
    assert msgspec.json.decode(wire.envelope(event)) == {
        "id": 3, "v": 1, "type": "session_closed",
        "data": {"sessionId": "s", "reason": "client_close"},
        "_meta": {"serverTimestamp": 1700000000000}}


def test_a_permission_request_is_the_agents_params_plus_the_ids() -> None:
    params = {"sessionId": "s", "toolCall": {"toolCallId": "t"}, "options": []}
    event = Event(1, ev.PERMISSION_REQUEST, ev.PermissionRequest(
        request_id="r", session_id="s", params=params))
    assert wire.wire_data(event) == {**params, "requestId": "r"}
    assert list(wire.wire_data(event)) == ["sessionId", "toolCall", "options", "requestId"]


def test_agent_bytes_pass_through_and_each_format_is_built_once() -> None:
    raw = msgspec.Raw(b'{"sessionId":"s","update":{"sessionUpdate":"x","odd":[1,  2]}}')
    bus = EventBus()
    event = bus.publish(ev.SESSION_UPDATE, raw)
    assert event is not None
    body = wire.envelope(event)
    assert bytes(raw) in body                       # byte for byte, spaces kept
    assert event.size == len(body)
    assert wire.envelope(event) is body             # built at publish, kept
    calls = []

    def shout(e: Event) -> bytes:
        calls.append(e.id)
        return b"!"

    assert event.encoded(shout) == b"!" and event.encoded(shout) == b"!"
    assert calls == [1]                              # any format, built once per event


def test_decode_envelope_reads_what_envelope_wrote() -> None:
    event = Event(None, ev.REPLAY_COMPLETE, ev.ReplayComplete(
        last_replayed_event_id=4, last_event_id=4, replayed_count=2))
    decoded = wire.decode_envelope(wire.envelope(event))
    assert decoded.id is None and decoded.type == "replay_complete"
    assert decoded.data == {"lastReplayedEventId": 4, "lastEventId": 4, "replayedCount": 2}


def test_an_envelope_is_a_complete_record_of_its_event() -> None:
    """What a session journal can store: every event comes back from its envelope,
    to the same bytes."""
    samples: list[Event] = [
        Event(1, ev.SESSION_UPDATE, msgspec.Raw(b'{"sessionId":"s","update":{"x": 1}}'),
              prompt_id="p"),
        Event(2, ev.SESSION_UPDATE, {"sessionId": "s", "update": {"sessionUpdate": "y"}}),
        Event(3, ev.PERMISSION_REQUEST, ev.PermissionRequest(
            request_id="r", session_id="s", params={"sessionId": "s", "options": []}),
            prompt_id="p", originator_client_id="c"),
        Event(6, ev.ELICITATION_REQUEST, ev.ElicitationRequest(
            request_id="e", session_id="s", params={"sessionId": "s", "message": "name?"})),
        Event(7, ev.ELICITATION_COMPLETE, ev.ElicitationComplete(
            session_id="s", params={"elicitationId": "u-1"})),
        Event(8, ev.ELICITATION_RESOLVED, ev.ElicitationResolved(
            request_id="e", session_id="s", action="accept")),
        Event(4, ev.PERMISSION_RESOLVED, ev.PermissionResolved(
            request_id="r", session_id="s", outcome={"outcome": "cancelled"}, reason="timeout")),
        Event(5, ev.TURN_ERROR, ev.TurnError(session_id="s", message="m", code="-32603",
                                             prompt_id="p"), prompt_id="p"),
        Event(None, ev.CLIENT_EVICTED, ev.ClientEvicted(
            reason="queue_overflow", dropped_after=4, queue_size=256, max_queued=256,
            queued_bytes=9, max_queued_bytes=10)),
    ]
    for event in samples:
        body = wire.envelope(event)
        again = wire.event_from_envelope(body)
        assert (again.id, again.type, again.prompt_id, again.originator_client_id,
                again.timestamp_ms) == (event.id, event.type, event.prompt_id,
                                        event.originator_client_id, event.timestamp_ms)
        assert wire.envelope(again) == body and again.size == len(body)
        if type(event.data) in wire.TWINS:
            assert again.data == event.data
        elif isinstance(event.data, ev.Payload):   # an agent's params: the ids stay in them
            assert again.data.session_id == event.data.session_id
    raw = wire.event_from_envelope(wire.envelope(samples[0])).data
    assert isinstance(raw, msgspec.Raw) and bytes(raw) == bytes(samples[0].data)


def test_iso_writes_every_time_and_never_raises() -> None:
    """The one time formatter of the doors: ISO 8601 UTC with milliseconds; a time that
    ``datetime`` cannot hold is the nearer bound, never an error (a 500 on a listing)."""
    from bridge.wire import iso

    assert iso(0) == "1970-01-01T00:00:00.000Z"
    assert iso(1796354347.1234) == "2026-12-04T03:19:07.123Z"
    assert iso(1e300) == iso(float("inf")) == "9999-12-31T23:59:59.999Z"
    assert iso(-1e300) == iso(float("-inf")) == iso(float("nan")) == "0001-01-01T00:00:00.000Z"


def test_a_request_of_the_wrong_shape_is_a_validation_error() -> None:
    """A journal reads envelopes back: one whose request payload has the wrong types is
    ``msgspec.ValidationError`` (skipped and logged there), never another error and
    never an event restore would trip on."""
    import pytest

    for kind in ("permission_request", "elicitation_request", "elicitation_complete"):
        for data in ('"x"', "null", "[1]", '{"sessionId":5,"requestId":[1]}',
                     '{"requestId":"r"}', '{"sessionId":"s","requestId":{"a":1}}'):
            if kind == "elicitation_complete" and data.startswith('{"sessionId":"s"'):
                continue   # no requestId in a completion: well-formed
            raw = (f'{{"id":2,"v":1,"type":"{kind}","data":{data},'
                   f'"_meta":{{"serverTimestamp":1}}}}').encode()
            with pytest.raises(msgspec.ValidationError):
                wire.event_from_envelope(raw)
    with pytest.raises(msgspec.ValidationError):
        wire.event_from_envelope(b'{"id":2,"v":1,"type":"turn_complete","data":"x"}')


def test_agent_error_bounds_what_an_agent_sent() -> None:
    """``agent_error``: the message cut, a ``data`` over the cap replaced by the marker
    (its ``errorKind`` kept; ``bytes`` ``None`` for a value that does not encode), a
    small one kept, and bounding twice changes nothing."""
    small = {"errorKind": "k", "blob": "x" * 100}
    error = wire.agent_error(-32000, "m" * 5000, small)
    assert (error.rpc_code, error.message, error.data) == \
        (-32000, "m" * wire.MAX_AGENT_MESSAGE, small)
    big = {"errorKind": "k", "blob": "x" * wire.MAX_AGENT_DATA}
    size = len(msgspec.json.encode(big))
    cut = wire.agent_error(1, "no", big)
    assert cut.data == {"errorKind": "k", "truncated": True, "bytes": size}
    assert wire.agent_error(1, cut.message, cut.data).data == cut.data
    assert wire.agent_error(1, "no", object()).data == {"truncated": True, "bytes": None}
    assert wire.agent_error(1, "no").data is None


def test_a_turn_that_quotes_its_agent_is_bounded() -> None:
    """A ``session/prompt`` answer of the wrong shape fails the turn with a message
    that quotes it, cut (``bridge.turn.prompt_result``)."""
    with pytest.raises(AgentError) as caught:
        prompt_result(["x" * 100_000])
    assert len(caught.value.message) == wire.MAX_AGENT_MESSAGE
    assert caught.value.message.startswith("Invalid session/prompt response: ['xxx")
