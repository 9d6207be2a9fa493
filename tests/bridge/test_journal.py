"""``RestoredSession.last_activity``: the newest time the journal knows of a session
(its newest event, prompt end or accepted prompt, else its creation), the
``updatedAt`` of a session restored at start until it is used again."""

from __future__ import annotations

from collections.abc import Sequence

from bridge.events import Event
from bridge.journal import PromptAccepted, RestoredSession, SessionOpened
from bridge.status import PromptTerminal

CREATED = 1_800_000_000.0


def _found(*, events: Sequence[Event] = (), terminals: Sequence[PromptTerminal] = (),
           unsettled: Sequence[PromptAccepted] = ()) -> RestoredSession:
    record = SessionOpened(session_id="s", agent="reference", cwd="/ws", created_at=CREATED,
                           epoch="e")
    return RestoredSession(record=record, events=list(events), last_event_id=len(events),
                           terminals=list(terminals), unsettled=list(unsettled), started=set())


def _event(event_id: int, at_ms: int) -> Event:
    return Event(event_id, "session_update", {}, timestamp_ms=at_ms)


def _accepted(at_ms: int) -> PromptAccepted:
    return PromptAccepted(session_id="s", prompt_id=f"p{at_ms}", prompt=[], queued_at_ms=at_ms,
                          seq=at_ms)


def test_a_session_never_used_was_last_active_when_made() -> None:
    assert _found().last_activity() == CREATED


def test_the_newest_of_its_events_prompt_ends_and_accepted_prompts() -> None:
    ms = int(CREATED * 1000)
    events = [_event(1, ms + 10), _event(2, ms + 20)]
    terminals = [PromptTerminal("p1", "failed", ms + 5), PromptTerminal("p2", "completed", ms + 30)]
    assert _found(events=events).last_activity() == (ms + 20) / 1000
    assert _found(events=events, terminals=terminals).last_activity() == (ms + 30) / 1000
    assert _found(events=events, terminals=terminals[:1]).last_activity() == (ms + 20) / 1000
    assert _found(events=events, unsettled=[_accepted(ms + 40)]).last_activity() \
        == (ms + 40) / 1000


def test_a_creation_after_its_activity_counts_as_its_last() -> None:
    """A clock set back between the records: never older than the session itself."""
    ms = int(CREATED * 1000)
    assert _found(events=[_event(1, ms - 1000)]).last_activity() == CREATED
