"""SQLite's WAL checkpointed beside the writer, not inside its commits.

    wal = WalCheckpoints(path)
    wal.open(connection)      # after the writer set WAL mode: the checkpoints' own connection
    tg.start_soon(wal.run)    # its own thread, for the store's life
    wal.committed()           # the writer's thread, after each COMMIT
    wal.stop()                # the queue closed
    wal.connection.close(); ...; wal.close()   # the -shm descriptor after every connection

Contracts:

* SQLite's automatic checkpoint runs inside the COMMIT that takes the WAL past
  ``wal_autocheckpoint`` pages: measured, ~7 ms of CPU and 10-15 ms of the writer's
  time for ~1,000 pages, a stall for every caller waiting on that commit (a burst's
  publisher waits for its commits). Here the writer's own threshold is raised to
  ``BACKSTOP_PAGES`` and, after a commit that leaves at least ``CHECKPOINT_PAGES``
  frames not yet copied back, a PASSIVE checkpoint runs on a thread and connection of
  its own: as often as SQLite's own would run, never inside a commit. PASSIVE never
  waits for a lock (no busy handler), so it never blocks the writer or a reader; the
  writer's automatic checkpoint stays as the backstop when this one falls behind.
* The frames not yet copied are read from the WAL index (the ``-shm`` file's header:
  ``mxFrame`` at byte 16, ``nBackfill`` at byte 96, native byte order; SQLite's file
  format, "WAL-index format"): one ``pread`` of 100 bytes per commit. A torn or failed
  read only makes a checkpoint early or late.
* The ``-shm`` file's descriptor stays open until ``close``, called after every
  connection of the process to the database is closed: closing any descriptor of a
  file drops every POSIX lock the process holds on it, SQLite's own included.
* The checkpoints' connection is opened with the store's others, never later: a
  checkpoint never creates, or opens anew, a database file deleted or replaced under
  the store (``SqliteTaskStore._check_file``).
* A checkpoint that fails is logged at debug level and changes nothing else (as the
  automatic one would); the next commit past the threshold asks again.
* The checkpoint's thread does no ``store_work`` (it lowers no switch interval): it
  holds the interpreter lock only to start and end its one statement.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import struct
import threading

import anyio

log = logging.getLogger("acp_server.store.sqlite")

CHECKPOINT_PAGES = 1000   # SQLite's default automatic threshold
BACKSTOP_PAGES = 8000     # the writer's own automatic checkpoint (~32 MB of WAL)
_HEADER = struct.Struct("=16xI76xI")   # mxFrame (byte 16), nBackfill (byte 96)


class WalCheckpoints:
    """See the module docstring. ``pages`` is the threshold (``CHECKPOINT_PAGES``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.connection: sqlite3.Connection | None = None
        self._shm: int | None = None
        self._wanted = False   # between ``open`` and ``close``
        self._due = threading.Event()
        self._stop = False
        self.pages = CHECKPOINT_PAGES
        self.checkpoints = 0   # background checkpoints run (tests)

    def open(self, connection: sqlite3.Connection | None) -> None:
        """Checkpoint on ``connection`` (``None``: never) and read the ``-shm`` file from
        now on (the writer has set WAL mode; SQLite makes the file at the first access,
        so it is opened when first there)."""
        self.connection = connection
        self._wanted = True
        self._open_shm()

    def _open_shm(self) -> None:
        try:
            self._shm = os.open(f"{self.path}-shm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            self._shm = None

    def close(self) -> None:
        """After every connection of the process to the database is closed."""
        self._wanted = False
        if self._shm is not None:
            os.close(self._shm)
            self._shm = None

    def behind(self) -> int:
        """Frames in the WAL not yet copied into the database (0 when unreadable)."""
        if self._shm is None:
            if not self._wanted:
                return 0
            self._open_shm()
            if self._shm is None:
                return 0
        try:
            header = os.pread(self._shm, _HEADER.size, 0)
        except OSError:
            return 0
        if len(header) < _HEADER.size:
            return 0
        last, copied = _HEADER.unpack(header)
        return max(0, last - copied)

    def committed(self) -> None:
        """The writer committed (its thread): ask for a checkpoint when due."""
        if not self._due.is_set() and self.behind() >= self.pages:
            self._due.set()

    def stop(self) -> None:
        self._stop = True
        self._due.set()

    async def run(self) -> None:
        """The checkpoints' thread, until ``stop``."""
        await anyio.to_thread.run_sync(self._loop, limiter=anyio.CapacityLimiter(1))

    def _loop(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            if self._stop:
                return
            if self.connection is None:
                continue
            try:
                self.connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                self.checkpoints += 1
            except (sqlite3.Error, OSError) as exc:
                log.debug("%s: a background checkpoint failed: %s", self.path, exc)
