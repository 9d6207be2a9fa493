"""SQLite's WAL is checkpointed beside the writer (``acp_server.store.wal``): the WAL
index is read right, a checkpoint runs on its own thread once enough frames wait, a
failed one changes nothing else, and the ``-shm`` descriptor closes after every
connection (the WAL is then checkpointed and removed by the last one, as SQLite does)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from acp_server.store import wal as wal_module
from acp_server.store.sqlite import SqliteTaskStore
from acp_server.store.wal import WalCheckpoints
from tests.bridge.helpers import wait_until

BLOB = b"x" * 3000   # about one page a row


def _fill(conn: Any, out: Any, rows: int = 40) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS filler(b BLOB)")
    conn.executemany("INSERT INTO filler(b) VALUES (?)", [(BLOB,)] * rows)


def test_behind_reads_the_frames_sqlite_would_checkpoint(tmp_path: Path) -> None:
    path = str(tmp_path / "w.db")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    wal = WalCheckpoints(path, lambda: sqlite3.connect(path))
    wal.open()
    try:
        assert wal.behind() == 0
        conn.execute("CREATE TABLE t(b BLOB)")
        for _ in range(30):
            conn.execute("INSERT INTO t VALUES (?)", (BLOB,))
        waiting = wal.behind()
        busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert (busy, waiting) == (0, frames) and frames >= 30 and copied == frames
        assert wal.behind() == 0
    finally:
        conn.close()
        wal.close()
    assert not os.path.exists(path + "-wal")   # the last connection removed it


def test_an_unreadable_index_is_nothing_behind(tmp_path: Path) -> None:
    wal = WalCheckpoints(str(tmp_path / "none.db"), lambda: sqlite3.connect(":memory:"))
    assert wal.behind() == 0   # never opened
    wal.committed()            # asks for nothing
    assert not wal._due.is_set()


@pytest.mark.anyio
async def test_the_store_checkpoints_beside_its_writer(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    async with SqliteTaskStore(path) as store:
        store.wal.pages = 100
        commits = store.commits
        for _ in range(4):
            await store._write(_fill)
        assert store.commits == commits + 4
        await wait_until(lambda: store.wal.checkpoints >= 1)
        await wait_until(lambda: store.wal.behind() < 100)
        # the writer's own automatic checkpoint is only the backstop
        auto = await store._write(lambda conn, out: conn.execute(
            "PRAGMA wal_autocheckpoint").fetchone()[0])
        assert auto == wal_module.BACKSTOP_PAGES
    assert store.wal._shm is None
    assert not os.path.exists(path + "-wal")   # the writer closed last and removed it
    with sqlite3.connect(path) as conn:   # everything committed is there
        assert conn.execute("SELECT COUNT(*) FROM filler").fetchone()[0] == 160


@pytest.mark.anyio
async def test_a_failed_checkpoint_changes_nothing_and_the_next_runs(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = str(tmp_path / "store.db")
    async with SqliteTaskStore(path) as store:
        store.wal.pages = 100
        connect, calls = store.wal._connect, []

        def flaky() -> sqlite3.Connection:
            calls.append(1)
            if len(calls) == 1:
                raise sqlite3.OperationalError("unable to open database file")
            return connect()

        store.wal._connect = flaky
        caplog.set_level("DEBUG", logger="acp_server.store.sqlite")
        for _ in range(4):
            await store._write(_fill)
        await wait_until(lambda: calls != [])
        await wait_until(lambda: "background checkpoint failed" in caplog.text)
        for _ in range(4):   # the writer goes on; the next commit past the mark asks again
            await store._write(_fill)
        await wait_until(lambda: store.wal.checkpoints >= 1)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM filler").fetchone()[0] == 320
