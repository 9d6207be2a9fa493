"""Segment rows (``acp_server.store.segments``), on SQLite and PostgreSQL: a segment that
cannot be decoded is logged and skipped (its session restored with a new epoch and the
run of ids after it; a reader by cursor gets a row it cannot decode, and resumes),
never a crash; segments that repeat ids give each event once; a commit writes one
segment row per session it touches."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from acp_server.fleet.replica import QUESTIONS
from acp_server.store.segments import SEGMENT_INSERT, UNREADABLE, segment_values
from acp_server.store.sessions import StoreSessionJournal
from tests.store.test_journal_bytes import _event, _store
from tests.store.test_journal_refusals import _run_sql
from tests.store.test_journal_trims import _opened

pytestmark = pytest.mark.anyio


async def _three_commits(store: Any) -> None:
    async with StoreSessionJournal(store) as journal:
        journal.append(_opened("s"))
        journal.append(_opened("t"))
        for first in (1, 4, 7):   # a commit each: three segments of "s"
            for n in range(first, first + 3):
                journal.append(_event("s", n, 10))
                journal.append(_event("t", n, 10))
            await journal.wait(journal.appended)


async def test_an_unreadable_segment_is_skipped_with_a_new_epoch(
        tmp_path: Path, store_name: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="acp_server.store.sessions")
    store, url = _store(tmp_path, store_name)
    async with store:
        await _three_commits(store)
    segments = _run_sql(tmp_path, store_name, url, "SELECT first_id, last_id FROM "
                        "session_segments WHERE session_id = 's' ORDER BY last_id")
    assert [tuple(r) for r in segments] == [(1, 3), (4, 6), (7, 9)]   # one row a commit
    _run_sql(tmp_path, store_name, url, "UPDATE session_segments SET events = ? WHERE "
             "session_id = 's' AND last_id = 6", (b"\xc1 not a segment",))
    store, url = _store(tmp_path, store_name)
    async with store, StoreSessionJournal(store) as journal:
        found = {s.record.session_id: s for s in await journal.restore()}
        s, t = found["s"], found["t"]
        assert s.gap and [e.id for e in s.events] == [7, 8, 9] and s.last_event_id == 9
        assert not t.gap and [e.id for e in t.events] == list(range(1, 10))
        _, _, rows = await journal.read_after("s", 0)
        assert [i for i, _ in rows] == [1, 2, 3, 4, 7, 8, 9] and rows[3][1] == UNREADABLE
        _, _, rows = await journal.read_after("s", 5)   # from inside it
        assert rows[0] == (6, UNREADABLE) and [i for i, _ in rows[1:]] == [7, 8, 9]
    assert any("session s from id 4 are unreadable" in r.getMessage() for r in caplog.records)


async def test_a_listing_skips_an_unreadable_newest_segment(
        tmp_path: Path, store_name: str, caplog: pytest.LogCaptureFixture) -> None:
    """The listing's read of every open session (``read_open``) takes each one's newest
    event from its newest segment: one that cannot be decoded is logged with the last
    id it holds, and the session is still listed, with its last id."""
    caplog.set_level(logging.ERROR, logger="acp_server.store.sessions")
    store, url = _store(tmp_path, store_name)
    async with store:
        await _three_commits(store)
    _run_sql(tmp_path, store_name, url, "UPDATE session_segments SET events = ? WHERE "
             "session_id = 's' AND last_id = 9", (b"\xc1 not a segment",))
    store, url = _store(tmp_path, store_name)
    async with store, StoreSessionJournal(store) as journal:
        found = {s.record.session_id: s for s in await journal.read_open(QUESTIONS)}
    assert found["s"].last_event_id == 9 and found["s"].events == []
    assert [e.id for e in found["t"].events] == [9]
    assert any("session s (through id 9) are unreadable" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


async def test_segments_that_repeat_ids_give_each_event_once(tmp_path: Path,
                                                              store_name: str) -> None:
    store, url = _store(tmp_path, store_name)
    async with store:
        await _three_commits(store)
    # 1..6 and 4..9: a commit retried after its first attempt landed, say
    def segment(first: int, last: int) -> tuple[Any, ...]:
        return segment_values("s", [(r.event_id, r.type, r.prompt_id, r.envelope) for r in (
            _event("s", n, 10) for n in range(first, last + 1))])

    _run_sql(tmp_path, store_name, url, "DELETE FROM session_segments WHERE session_id = 's'")
    for first, last in ((1, 6), (4, 9)):
        _run_sql(tmp_path, store_name, url, SEGMENT_INSERT[0].format("(?,?,?,?,?,?,?)"),
                 segment(first, last))
    store, url = _store(tmp_path, store_name)
    async with store, StoreSessionJournal(store) as journal:
        found = {s.record.session_id: s for s in await journal.restore()}
        _, _, rows = await journal.read_after("s", 2)
    assert [i for i, _ in rows] == [3, 4, 5, 6, 7, 8, 9]
    assert [e.id for e in found["s"].events] == list(range(1, 10))


async def test_a_large_commit_is_cut_in_segments_and_read_by_cursor(
        tmp_path: Path, store_name: str) -> None:
    """A commit of more than ``SEGMENT_EVENTS`` events of a session is cut (a reader by
    cursor decodes at most a segment past what it asks); every event read once, in
    order, in pages."""
    from acp_server.store.segments import SEGMENT_EVENTS

    store, url = _store(tmp_path, store_name)
    async with store, StoreSessionJournal(store) as journal:
        journal.append(_opened("s"))
        count = 2 * SEGMENT_EVENTS + 88
        for n in range(1, count + 1):   # appended at once: one commit
            journal.append(_event("s", n, 10))
        await journal.wait(journal.appended)
        assert journal.commits == 1
        segments = _run_sql(tmp_path, store_name, url, "SELECT first_id, last_id FROM "
                            "session_segments WHERE session_id = 's' ORDER BY last_id")
        assert [tuple(r) for r in segments] == [
            (1, SEGMENT_EVENTS), (SEGMENT_EVENTS + 1, 2 * SEGMENT_EVENTS),
            (2 * SEGMENT_EVENTS + 1, count)]
        ids: list[int] = []
        while True:
            _, _, rows = await journal.read_after("s", ids[-1] if ids else 0, 100)
            ids += [i for i, _ in rows]
            if len(rows) < 100:
                break
        assert ids == list(range(1, count + 1))


async def test_the_byte_trim_rewrites_the_segment_straddling_its_bound(
        tmp_path: Path, store_name: str) -> None:
    """Whole segments below the bound go, the one across it keeps its newest events that
    fit (its ``size`` theirs), and the newest event stays even alone past the bound."""
    store, url = _store(tmp_path, store_name)
    async with store, StoreSessionJournal(store) as journal:
        journal.append(_opened("s"))
        for first in (1, 11):   # two segments of ten events
            for n in range(first, first + 10):
                journal.append(_event("s", n, 100))
            await journal.wait(journal.appended)
        size = {n: len(_event("s", n, 100).envelope) for n in range(1, 21)}
        journal.max_session_bytes = sum(size[n] for n in range(8, 21)) + 5   # the newest
        # 13: three of the first segment's
        await store._write(lambda conn, out, *state: journal._trim_bytes(conn, "s"))
        rows = _run_sql(tmp_path, store_name, url, "SELECT first_id, last_id, size FROM "
                        "session_segments WHERE session_id = 's' ORDER BY last_id")
        assert [tuple(r) for r in rows] == [(8, 10, size[8] + size[9] + size[10]),
                                            (11, 20, sum(size[n] for n in range(11, 21)))]
        found = {s.record.session_id: s for s in await journal.restore()}
        assert [e.id for e in found["s"].events] == list(range(8, 21))
        journal.max_session_bytes = 10   # under one event: the newest alone stays
        await store._write(lambda conn, out, *state: journal._trim_bytes(conn, "s"))
        rows = _run_sql(tmp_path, store_name, url, "SELECT first_id, last_id, size FROM "
                        "session_segments WHERE session_id = 's' ORDER BY last_id")
        assert [tuple(r) for r in rows] == [(20, 20, size[20])]
