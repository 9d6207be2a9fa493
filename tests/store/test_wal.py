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
    wal = WalCheckpoints(path)
    wal.open(None)
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
    wal = WalCheckpoints(str(tmp_path / "none.db"))
    assert wal.behind() == 0   # never opened
    wal.open(None)
    assert wal.behind() == 0   # no such file
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
        real, calls = store.wal.connection, []

        class Flaky:
            def execute(self, sql: str) -> Any:
                calls.append(sql)
                if len(calls) == 1:
                    raise sqlite3.OperationalError("disk I/O error")
                return real.execute(sql)

        store.wal.connection = Flaky()  # type: ignore[assignment]
        caplog.set_level("DEBUG", logger="acp_server.store.sqlite")
        for _ in range(4):
            await store._write(_fill)
        await wait_until(lambda: calls != [])
        await wait_until(lambda: "background checkpoint failed" in caplog.text)
        for _ in range(4):   # the writer goes on; the next commit past the mark asks again
            await store._write(_fill)
        await wait_until(lambda: store.wal.checkpoints >= 1)
        store.wal.connection = real
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM filler").fetchone()[0] == 320


@pytest.mark.anyio
async def test_a_replaced_file_is_never_opened_by_a_checkpoint(tmp_path: Path) -> None:
    """The checkpoints' connection is the one opened with the store: a file deleted
    under the store is not made again by a checkpoint (the store is lost, 503)."""
    path = tmp_path / "store.db"
    async with SqliteTaskStore(str(path)) as store:
        store.wal.pages = 100
        opened = store.wal.connection
        for name in ("store.db", "store.db-wal"):
            (tmp_path / name).unlink()
        with pytest.raises(Exception, match="deleted or replaced"):
            await store._write(_fill)
        ran = store.wal.checkpoints
        store.wal._due.set()   # ask anyway
        await wait_until(lambda: store.wal.checkpoints > ran)
        assert store.wal.connection is opened
        assert not path.exists()
