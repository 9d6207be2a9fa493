"""``bridge.transcript``: the conversation a restored agent is seeded with."""

from __future__ import annotations

import msgspec

from bridge import events as ev
from bridge.events import Event
from bridge.transcript import TRANSCRIPT_META, seeded, transcript


def _chunk(n: int, kind: str, text: str, prompt_id: str | None, *, raw: bool = False) -> Event:
    data = {"sessionId": "s", "update": {"sessionUpdate": kind,
                                         "content": {"type": "text", "text": text}}}
    return Event(n, ev.SESSION_UPDATE, msgspec.Raw(msgspec.json.encode(data)) if raw else data,
                 prompt_id=prompt_id)


def test_messages_by_role_and_prompt_in_order() -> None:
    events = [
        _chunk(1, "agent_message_chunk", "replayed", None),       # an agent's load replay
        _chunk(2, "agent_message_chunk", " twice", None),
        _chunk(3, "user_message_chunk", "line one", "p1"),
        _chunk(4, "user_message_chunk", "line two", "p1", raw=True),
        Event(5, ev.TURN_COMPLETE, {"stopReason": "end_turn"}, prompt_id="p1"),
        _chunk(6, "agent_message_chunk", "Echo: ", "p1"),
        _chunk(7, "agent_message_chunk", "one", "p1", raw=True),
        _chunk(8, "agent_thought_chunk", "hidden", "p1"),
        _chunk(9, "user_message_chunk", "again", "p2"),            # re-run after a restart
        _chunk(10, "agent_message_chunk", "half", "p2"),
    ]
    assert transcript(events, skip={"p2"}) == [
        {"role": "agent", "text": "replayed"}, {"role": "agent", "text": " twice"},
        {"role": "user", "text": "line one\nline two"},
        {"role": "agent", "text": "Echo: one"}]


def test_bounded_to_the_newest_messages() -> None:
    events = [_chunk(n, "user_message_chunk", "x" * 10, f"p{n}") for n in range(1, 6)]
    assert transcript(events, max_bytes=25) == [{"role": "user", "text": "x" * 10}] * 2


def test_an_agent_reads_only_well_formed_entries() -> None:
    meta = {TRANSCRIPT_META: [{"role": "user", "text": "hi"}, {"role": "system", "text": "x"},
                              {"role": "agent", "text": 3}, "junk", {"role": "agent",
                                                                      "text": "hello"}]}
    assert seeded(meta) == [("user", "hi"), ("agent", "hello")]
    assert seeded({TRANSCRIPT_META: "junk"}) == seeded(None) == []


def test_a_prompt_over_the_models_context_is_left_out() -> None:
    """The model agent keeps no prompt its model refused as over the context: a
    restored agent must not get it back either (its next turn would fail the same
    way). Another failed turn's prompt stays."""
    failed = {"sessionId": "s", "message": "over", "code": "-32603", "promptId": "p1",
              "errorKind": "context_length_exceeded"}
    events = [
        _chunk(1, "user_message_chunk", "x" * 100, "p1"),
        Event(2, ev.TURN_ERROR, failed, prompt_id="p1"),
        _chunk(3, "user_message_chunk", "short", "p2"),
        _chunk(4, "agent_message_chunk", "ok", "p2"),
        _chunk(5, "user_message_chunk", "boom", "p3"),
        Event(6, ev.TURN_ERROR, ev.TurnError(session_id="s", message="500", code="-32603",
                                             prompt_id="p3"), prompt_id="p3"),
        _chunk(7, "user_message_chunk", "too", "p4"),
        Event(8, ev.TURN_ERROR, ev.TurnError(session_id="s", message="over", code="-32603",
                                             prompt_id="p4",
                                             error_kind="context_length_exceeded"),
              prompt_id="p4"),
    ]
    assert transcript(events) == [{"role": "user", "text": "short"},
                                  {"role": "agent", "text": "ok"},
                                  {"role": "user", "text": "boom"}]
