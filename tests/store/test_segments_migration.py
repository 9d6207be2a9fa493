"""A store the version before segment rows wrote (schema 7: ``session_events``, one row
an event) is migrated at start (migration 8, ``acp_server.store.segments``) with no
loss, on SQLite and PostgreSQL: the same sessions, event ids, rings, epochs and gaps
restored, the same events read by cursor, a write-behind marker kept (its session
still gets a new epoch), an envelope that cannot be decoded still skipped; and the
journal writes segments on from the migrated ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from acp_server.store.segments import decode_segment
from acp_server.store.sessions import StoreSessionJournal
from acp_server.store.write_behind import Marker
from bridge.journal import PromptAccepted, RestoredSession
from tests.store.segment_rows import stored_events
from tests.store.test_journal_bytes import _event, _store
from tests.store.test_journal_refusals import _run_sql
from tests.store.test_journal_trims import _opened, _prompts

pytestmark = pytest.mark.anyio

OLD_TABLE = {  # migration 3's ``session_events``, as the version before wrote it
    "sqlite": "CREATE TABLE session_events (session_id TEXT NOT NULL, id INTEGER NOT NULL, "
              "type TEXT NOT NULL, prompt_id TEXT, envelope BLOB NOT NULL, "
              "PRIMARY KEY (session_id, id)) WITHOUT ROWID",
    "postgres": "CREATE TABLE session_events (session_id TEXT NOT NULL, id BIGINT NOT NULL, "
                "type TEXT NOT NULL, prompt_id TEXT, envelope BYTEA NOT NULL, "
                "PRIMARY KEY (session_id, id))"}


def _seen(found: list[RestoredSession]) -> dict[str, Any]:
    return {s.record.session_id: (s.record.epoch, [e.id for e in s.events], s.last_event_id,
                                  s.gap, sorted(p.prompt_id for p in s.unsettled),
                                  sorted(s.started)) for s in found}


def _rewind(tmp_path: Path, store_name: str, url: str | None) -> int:
    """The store as the version before wrote it: every segment back to one row an
    event (a marker to its ``id = 0`` row), ``session_segments`` dropped, schema 7."""
    def sql(statement: str, params: tuple[Any, ...] = ()) -> list[Any]:
        return _run_sql(tmp_path, store_name, url, statement, params)

    rows = sql("SELECT session_id, last_id, events FROM session_segments ORDER BY "
               "session_id, last_id")
    sql(OLD_TABLE[store_name])
    count = 0
    for sid, last_id, blob in rows:
        if last_id == 0:
            sql("INSERT INTO session_events VALUES (?, 0, '_write_behind', NULL, ?)",
                (sid, b""))
            continue
        for event_id, kind, pid, envelope in decode_segment(bytes(blob)):
            sql("INSERT INTO session_events VALUES (?, ?, ?, ?, ?)",
                (sid, event_id, kind, pid, envelope))
            count += 1
    sql("DROP TABLE session_segments")
    if store_name == "postgres":
        sql("DELETE FROM schema_version WHERE version = 8")
    else:
        sql("PRAGMA user_version = 7")
    return count


async def test_a_store_of_event_rows_is_migrated_with_no_loss(tmp_path: Path,
                                                             store_name: str) -> None:
    store, url = _store(tmp_path, store_name)
    async with store:
        async with StoreSessionJournal(store, ring_size=150) as journal:
            for sid in ("long", "holed", "marked", "broken", "running"):
                journal.append(_opened(sid))
            for n in range(1, 301):   # past the ring: trimmed, the newest 150 restored
                journal.append(_event("long", n, 40))
                if n % 70 == 0:
                    await journal.wait(journal.appended)   # segments of several commits
            for record in _prompts("long", 1, 3):
                journal.append(record)
            for n in (1, 2, 3, 6, 7):   # a hole (events shed): a new epoch at restore
                journal.append(_event("holed", n, 10))
            journal.append(Marker("marked", True, 1))   # write-behind: a new epoch
            journal.append(_event("marked", 1, 10))
            for n in range(1, 6):
                journal.append(_event("broken", n, 10))
            journal.append(PromptAccepted(session_id="running", prompt_id="p", prompt=[],
                                          queued_at_ms=1, seq=1))
            journal.append(_event("running", 1, 10))   # its prompt's event: it started
            await journal.wait(journal.appended)
        async with StoreSessionJournal(store, ring_size=150) as journal:
            before = _seen(await journal.restore())
            read = await journal.read_after("long", 160, 30)
    assert before["long"][1] == list(range(151, 301)) and not before["long"][3]
    assert before["holed"][3] and before["marked"][3] and not before["broken"][3]
    assert before["running"][5] == ["p"]
    events = _rewind(tmp_path, store_name, url)
    assert events > 150
    bad = b"\xc1 not an envelope"
    _run_sql(tmp_path, store_name, url, "UPDATE session_events SET envelope = ? WHERE "
             "session_id = 'broken' AND id = 3", (bad,))
    if store_name == "sqlite":   # TEXT that is not UTF-8 (an envelope written by hand)
        _run_sql(tmp_path, store_name, url, "UPDATE session_events SET envelope = "
                 "CAST(x'7bc1ff' AS TEXT) WHERE session_id = 'broken' AND id = 4")
    store, url = _store(tmp_path, store_name)
    async with store:   # migrated as it opens
        async with StoreSessionJournal(store, ring_size=150) as journal:
            after = _seen(await journal.restore())
            assert await journal.read_after("long", 160, 30) == read
            journal.append(_event("long", 301, 40))   # the ids go on from the migrated
            await journal.wait(journal.appended)
            assert [e[0] for e in (await journal.read_after("long", 299, 10))[2]] == [
                300, 301]
    assert after.pop("broken")[3]   # its unreadable event: skipped, a new epoch
    before.pop("broken")
    assert after == before
    tables = _run_sql(tmp_path, store_name, url, (
        "SELECT table_name FROM information_schema.tables WHERE table_schema = "
        "current_schema() AND table_name = 'session_events'") if store_name == "postgres"
        else "SELECT name FROM sqlite_master WHERE name = 'session_events'")
    assert tables == []
    stored = stored_events(lambda s, p=(): _run_sql(tmp_path, store_name, url, s, p), "long")
    assert [e[0] for e in stored][-3:] == [299, 300, 301]
    assert [e[0] for e in stored_events(
        lambda s, p=(): _run_sql(tmp_path, store_name, url, s, p), "holed")] == [1, 2, 3, 6, 7]
