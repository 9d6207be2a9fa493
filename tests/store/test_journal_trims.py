"""What one commit of the session journal trims (issue #23's review): the terminal trim
runs once, after every settle of the commit, never for a session refused by a stale
lease fence; a session ended and opened again in one commit counts its later events
towards the byte trim; ``append`` and ``_push`` shed and wake alike."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from acp_server.store import sessions
from acp_server.store.leases import SessionLeases
from acp_server.store.postgres import PostgresTaskStore
from acp_server.store.sessions import StoreSessionJournal
from acp_server.store.sqlite import SqliteTaskStore
from acp_server.store.writer import Op
from bridge.journal import (
    EventRecord,
    JournalRecord,
    PromptAccepted,
    PromptSettled,
    SessionEnded,
    SessionOpened,
)
from bridge.status import MAX_PROMPT_TERMINALS
from tests.bridge.helpers import wait_until
from tests.lmsp import stores
from tests.store.segment_rows import stored_events
from tests.store.test_journal_bytes import _event

pytestmark = pytest.mark.anyio


def _opened(sid: str) -> SessionOpened:
    return SessionOpened(session_id=sid, agent="a", cwd="/", created_at=1.0, epoch="e")


def _prompts(sid: str, first: int, count: int) -> list[JournalRecord]:
    """``count`` prompts of ``sid`` accepted and settled (ids ``first``...)."""
    records: list[JournalRecord] = []
    for n in range(first, first + count):
        records.append(PromptAccepted(session_id=sid, prompt_id=f"p{n}", prompt=[],
                                      queued_at_ms=n, seq=n))
        records.append(PromptSettled(session_id=sid, prompt_id=f"p{n}",
                                     terminal="completed", at=n))
    return records


@pytest.fixture
def pg_url(tmp_path: Path) -> str:
    return stores.postgres_url_or_skip(tmp_path, "trims")


@pytest.fixture
def db(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


def _terminals(db: psycopg.Connection[Any], sid: str) -> int:
    row = db.execute("SELECT count(*) FROM session_prompts WHERE session_id = %s "
                     "AND terminal IS NOT NULL", (sid,)).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_session_refused_by_its_fence_keeps_its_terminals(
        tmp_path: Path, pg_url: str, db: psycopg.Connection[Any]) -> None:
    """The commit carries a due terminal trim of a session another instance took over
    and another session's settle: the trim is a write across the fence, so it does
    not run (it ran with the settles of any session in the commit before)."""
    async with PostgresTaskStore(pg_url) as store, \
            StoreSessionJournal(store, leases=SessionLeases(store.instance,
                                                            ttl_s=60)) as journal:
        seq = 0
        for record in [_opened("moved"), _opened("kept"),
                       *_prompts("moved", 1, MAX_PROMPT_TERMINALS)]:
            seq = journal.append(record)
        await journal.wait(seq)   # 256 settles: trims as due, the count starts over
        for record in _prompts("moved", 1000, 50):
            seq = journal.append(record)
        await journal.wait(seq)   # 50 more: not due yet
        assert _terminals(db, "moved") == MAX_PROMPT_TERMINALS + 50
        db.execute("UPDATE session_leases SET instance = 'elsewhere', token = token + 1 "
                   "WHERE session_id = 'moved'")   # another instance adopted it
        more = _prompts("moved", 2000, sessions.TRIM_TERMINALS_EVERY)   # due now
        for record in [*more, *_prompts("kept", 1, 1)]:   # one commit
            seq = journal.append(record)
        await journal.wait(seq)   # the last: a settle of "kept", committed
        assert journal.fence["moved"] == sessions.LOST
    assert _terminals(db, "moved") == MAX_PROMPT_TERMINALS + 50   # untouched here
    assert _terminals(db, "kept") == 1


async def test_the_terminal_trim_runs_after_every_settle_of_the_commit(
        tmp_path: Path) -> None:
    """A commit split by a session record (its settles go in two statements): the
    trim keeps the newest ``MAX_PROMPT_TERMINALS``, counted after the last settle."""
    async with SqliteTaskStore(str(tmp_path / "store.db")) as store, \
            StoreSessionJournal(store) as journal:
        seq = 0
        for record in [_opened("s"), *_prompts("s", 1, MAX_PROMPT_TERMINALS)]:
            seq = journal.append(record)
        await journal.wait(seq)
        first = _prompts("s", 1000, 40)
        second = _prompts("s", 2000, sessions.TRIM_TERMINALS_EVERY - 40)
        for record in [*first, _opened("other"), *second]:   # one commit, split
            seq = journal.append(record)
        await journal.wait(seq)
        rows = await store._read(lambda conn: conn.execute(
            "SELECT prompt_id FROM session_prompts WHERE session_id = 's' "
            "AND terminal IS NOT NULL").fetchall())
    kept = {row[0] for row in rows}
    assert len(kept) == MAX_PROMPT_TERMINALS
    assert {f"p{n}" for n in range(2000, 2000 + sessions.TRIM_TERMINALS_EVERY - 40)} <= kept


async def test_a_session_opened_again_in_the_same_commit_counts_its_later_events(
        tmp_path: Path) -> None:
    async with SqliteTaskStore(str(tmp_path / "store.db")) as store, \
            StoreSessionJournal(store, max_session_bytes=8192) as journal:
        journal._unsized["s"] = 1500   # counted before it ended: not carried over
        early, late = _event("s", 1, 100), _event("s", 2, 1000)
        plan = journal._planned([(1, early), (2, SessionEnded(session_id="s", at=1.0)),
                                 (3, _opened("s")), (4, late)])
        assert plan.unsized == {"s": len(late.envelope)}
        assert plan.untrimmed == {"s": None}
        big = _event("s", 3, 3000)   # past a quarter of the bound on its own: trimmed
        plan = journal._planned([(1, SessionEnded(session_id="s", at=1.0)),
                                 (2, _opened("s")), (3, big)])
        assert plan.byte_trims == {"s"} and plan.unsized == {"s": None}
        plan = journal._planned([(1, SessionEnded(session_id="s", at=1.0)), (2, big)])
        assert plan.byte_trims == set() and plan.unsized == {"s": None}   # ended


@contextlib.asynccontextmanager
async def _behind_a_held_commit(tmp_path: Path, **options: Any) -> AsyncIterator[
        tuple[StoreSessionJournal, list[EventRecord], Callable[[], None]]]:
    """A journal whose store's writer is busy (an ``Op`` that waits) until the block ends
    or ``release()``: its commits wait. ``shed``: what it lets through to readers."""
    gate, started = threading.Event(), threading.Event()

    def held(conn: Any, out: Any, *state: Any) -> None:
        started.set()
        gate.wait(10)

    shed: list[EventRecord] = []
    async with SqliteTaskStore(str(tmp_path / "store.db")) as store, \
            StoreSessionJournal(store, **options) as journal:
        journal.bind(lambda records: shed.extend(records))
        assert store.submit(Op(held))
        try:
            await wait_until(started.is_set)   # the writer is busy: commits wait
            yield journal, shed, gate.set
        finally:
            gate.set()


@pytest.mark.parametrize("write_behind", [0, 4])
async def test_append_and_push_shed_and_wake_alike(tmp_path: Path, write_behind: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``append`` with and without a write-behind window (both through ``_push``):
    both shed the oldest events past ``MAX_PENDING`` to readers and wake a backing-off
    flusher for a record somebody waits for: 21 records pile up past ``MAX_PENDING``
    (20) behind a commit that waits, then a record somebody waits for comes while it
    backs off."""
    monkeypatch.setattr(sessions, "MAX_PENDING", 20)
    async with _behind_a_held_commit(tmp_path, write_behind=write_behind) as (
            journal, shed, _):
        journal.append(_opened("s"))
        await wait_until(lambda: journal._inflight is not None)
        appended = [_event("s", n, 10) for n in range(1, 22)]
        for record in appended:
            journal.append(record)
        # the first half of the records waiting went (the session's record and, with a
        # window, the marker opening it stay queued): readers got each of the oldest
        # events once, before any commit (the window's first ones early, the rest shed)
        first = 9 if not write_behind else 8
        assert [r.event_id for r in shed] == [r.event_id for r in appended[:first]]
        assert len(journal._pending) <= sessions.MAX_PENDING
        assert not journal._wake.is_set()
        journal._failing = True   # as if backing off after a failed commit
        journal.append(_opened("t"))
        assert journal._wake.is_set()   # the flusher ends its backoff and commits


async def test_events_waiting_for_the_store_are_bounded_in_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large events pile up behind a commit that does not land: past
    ``MAX_PENDING_BYTES`` of envelopes the oldest go to readers unjournaled until half
    of it is left, long before ``MAX_PENDING`` records (a stdio agent's updates may be
    megabytes each: 200,000 of them were all kept)."""
    size = len(_event("s", 1, 1000).envelope)
    monkeypatch.setattr(sessions, "MAX_PENDING_BYTES", 10 * size + 50, raising=False)
    async with _behind_a_held_commit(tmp_path) as (journal, shed, release):
        journal.append(_opened("s"))
        await wait_until(lambda: journal._inflight is not None)
        for n in range(1, 11):
            journal.append(_event("s", n, 1000))
        assert shed == []                             # at the bound: all kept
        journal.append(_event("s", 11, 1000))         # past it: down to half
        assert [r.event_id for r in shed] == [1, 2, 3, 4, 5, 6]
        for n in range(12, 200):
            journal.append(_event("s", n, 1000))
        waiting = [r for _, r in journal._pending if isinstance(r, EventRecord)]
        assert len(waiting) <= 15 and waiting[-1].event_id == 199
        assert [r.event_id for r in shed] + [r.event_id for r in waiting] \
            == list(range(1, 200))                    # each once, in order
        release()
        await journal.wait(journal.appended)
        assert journal._reepoch == set()   # the shed session got its new epoch, committed


async def test_statement_texts_are_kept_for_small_and_full_row_counts(tmp_path: Path) -> None:
    """Every row count up to ``ROWS_PER_STATEMENT`` once held up to 1,500 texts (~5.8 MB
    a journal on PostgreSQL): only the small counts, the padded ones (SQLite: a
    multiple of ``PAD_ROWS``) and the full statement stay; the padding rows change
    nothing (each row once)."""
    from acp_server.store import session_writes as sw

    async with SqliteTaskStore(str(tmp_path / "store.db")) as store, \
            StoreSessionJournal(store) as journal:
        written = 0
        for turn, count in enumerate((3, sw.CACHED_ROWS + 1, 300, sw.ROWS_PER_STATEMENT + 7)):
            for n in range(count):   # a commit each, a segment row of each of ``count``
                journal.append(_event(f"s{n}", turn + 1, 5))   # sessions
            written += count
            await journal.wait(journal.appended)
        rows = await store._read(lambda conn: len(stored_events(conn.execute)))
    assert rows == written
    counts = {rows for (sql, rows) in journal._statements if sql == sw.SEGMENT_INSERT[0]}
    assert counts and all(n <= sw.CACHED_ROWS or n == sw.ROWS_PER_STATEMENT
                          or n % sw.PAD_ROWS == 0 for n in counts)
    assert sw.ROWS_PER_STATEMENT in counts
    assert {96, 320} <= counts   # 65 and 300 rows, padded
