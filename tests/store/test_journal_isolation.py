"""The session journal's isolation of the records the store refuses, on the journal
itself over a real SQLite or PostgreSQL store with a real trigger
(``acp_server.store.session_refusals``): among many records of one commit only the
refused ones fail, in one isolating commit; a refused session record fails its waiter;
an isolating commit that fails too refuses its records once (no loop); events shed
while the store did not commit give their session a new epoch."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from acp_server.store import sessions
from acp_server.store.postgres import PostgresTaskStore
from acp_server.store.sessions import StoreSessionJournal
from acp_server.store.sqlite import SqliteTaskStore
from acp_server.store.writer import Op
from bridge.errors import JournalUnavailableError
from bridge.journal import EventRecord, PromptAccepted, SessionOpened
from tests.bridge.helpers import wait_until
from tests.lmsp import stores
from tests.store.segment_rows import stored_events
from tests.store.test_journal_bytes import _event
from tests.store.test_journal_refusals import MARK, REASON, _run_sql, poison, stored_epoch

pytestmark = pytest.mark.anyio


def _store(tmp_path: Path, store_name: str) -> tuple[Any, str | None]:
    if store_name == "postgres":
        url = stores.postgres_url_for(tmp_path, "journal")
        return PostgresTaskStore(url, lease_s=stores.TEST_LEASE_S, renew_s=stores.TEST_RENEW_S,
                                 poll_s=stores.TEST_POLL_S), url
    (tmp_path / "state").mkdir(exist_ok=True)
    return SqliteTaskStore(str(tmp_path / "state" / "lmsp.sqlite3")), None


def _opened(sid: str, agent: str = "a") -> SessionOpened:
    return SessionOpened(session_id=sid, agent=agent, cwd="/", created_at=1.0, epoch="e")


def _marked(sid: str, n: int) -> EventRecord:
    return EventRecord(session_id=sid, event_id=n, type="session_update", prompt_id="p",
                       envelope=b'{"text": "' + MARK.encode() + b'"}')


async def test_only_the_refused_records_fail_among_many(
        tmp_path: Path, store_name: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="acp_server.store.sessions")
    store, url = _store(tmp_path, store_name)
    bad = {50, 120, 121}
    released: list[EventRecord] = []
    async with store:
        poison(tmp_path, store_name, url, "session_segments", "events")
        async with StoreSessionJournal(store) as journal:
            journal.bind(released.extend)
            journal.append(_opened("a"))
            journal.append(_opened("b"))
            for n in range(1, 201):   # appended at once: one commit takes them all
                journal.append(_marked("a", n) if n in bad else _event("a", n, 10))
                journal.append(_event("b", n, 10))
            prompt = journal.append(PromptAccepted(session_id="b", prompt_id="p1", prompt=[],
                                                   queued_at_ms=1, seq=1))
            await journal.wait(prompt)   # committed: it was not refused
            assert journal.refusals.by_kind == {"event": 3}
            assert journal.commits == 1   # the isolating one (the failed one counts not)
            assert {(r.session_id, r.event_id) for r in released} >= {("a", 200), ("b", 200)}
    rows = stored_events(lambda s, p=(): _run_sql(tmp_path, store_name, url, s, p))
    assert [tuple(r[:2]) for r in rows] == [("a", n) for n in range(1, 201) if n not in bad] + [
        ("b", n) for n in range(1, 201)]
    assert _run_sql(tmp_path, store_name, url, "SELECT prompt_id FROM session_prompts") == [
        ("p1",)]
    assert stored_epoch(tmp_path, store_name, url, "a") != "e"
    assert stored_epoch(tmp_path, store_name, url, "b") == "e"
    messages = [r.getMessage() for r in caplog.records]
    assert sum("a commit failed" in m for m in messages) == 1
    assert sorted(int(m.split("the event ")[1].split(" ")[0]) for m in messages
                  if "the store refused the event" in m) == sorted(bad)


async def test_a_refused_session_record_fails_its_waiter(tmp_path: Path,
                                                         store_name: str) -> None:
    store, url = _store(tmp_path, store_name)
    async with store:
        poison(tmp_path, store_name, url, "sessions", "record")
        async with StoreSessionJournal(store) as journal:
            refused = journal.append(_opened("x", agent=MARK))
            kept = journal.append(_opened("y"))
            with pytest.raises(JournalUnavailableError, match=REASON):
                await journal.wait(refused)
            await journal.wait(kept)
            assert journal.refusals.by_kind == {"session": 1}
            assert journal.refusals.last is not None
            assert journal.refusals.last["sessionId"] == "x"
    assert _run_sql(tmp_path, store_name, url, "SELECT id FROM sessions") == [("y",)]


async def test_an_isolating_commit_that_fails_too_refuses_its_records_once(
        tmp_path: Path, store_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug outside the records (here: planning the commit raises) fails the isolating
    commit too: its records are refused once, the journal does not loop, and the
    session whose events were let through gets a new epoch in the next commit."""
    store, url = _store(tmp_path, store_name)
    released: list[EventRecord] = []
    async with store, StoreSessionJournal(store) as journal:
        journal.bind(released.extend)
        await journal.wait(journal.append(_opened("s")))
        planned = journal._planned
        tries = []

        def broken(batch: Any) -> Any:
            tries.append(len(batch))
            raise RuntimeError("a bug")

        monkeypatch.setattr(journal, "_planned", broken)
        event = journal.append(_event("s", 1, 10))
        opened = journal.append(_opened("t"))
        with pytest.raises(JournalUnavailableError, match="a bug"):
            await journal.wait(opened)
        await journal.wait(event)   # settled (refused), nobody left waiting
        assert tries == [2, 2]   # the commit, then its isolation: no more
        assert [r.event_id for r in released] == [1]   # the reader got it
        assert journal.refusals.by_kind == {"event": 1, "session": 1}
        monkeypatch.setattr(journal, "_planned", planned)
        await journal.wait(journal.append(_event("s", 2, 10)))
    assert stored_epoch(tmp_path, store_name, url, "s") != "e"


async def test_events_shed_give_their_session_a_new_epoch(
        tmp_path: Path, store_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store did not commit for too long: the oldest events went to readers
    unjournaled (``_shed``). Here they are the session's last ones, so the restore finds
    no id gap: the stored epoch changed in the next commit."""
    monkeypatch.setattr(sessions, "MAX_PENDING", 20)
    store, url = _store(tmp_path, store_name)
    gate, started = threading.Event(), threading.Event()

    def held(conn: Any, out: Any, *state: Any) -> None:
        started.set()
        gate.wait(10)

    async with store, StoreSessionJournal(store) as journal:
        await journal.wait(journal.append(_opened("s")))
        assert store.submit(Op(held))
        try:
            await wait_until(started.is_set)   # the writer is busy
            journal.append(_opened("t"))
            for n in range(1, 22):
                journal.append(_event("t" if n > 10 else "s", n, 10))
        finally:
            gate.set()
        await journal.wait(journal.appended)
    assert stored_epoch(tmp_path, store_name, url, "s") != "e"   # its events were shed
    assert stored_epoch(tmp_path, store_name, url, "t") == "e"   # its record stayed queued

