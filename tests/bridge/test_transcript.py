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
