"""``StoreSessionJournal.read_open`` (``acp_server.store.open_reads``): every open session
in a fixed number of statements gives, session by session, the status one read of that
session gives (``read(sid, only=QUESTIONS)``), on SQLite and on PostgreSQL: sessions
with nothing yet, settled, queued, running, with a question open or answered, a prompt
whose end is only in its events, closed ones (not listed) and excluded ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from acp_server.fleet.replica import QUESTIONS, SessionView
from acp_server.store.sessions import StoreSessionJournal
from bridge import events as ev
from bridge import wire
from bridge.events import Event
from bridge.journal import (EventRecord, PromptAccepted, PromptSettled, SessionEnded,
                            SessionOpened)
from tests.store.test_journal_isolation import _store

pytestmark = pytest.mark.anyio


class _Book:
    """Journal records for one session, its event ids counted."""

    def __init__(self, journal: StoreSessionJournal, sid: str, created_at: float) -> None:
        self.journal, self.sid, self.next_id = journal, sid, 1
        journal.append(SessionOpened(session_id=sid, agent="a", cwd="/w",
                                     created_at=created_at, epoch=f"e-{sid}"))

    def accept(self, pid: str, seq: int) -> None:
        self.journal.append(PromptAccepted(
            session_id=self.sid, prompt_id=pid, queued_at_ms=1000 + seq, seq=seq,
            prompt=[{"type": "text", "text": f"text of {pid}"}]))
        self.event(ev.PENDING_PROMPT_ADDED, ev.PendingPromptAdded(
            session_id=self.sid, prompt_id=pid, text=f"text of {pid}",
            queued_at=1000 + seq), pid)

    def event(self, kind: str, data: Any, pid: str | None = None) -> None:
        event = Event(self.next_id, kind, data, prompt_id=pid,
                      timestamp_ms=2000 + self.next_id)
        self.journal.append(EventRecord(session_id=self.sid, event_id=self.next_id,
                                        type=kind, prompt_id=pid,
                                        envelope=wire.envelope(event)))
        self.next_id += 1

    def started(self, pid: str) -> None:
        self.event(ev.PENDING_PROMPT_STARTED, ev.PendingPromptStarted(
            session_id=self.sid, prompt_id=pid, text=f"text of {pid}"), pid)

    def completed(self, pid: str, *, settle: bool = True) -> None:
        self.event(ev.TURN_COMPLETE, ev.TurnComplete(session_id=self.sid,
                                                     stop_reason="end_turn", prompt_id=pid),
                   pid)
        if settle:
            self.journal.append(PromptSettled(session_id=self.sid, prompt_id=pid,
                                              terminal="completed", at=3000 + self.next_id,
                                              stop_reason="end_turn"))

    def asked(self, request_id: str) -> None:
        self.event(ev.PERMISSION_REQUEST, ev.PermissionRequest(
            request_id=request_id, session_id=self.sid, params={"toolCall": {}}))

    def answered(self, request_id: str) -> None:
        self.event(ev.PERMISSION_RESOLVED, ev.PermissionResolved(
            request_id=request_id, session_id=self.sid, outcome={"outcome": "cancelled"}))


def _journal_of_every_kind(journal: StoreSessionJournal) -> None:
    _Book(journal, "empty", 1.0)
    settled = _Book(journal, "settled", 2.0)
    for n, pid in enumerate(("p1", "p2"), start=1):
        settled.accept(pid, n)
        settled.started(pid)
        settled.completed(pid)
    busy = _Book(journal, "busy", 3.0)
    busy.accept("done", 1)
    busy.started("done")
    busy.completed("done")
    busy.accept("running", 2)
    busy.accept("queued", 3)
    busy.started("running")
    busy.asked("q-open")
    busy.asked("q-answered")
    busy.answered("q-answered")
    refused = _Book(journal, "refused", 4.0)   # its terminal never written
    refused.accept("ended", 1)
    refused.started("ended")
    refused.completed("ended", settle=False)
    refused.accept("next", 2)
    closed = _Book(journal, "closed", 5.0)
    closed.accept("c", 1)
    journal.append(SessionEnded(session_id="closed", at=6.0))
    _Book(journal, "excluded", 6.0).accept("x", 1)


async def test_the_open_sessions_read_at_once_are_what_each_read_alone_is(
        tmp_path: Path, store_name: str) -> None:
    store, _ = _store(tmp_path, store_name)
    async with store:
        async with StoreSessionJournal(store) as journal:
            _journal_of_every_kind(journal)
            await journal.wait(journal.appended)
            found = await journal.read_open(QUESTIONS, {"excluded"})
            assert [f.record.session_id for f in found] == ["empty", "settled", "busy",
                                                            "refused"]
            for bulk in found:
                alone = await journal.read(bulk.record.session_id, only=QUESTIONS)
                assert alone is not None
                assert SessionView(bulk, 5).status() == SessionView(alone, 5).status()
                assert SessionView(bulk, 5).pending() == SessionView(alone, 5).pending()
            by_id = {f.record.session_id: SessionView(f, 5).status() for f in found}
            # what the statuses say, so the two reads cannot agree on nothing
            assert by_id["busy"].active_prompt_id == "running"
            assert (by_id["busy"].pending_prompts, by_id["busy"].queued_prompts) == (2, 1)
            assert by_id["busy"].pending_permissions == 1
            assert by_id["busy"].active_prompt_text == "text of running"
            assert by_id["refused"].active_prompt_id is None   # "ended" is settled
            assert by_id["refused"].pending_prompts == 1
            assert by_id["settled"].pending_prompts == 0
            assert by_id["settled"].last_event_id == 6
            assert by_id["empty"].last_event_id == 0
            everything = await journal.read_open(QUESTIONS)
            assert "excluded" in [f.record.session_id for f in everything]


def test_a_replica_counts_what_the_owner_counts_as_pending_permissions() -> None:
    """An open elicitation is not a pending permission on the owner
    (``PermissionMediator.count``): another instance's view of the session said
    ``isWaitingForPermission`` for it where the owner did not."""
    import types

    events = [
        Event(1, ev.PERMISSION_REQUEST, ev.PermissionRequest(
            request_id="p-open", session_id="s", params={"toolCall": {}})),
        Event(2, ev.ELICITATION_REQUEST, ev.ElicitationRequest(
            request_id="e-open", session_id="s", params={})),
        Event(3, ev.PERMISSION_REQUEST, ev.PermissionRequest(
            request_id="p-done", session_id="s", params={"toolCall": {}})),
        Event(4, ev.PERMISSION_RESOLVED, ev.PermissionResolved(
            request_id="p-done", session_id="s", outcome={"outcome": "cancelled"}))]
    view = SessionView(types.SimpleNamespace(events=events), 5)   # type: ignore[arg-type]
    assert view.open_permissions() == 1
    assert [a.request_id for a in view.asked()] == ["p-open"]
