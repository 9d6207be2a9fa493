"""One serving process per SQLite store.

    held = claim_sqlite_store("sqlite:////var/lib/acp/lmsp.sqlite3")   # None: PostgreSQL
    ...                                                                 # serve
    held.release()                                                      # or the exit

A SQLite store (its session journal and LMSP tasks) belongs to one server: leases,
forwarding and adoption are PostgreSQL's. A second ``serve`` on the same file (a second
terminal with another ``--port``, or ``--store sqlite:///…`` of another's file) would
restore the first's sessions, fail the prompts the first is running as
``server_restarted`` and append events under the same ids beside it.

Contracts: ``claim_sqlite_store`` takes an exclusive, non-blocking ``flock`` on
``<database>.serve-lock`` (created 0600, close-on-exec so no agent inherits it) and
writes its pid there; the kernel drops it when the process ends, ``kill -9`` included.
A lock another process holds raises ``StoreInUseError`` naming the database and that
process's pid. A lock file that cannot be made (a read-only folder: the server then
waits for the store as it does without one) is no guard and no error. The command-line
tools that open the store beside a running server (``token``, ``audit``) take no lock.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os

from acp_server.store.postgres import is_postgres_url
from acp_server.store.sqlite import store_path

LOCK_SUFFIX = ".serve-lock"


class StoreInUseError(Exception):
    """Another live process serves this SQLite store."""

    def __init__(self, database: str, pid: int | None) -> None:
        who = f"pid {pid}" if pid else "pid unknown"
        super().__init__(f"the store {database} is in use by another acp-server serve "
                         f"({who}): stop it, or give this server its own --state-dir")
        self.database = database
        self.pid = pid


@dataclasses.dataclass
class StoreLock:
    path: str
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)   # drops the lock
            self.fd = None


def claim_sqlite_store(url: str) -> StoreLock | None:
    """The store's lock, held; ``None`` for PostgreSQL or when no lock file can be made."""
    if is_postgres_url(url):
        return None
    database = os.path.abspath(store_path(url))
    path = database + LOCK_SUFFIX
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _pid(fd)
        os.close(fd)
        raise StoreInUseError(database, holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return StoreLock(path, fd)


def _pid(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


__all__ = ["LOCK_SUFFIX", "StoreInUseError", "StoreLock", "claim_sqlite_store"]
