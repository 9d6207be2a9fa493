"""Review of segment rows (``acp_server.store.segments``): what the conversion from one
row an event must keep, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from acp_server.fleet.replica import QUESTIONS, SessionView
from acp_server.store.sessions import StoreSessionJournal
from bridge.journal import EventRecord
from tests.store.test_journal_isolation import _store
from tests.store.test_open_reads import _Book

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("pid", ["a\\b", "a\\", "a\\%", "a_b", "a,b"])
async def test_a_prompt_id_with_like_s_characters_is_found_in_the_segments(
        tmp_path: Path, store_name: str, pid: str) -> None:
    """/acp's prompt ids are any 1 to 128 characters: a backslash is LIKE's escape on
    PostgreSQL, so a filter ``prompts LIKE '%,' || prompt_id || ',%'`` missed the events
    of ``a\\b`` (the listing then said its ended turn was still running)."""
    store, _ = _store(tmp_path, store_name)
    async with store:
        async with StoreSessionJournal(store) as journal:
            book = _Book(journal, "s", 1.0)
            book.accept(pid, 1)
            book.started(pid)
            book.completed(pid, settle=False)   # its end only in its events
            await journal.wait(journal.appended)   # its events a segment of their own
            book.accept("next", 2)
            book.started("next")
            await journal.wait(journal.appended)
            [bulk] = await journal.read_open(QUESTIONS)
            alone = await journal.read("s", only=QUESTIONS)
            assert alone is not None
            assert SessionView(alone, 5).status().active_prompt_id == "next"
            assert SessionView(bulk, 5).status() == SessionView(alone, 5).status()
            assert [p.prompt_id for p in bulk.unsettled] == ["next"]


async def test_a_page_by_cursor_never_holds_a_hole_made_between_its_statements(
        tmp_path: Path) -> None:
    """A reader by cursor (the fleet's replica, ``read_after``) reads a page of segments
    in several statements (doubling), each its own snapshot: a trim landing between two
    of them (the owner's ring or byte trim past a lagging reader) deleted segments past
    the page's first ones, and the page went on after the hole, the events in between
    silently missing (the replica checks only a page's first id). The page stops at
    such a hole: the next read starts past it, and its reader resumes (ring_evicted)."""
    import sqlite3

    from acp_server.store.session_reads import read_segments_after
    from tests.store.test_journal_bytes import _event
    from tests.store.test_journal_trims import _opened

    store, _ = _store(tmp_path, "sqlite")
    async with store, StoreSessionJournal(store) as journal:
        journal.append(_opened("s"))
        for first in range(1, 61, 3):   # a commit each: 20 segments of 3 events
            for n in range(first, first + 3):
                journal.append(_event("s", n, 10))
            await journal.wait(journal.appended)
    conn = sqlite3.connect(str(tmp_path / "state" / "lmsp.sqlite3"), isolation_level=None)

    class Racing:   # the owner's trim commits between the page's first two statements
        reads = 0

        def execute(self, text: str, params: tuple[object, ...] = ()) -> sqlite3.Cursor:
            if text.startswith("SELECT last_id, first_id, events FROM session_segments"):
                self.reads += 1
                if self.reads == 2:
                    conn.execute("DELETE FROM session_segments WHERE session_id = 's' "
                                 "AND last_id > 0 AND last_id <= 30")
            return conn.execute(text, params)

    try:
        rows = read_segments_after(Racing(), lambda text: text, "s", 0, 512)
        ids = [i for i, _ in rows]
        assert ids == list(range(1, len(ids) + 1)), ids   # no hole inside the page
        rest = read_segments_after(conn, lambda text: text, "s", ids[-1], 512)
        assert rest[0][0] == 31   # the next page starts past the hole: its reader resumes
    finally:
        conn.close()


async def test_sqlite_pads_a_segment_insert_with_its_smallest_row(tmp_path: Path) -> None:
    """SQLite's INSERT of more than ``CACHED_ROWS`` rows is padded (a row again, a no-op
    under ``ON CONFLICT DO NOTHING``) to a statement prepared before. A segment row
    holds up to ``SEGMENT_EVENTS`` envelopes, and the last row was the one repeated: a
    commit of 65 sessions whose last had a large segment bound it 31 times more
    (measured: 3 s instead of 0.26 s for a 25.6 MB one). The smallest row pads."""
    from acp_server.store.segments import SEGMENT_INSERT, segment_values

    store, _ = _store(tmp_path, "sqlite")
    async with store, StoreSessionJournal(store) as journal:
        values: list[object] = []
        for n in range(64):
            values += segment_values(f"s{n}", [(1, "t", None, b"x" * 10)])
        values += segment_values("big", [(n, "t", None, b"y" * 1000) for n in range(1, 257)])
        bound: list[tuple[object, ...]] = []

        class Spy:
            def execute(self, text: str, params: tuple[object, ...] = ()) -> None:
                bound.append(tuple(params))

        journal._insert_rows(Spy(), SEGMENT_INSERT, values)
        [params] = bound
        assert len(params) % SEGMENT_INSERT[1] == 0 and len(params) > len(values)   # padded
        padding = params[len(values):]
        assert sum(len(v) for v in padding if isinstance(v, bytes)) \
            == (len(padding) // SEGMENT_INSERT[1]) * len(values[6])   # a 10-byte segment's


async def test_migration_8_takes_event_rows_whose_text_is_not_utf8(tmp_path: Path) -> None:
    """SQLite: an event row's ``type`` or ``prompt_id`` that is TEXT and not UTF-8 (a row
    overwritten by hand) was read by the migration as Python's sqlite3 fetches TEXT,
    which raised mid-fetch: the migration rolled back and the store could never be
    opened again, where the version before read such rows as U+FFFD and started
    (``session_reads._tolerant_text``). The row is migrated, its text replaced."""
    from tests.store.test_journal_bytes import _event
    from tests.store.test_journal_refusals import _run_sql
    from tests.store.test_journal_trims import _opened
    from tests.store.test_segments_migration import _rewind

    store, _ = _store(tmp_path, "sqlite")
    async with store, StoreSessionJournal(store) as journal:
        journal.append(_opened("s"))
        for n in range(1, 6):
            journal.append(_event("s", n, 10))
        await journal.wait(journal.appended)
    _rewind(tmp_path, "sqlite", None)
    _run_sql(tmp_path, "sqlite", None, "UPDATE session_events SET prompt_id = "
             "CAST(x'c1ff' AS TEXT) WHERE session_id = 's' AND id = 2")
    _run_sql(tmp_path, "sqlite", None, "UPDATE session_events SET type = "
             "CAST(x'c1ff' AS TEXT) WHERE session_id = 's' AND id = 3")
    store, _ = _store(tmp_path, "sqlite")
    async with store, StoreSessionJournal(store) as journal:   # migrated as it opens
        [found] = await journal.restore()
        assert [e.id for e in found.events] == [1, 2, 3, 4, 5] and not found.gap


async def test_a_page_by_cursor_is_one_snapshot_of_the_record_and_its_events(
        tmp_path: Path, store_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``read_after`` (the fleet's replica) reads the session's record, then its events,
    in several statements: a new life of the id (``EventsReset``: its events deleted,
    a new epoch's numbered from 1) committed between them gave the old record, whose
    epoch the replica trusts, with the new life's events as if they went on. In one
    snapshot the page is the record's own life, whatever commits meanwhile."""
    import sqlite3

    from acp_server.store import session_reads
    from acp_server.store.segments import SEGMENT_INSERT, segment_values
    from tests.store.test_journal_trims import _opened

    store, url = _store(tmp_path, store_name)
    async with store, StoreSessionJournal(store) as journal:
        journal.append(_opened("s"))
        for first in range(1, 61, 3):   # a commit each: 20 segments of 3 events
            for n in range(first, first + 3):
                journal.append(EventRecord(session_id="s", event_id=n, type="t",
                                           prompt_id=None, envelope=b'{"old":%d}' % n))
            await journal.wait(journal.appended)

        def new_life() -> None:   # another instance's commit, on its own connection
            values = segment_values("s", [(n, "t", None, b'{"new":%d}' % n)
                                          for n in range(1, 61)])
            if url is not None:
                import psycopg

                with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
                    conn.execute("DELETE FROM session_segments WHERE session_id = 's'")
                    conn.execute(SEGMENT_INSERT[0].format(
                        "(" + ",".join(["%s"] * SEGMENT_INSERT[1]) + ")"), values)
                return
            conn = sqlite3.connect(str(tmp_path / "state" / "lmsp.sqlite3"),
                                   isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("DELETE FROM session_segments WHERE session_id = 's'")
                conn.execute(SEGMENT_INSERT[0].format("(?,?,?,?,?,?,?)"), values)
                conn.execute("COMMIT")
            finally:
                conn.close()

        page_of = session_reads.read_segments_after
        raced: list[bool] = []

        def racing(*args: object, **kwargs: object) -> list[tuple[int, bytes]]:
            if not raced:   # after the record's read, before the events'
                raced.append(True)
                new_life()
            return page_of(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(session_reads, "read_segments_after", racing)
        record, closed, rows = await journal.read_after("s", 0)
        assert raced and record is not None and not closed
        assert [bytes(e) for _, e in rows] == [b'{"old":%d}' % n for n in range(1, 61)]
        monkeypatch.undo()
        _, _, rows = await journal.read_after("s", 0)   # the next read: the new life
        assert [bytes(e) for _, e in rows] == [b'{"new":%d}' % n for n in range(1, 61)]


async def test_a_page_whose_snapshot_the_server_ended_while_idle_is_read_again(
        tmp_path: Path, store_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``read_after`` holds its reader connection in a transaction between its
    statements, and PostgreSQL ends a session idle in a transaction past
    ``idle_in_transaction_session_timeout`` (2 s: a process paused between two of its
    statements). psycopg raises that as an ``InternalError``, not an
    ``OperationalError``: the read failed with it rather than being read again on a
    new connection, as a read whose connection broke is."""
    if store_name != "postgres":
        pytest.skip("PostgreSQL's idle-in-transaction timeout")
    import time

    import psycopg

    from acp_server.store import session_reads
    from tests.store.test_journal_trims import _opened

    store, url = _store(tmp_path, store_name)
    async with store, StoreSessionJournal(store) as journal:
        journal.append(_opened("s"))
        for n in range(1, 4):
            journal.append(EventRecord(session_id="s", event_id=n, type="t",
                                       prompt_id=None, envelope=b'{"n":%d}' % n))
        await journal.wait(journal.appended)
        page_of = session_reads.read_segments_after
        paused: list[int] = []

        def pausing(conn: psycopg.Connection, *args: object) -> list[tuple[int, bytes]]:
            if not paused:   # the first read: idle in its snapshot till the server ends it
                paused.append(conn.info.backend_pid)
                conn.execute("SET idle_in_transaction_session_timeout = 50")
                with psycopg.connect(url, autocommit=True) as other:
                    while other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                        (paused[0],)).fetchone():
                        time.sleep(0.01)   # a worker thread's wait for the server's end
            return page_of(conn, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(session_reads, "read_segments_after", pausing)
        record, closed, rows = await journal.read_after("s", 0)
        assert paused and record is not None and not closed
        assert [bytes(e) for _, e in rows] == [b'{"n":%d}' % n for n in range(1, 4)]
