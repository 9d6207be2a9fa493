"""The durable store: SQLite or PostgreSQL behind one group-commit writer, shared by the
doors that keep state (the LMSP tasks today; the session journal next).

    store = store_for("sqlite:////var/lib/acp/lmsp.sqlite3", state_dir="/var/lib/acp")
    async with store:                                       # connect, migrate, writer
        outcome = await store.create_task(new, event0, None)    # committed on return
        reason = await store.probe()                        # None, or why it cannot serve

Modules:

* ``writer`` — ``GroupCommitStore``: one bounded queue of operations (functions of a
  connection), batched into one transaction per commit on a worker thread; callers
  wake after COMMIT; faults become ``StoreUnavailableError`` and ``health``.
* ``sqlite``, ``pg_engine`` + ``postgres`` — the two engines (``Dialect`` says what
  differs in their SQL). ``schema`` — one versioned list of migrations for both.
* ``tasks`` — the LMSP task tables: records, the ``TaskStore`` protocol, the SQL both
  engines run for them. The LMSP-specific SQL lives here, in the store, next to the
  tables it reads; the LMSP door (``acp_server.lmsp``) holds the wire and the runner.
* ``hub`` — in-process fan-out of committed events (the store is the truth, the hub a
  hint). ``identity`` — a stable instance id for a shared (PostgreSQL) store.
* ``errors`` — ``StoreUnavailableError`` (each door maps it to its 503),
  ``StoreHealth``, ``Backoff``, ``persist``.

Adding tables (the session journal): append a ``schema.Migration`` (SQLite and
PostgreSQL text) to ``schema.MIGRATIONS``, write its operations as functions of the
connection (``fn(conn, events_out[, batch])``) sent through the same store's
``_write`` / ``_read``, so sessions and tasks share one writer, one transaction per
batch and one fsync. An existing state dir is migrated at start-up.

Contracts: this room imports no door and serves no HTTP (``tests/test_architecture.py``);
the doors may import it. ``prepare_state_dir`` makes the state directory 0700; the
SQLite files are 0600.
"""

from __future__ import annotations

import logging
import os
import stat

from acp_server.store.errors import (
    Backoff,
    StoreHealth,
    StoreUnavailableError,
    persist,
)
from acp_server.store.postgres import PostgresTaskStore, is_postgres_url
from acp_server.store.sqlite import SqliteTaskStore
from acp_server.store.tasks import TaskStore

log = logging.getLogger("acp_server.store")

__all__ = ["Backoff", "PostgresTaskStore", "SqliteTaskStore", "StoreHealth",
           "StoreUnavailableError", "TaskStore", "default_url", "persist",
           "prepare_state_dir", "store_for"]


def prepare_state_dir(path: str) -> None:
    """The state directory exists with mode 0700 (tightened when it is ours and wider)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.stat(path)
    if stat.S_IMODE(info.st_mode) & 0o077 and info.st_uid == os.getuid():
        log.info("state directory %s: mode %o → 700", path, stat.S_IMODE(info.st_mode))
        os.chmod(path, 0o700)


def default_url(state_dir: str) -> str:
    return f"sqlite:///{os.path.join(os.path.abspath(state_dir), 'lmsp.sqlite3')}"


def store_for(url: str | None, *, state_dir: str, group_commit: bool = True,
              lease_s: float = 30, renew_s: float = 10, poll_s: float = 1.0,
              busy_timeout_s: float = 5.0) -> TaskStore:
    """An unopened store for ``url`` (``sqlite:///PATH`` or ``postgresql://…``; ``None``
    = ``lmsp.sqlite3`` in ``state_dir``), after ``prepare_state_dir``. ``lease_s``,
    ``renew_s`` and ``poll_s`` are a PostgreSQL store's (``PostgresTaskStore``),
    ``busy_timeout_s`` a SQLite store's busy timeout and a PostgreSQL store's
    ``lock_timeout_s``."""
    prepare_state_dir(state_dir)
    url = url or default_url(state_dir)
    if is_postgres_url(url):
        return PostgresTaskStore(url, group_commit=group_commit, state_dir=state_dir,
                                 lease_s=lease_s, renew_s=renew_s, poll_s=poll_s,
                                 lock_timeout_s=busy_timeout_s)
    if url.startswith("sqlite:"):
        return SqliteTaskStore(url, group_commit=group_commit, busy_timeout_s=busy_timeout_s)
    raise ValueError(f"Unsupported store {url!r}: use sqlite:///PATH or postgresql://….")
