"""Migration 8 on SQLite through a full disk and a ``kill -9``: a real ``acp-server
serve`` starts on a state folder (a tmpfs too small for the migration's writes) that the
version before segment rows wrote (schema 7: ``session_events``, one row an event).
The migration runs out of space part way through its one transaction: the server does
not end (it answers 503 and tries again), and the file is left as it was, schema 7,
every old row there. Killed (``kill -9``) while it waits, then started on the same
folder with room enough, it migrates the store whole, with no loss: the same events
(ids, types, prompt ids, envelopes), the same last ids and terminals a client reloading
a session gets.

The pause in the middle is the disk's, not a timing: the tmpfs has room for the old
file and a third of it more, and the migration writes about as much as the file again
before it can commit.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import httpx

from tests.harness import ServeProcess
from tests.store.segment_rows import stored_events
from tests.store.test_migration_outage import _idle, _loaded
from tests.store.test_outage_processes import tmpfs
from tests.store.test_pg_locked_tables import _until
from tests.store.test_segments_migration import _rewind
from tests.store.test_session_restart import _prompt

SESSIONS, CHUNKS = 4, 2_500   # ~10,000 events: a few MiB of rows to rewrite


def _old_rows(db_path: Path) -> tuple[int, int]:
    """(schema version, rows of ``session_events``), read-only."""
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        rows = db.execute("SELECT count(*) FROM session_events").fetchone()[0]
    return version, rows


def test_a_full_disk_in_the_middle_of_migration_8_loses_nothing(tmp_path: Path) -> None:
    child = ServeProcess(tmp_path).start()   # the store in <tmp_path>/state (schema 8)
    try:
        http = child.http
        sids = [http.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
                for _ in range(SESSIONS)]
        for sid in sids:
            assert http.post(f"/session/{sid}/prompt",
                             json=_prompt(f"/chunks {CHUNKS} many")).status_code == 202
            assert http.post(f"/session/{sid}/prompt", json=_prompt("after")).status_code == 202
        for sid in sids:
            _until(lambda sid=sid: _idle(http, sid), "the prompts never ended")
    finally:
        assert child.stop() == 0   # a clean stop: what it journaled is committed
    child.start()   # what a restart on schema 8 restores (read back from the store)
    try:
        with httpx.Client(base_url=child.base_url, timeout=30) as http:
            before = {sid: _loaded(http, sid) for sid in sids}
    finally:
        assert child.stop() == 0
    db_path = tmp_path / "state" / "lmsp.sqlite3"
    with sqlite3.connect(db_path) as db:
        events = {sid: stored_events(db.execute, sid) for sid in sids}
    assert all(len(e) > CHUNKS for e in events.values())
    old_rows = _rewind(tmp_path, "sqlite", None)   # schema 7, as the version before wrote it
    with sqlite3.connect(db_path) as db:
        db.execute("VACUUM")   # the file at its rows' size: the tmpfs is sized on it
    assert _old_rows(db_path) == (7, old_rows)

    small = tmp_path / "small"
    room = sum(p.stat().st_size for p in (tmp_path / "state").iterdir() if p.is_file())
    with tmpfs(small, f"{room + room // 3}"):
        for item in (tmp_path / "state").iterdir():
            if item.is_file():
                shutil.copy2(item, small / item.name)
        moved = ServeProcess(tmp_path, state_dir="small")
        moved.spawn()
        try:
            _until(lambda: "cannot start" in moved.stderr_text(),
                   "the migration never ran out of space")
            assert moved.returncode is None, moved.stderr_text()[-3000:]   # waits, not ends
            why = next(line for line in moved.stderr_text().splitlines()
                       if "cannot start" in line)
            assert "database or disk is full" in why, why   # the cause, not the ROLLBACK's
            assert _old_rows(small / "lmsp.sqlite3") == (7, old_rows)   # nothing of it kept
        finally:
            moved.kill()   # kill -9 while it waits to try again
        subprocess.run(["mount", "-o", f"remount,size={room * 4}", "tmpfs", str(small)],
                       check=True)
        moved.start()   # the same folder, with room: migrated whole, then served
        try:
            with httpx.Client(base_url=moved.base_url, timeout=30) as http:
                assert {sid: _loaded(http, sid) for sid in sids} == before
            with sqlite3.connect(f"file:{small / 'lmsp.sqlite3'}?mode=ro", uri=True) as db:
                assert {sid: stored_events(db.execute, sid) for sid in sids} == events
                assert db.execute("PRAGMA user_version").fetchone()[0] == 8
                found: Any = db.execute("SELECT name FROM sqlite_master WHERE name = "
                                        "'session_events'").fetchall()
                assert found == []
        finally:
            assert moved.stop() == 0
