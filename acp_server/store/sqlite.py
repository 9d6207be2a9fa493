"""The SQLite task store: WAL, ``synchronous=FULL`` (``NORMAL`` for the session journal's
own commits), one writer thread, group commit.

    async with SqliteTaskStore("/var/lib/acp/lmsp.db", on_commit=hub.publish) as store:
        outcome = await store.create_task(new, event0, None)   # fsynced on return

Contracts (see ``acp_server.store.tasks`` for the interface):

* Writes are *operations* (a function of the connection) sent through a bounded
  memory stream to one writer task (``writer.py``), which runs everything queued so
  far — at most ``MAX_BATCH`` — in one ``BEGIN IMMEDIATE … COMMIT`` on one worker
  thread: concurrent creates share one transaction and one fsync.
  A batch runs without savepoints; when one of its operations raises, it is rolled
  back and run again with a SAVEPOINT per operation, so that one rolls back alone.
  ``group_commit=False`` commits every operation on its own (the benchmark baseline).
* Callers wake only after the COMMIT; ``on_commit`` gets the batch's events first.
* What a COMMIT survives. A batch with any durable operation (every task, token and
  audit write) commits with ``synchronous=FULL``: the WAL is fsynced before the
  caller wakes, so the commit survives a power loss. A batch of only ``durable=False``
  operations (the session journal's: ``acp_server.store.sessions``) commits with
  ``synchronous=NORMAL``: its frames are written to the WAL file (the OS holds them)
  but not fsynced, so the commit survives a ``kill -9`` of the server and any crash
  of the process, not a power loss or a kernel crash (then the last such commits
  may roll back; the file stays consistent either way, SQLite's WAL guarantee). The
  next FULL commit, and every checkpoint, fsyncs the WAL with everything before it.
  The setting is switched only when it changes between two batches.
* A power loss is noticed (``unsynced_loss``). Before its first NORMAL commit a process
  writes a row of its own to ``unsynced_runs`` (its run id and the kernel's boot id,
  ``/proc/sys/kernel/random/boot_id``) in a FULL commit, and deletes it when it closes
  cleanly (a FULL commit too: it flushes every NORMAL commit before it). At open, a row
  left by another run whose boot id is not this boot's (or is unknown) means that run
  may have lost its last NORMAL commits: ``unsynced_loss`` is ``True`` and the session
  journal restores every session under a new epoch (``StoreSessionJournal.restore``),
  then calls ``settled_earlier_runs`` so this run's clean close deletes those rows too.
  A row left on the same boot is a ``kill -9``: nothing was lost (the OS holds the WAL).
* Reads use separate connections (WAL readers never block the writer).
* The WAL is checkpointed beside the writer, on a thread and connection of its own,
  as often as SQLite's automatic checkpoint would run, never inside a COMMIT
  (``acp_server.store.wal``); the automatic one stays as a backstop.
* Faults answer ``StoreUnavailableError`` (503), never end the process: a full disk,
  an I/O error, a file locked by another process for longer than ``busy_timeout_s``
  (the writer waits that long, then that batch fails; the next one tries again).
* The file is checked before every batch and by ``probe`` (``os.stat``: device and
  inode as opened). Replaced under us, the store is *lost*: every write and read
  answers ``StoreUnavailableError`` from then on (nothing is acknowledged into an
  unlinked inode) and ``probe`` says why, until a restart opens the file anew. Missing
  (deleted, or its folder renamed away) it is lost too, but while the same file can
  come back under its name (the folder renamed back) each check looks again: the
  store resumes by itself when it does.
* The ``-wal`` file is checked with it. Deleted or replaced under us (a clean-up
  script, another process's last close), everything committed since the last
  checkpoint lives only in the unlinked WAL, which a crash would lose: it is copied
  into the database file at once (``wal_checkpoint(TRUNCATE)``) and the store is lost
  until a restart (a new WAL); ``probe`` says whether the copy was made.
* The database and its ``-wal`` / ``-shm`` files are mode 0600 (created so, tightened
  when found wider); the folder is made by ``prepare_state_dir`` (0700).
"""

from __future__ import annotations

import errno
import logging
import os
import uuid
import sqlite3
import stat
from collections.abc import Callable, Sequence

import anyio
import anyio.abc

from acp_server.store.tasks import (
    UNCLAIM,
    ClaimsOne,
    ObservedMoves,
    CommittedEvent,
    CreateOutcome,
    Dialect,
    Finish,
    FinishFactory,
    IdempotencyClaim,
    NewTask,
    QueueFullError,
    RecoveryFactory,
    RecoveryReport,
    TaskRecord,
    Transition,
    cancel_in,
    queued_record,
    recover_rows,
)
from acp_server.store.tasks import AnyEvent
from acp_server.store.audit import AuditOps
from acp_server.store.errors import StoreUnavailableError
from acp_server.store.tokens import TokenOps
from acp_server.store.schema import migrate_sqlite
from acp_server.store.wal import BACKSTOP_PAGES, WalCheckpoints
from acp_server.store.writer import GroupCommitStore, Op

log = logging.getLogger("acp_server.store.sqlite")

READERS = 2
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
_UNSYNCED_RUNS = ("CREATE TABLE IF NOT EXISTS unsynced_runs "
                  "(run TEXT PRIMARY KEY, boot_id TEXT NOT NULL)")
BUSY_TIMEOUT_S = 5.0
# Prepared statements kept per connection (sqlite3's default is 128): the event INSERTs
# alone take one per row count (``tasks.EVENT_ROWS``).
CACHED_STATEMENTS = 256
MIN_FREE_BYTES = 1 << 20   # less free space than this in the folder: ``probe`` says full
SQL = Dialect()
# sqlite3 errors that are the operation's own (a bug or a constraint), not the store's
_OWN_ERRORS = (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError,
               sqlite3.NotSupportedError, sqlite3.DataError)


def _connect(path: str, busy_timeout_s: float = BUSY_TIMEOUT_S) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                           timeout=busy_timeout_s, cached_statements=CACHED_STATEMENTS)
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def read_boot_id(path: str | None = None) -> str | None:
    """The kernel's boot id (a new one at every boot; ``BOOT_ID_PATH``), ``None`` when
    unreadable."""
    try:
        with open(path or BOOT_ID_PATH, encoding="ascii") as file:
            return file.read().strip() or None
    except (OSError, ValueError):
        return None


def _identity(path: str) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of ``path``, ``None`` when there is none."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def private_files(path: str) -> None:
    """The database file exists with mode 0600; it and its ``-wal`` / ``-shm`` files
    are tightened to 0600 when wider (SQLite gives the latter the database's mode).
    An existing file is never opened here: closing any descriptor of a file drops
    every POSIX lock this process holds on it, SQLite's included, and another process
    (``acp-server token``) closing its connection would then take this one's WAL for
    unused and delete it."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL
                         | getattr(os, "O_CLOEXEC", 0), 0o600))
    except FileExistsError:
        pass
    for name in (path, f"{path}-wal", f"{path}-shm"):
        try:
            info = os.stat(name)
        except FileNotFoundError:
            continue
        if stat.S_IMODE(info.st_mode) & 0o077 and info.st_uid == os.getuid():
            os.chmod(name, 0o600)


class SqliteTaskStore(TokenOps, AuditOps, ClaimsOne, ObservedMoves,
                      GroupCommitStore[sqlite3.Connection]):
    """See the module docstring. ``path`` is a file path (``sqlite:///`` stripped). The
    tokens and the audit log (``TokenOps``, ``AuditOps``) share its writer."""

    shared = False   # one instance per file

    def __init__(self, path: str, *, on_commit: Callable[[list[CommittedEvent]], None]
                 | None = None, group_commit: bool = True,
                 busy_timeout_s: float = BUSY_TIMEOUT_S,
                 boot_id: Callable[[], str | None] | None = None) -> None:
        """``boot_id``: the kernel's boot id, ``None`` when unknown (a test injects it)."""
        super().__init__(on_commit=on_commit, group_commit=group_commit, readers=READERS)
        self.path = store_path(path)
        self.busy_timeout_s = busy_timeout_s
        self._writer: sqlite3.Connection | None = None
        self._file: tuple[int, int] | None = None   # (st_dev, st_ino) as opened
        self._wal_file: tuple[int, int] | None = None   # the -wal file's, once open
        self._lost: str | None = None               # why the file is gone, for good
        self._missing = False   # lost for want of the path alone: it may come back
        # Queued tasks, kept by the writer thread (for ``max_queued`` without a COUNT
        # per create); ``None`` = unknown, recounted when next needed.
        self._queued: int | None = None
        self._full = True   # the writer connection's ``synchronous`` is FULL
        self.boot_id = (boot_id or read_boot_id)() or ""   # "" = unknown
        self.run = uuid.uuid4().hex
        # True when an earlier run may have lost NORMAL commits to a power loss (the
        # module docstring); read at open.
        self.unsynced_loss = False
        self._earlier_runs: list[str] = []   # their rows, read at open
        self._clear_at_close: set[str] = set()   # this run's row, once written
        self._marked = False   # this run's row is written (before its first NORMAL)
        self.wal = WalCheckpoints(self.path)

    # -- lifecycle -----------------------------------------------------------------
    async def _connect_all(self) -> None:
        try:
            self._writer = await anyio.to_thread.run_sync(self._open_writer)
            for _ in range(READERS):
                self._readers.append(await anyio.to_thread.run_sync(
                    _connect, self.path, self.busy_timeout_s))
            self.wal.open(await anyio.to_thread.run_sync(
                _connect, self.path, self.busy_timeout_s))
        except BaseException as exc:
            self._disconnect_all()
            reason = self._unavailable(exc) if isinstance(exc, Exception) else None
            if reason is not None:   # a file it cannot open or write: an outage
                raise StoreUnavailableError(f"{self.path}: {reason}") from exc
            raise

    async def _background(self, tg: anyio.abc.TaskGroup) -> None:
        tg.start_soon(self.wal.run)

    def _stopping(self) -> None:
        self.wal.stop()

    def _disconnect_all(self) -> None:
        if self._writer is not None:
            self._clean_stop(self._writer)
        for conn in (self.wal.connection, *self._readers, self._writer):   # the writer
            if conn is not None:                                             # last: it
                conn.close()                                                 # checkpoints
        self._writer = self.wal.connection = None
        self._readers.clear()
        self.wal.close()   # after every connection (``WalCheckpoints``)

    def _open_writer(self) -> sqlite3.Connection:
        private_files(self.path)
        conn = _connect(self.path, self.busy_timeout_s)
        self._full = True
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        assert mode.lower() == "wal", mode
        migrate_sqlite(conn)
        conn.execute(_UNSYNCED_RUNS)
        conn.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
        boot = self.boot_id
        rows = conn.execute("SELECT run, boot_id FROM unsynced_runs").fetchall()
        self._earlier_runs = [run for run, _ in rows]
        self.unsynced_loss = any(not earlier or not boot or earlier != boot
                                 for _, earlier in rows)
        if self.unsynced_loss:
            log.warning("%s: the last run stopped without flushing its last session journal "
                        "commits, on another boot: they may be lost (sessions resync)",
                        self.path)
        private_files(self.path)
        info = os.stat(self.path)
        self._file = (info.st_dev, info.st_ino)
        self._wal_file = _identity(f"{self.path}-wal")   # made by the reads above
        return conn

    def settled_earlier_runs(self) -> None:
        """What the earlier runs may have lost is handled (the session journal restored
        under new epochs): this run's clean close deletes their rows too."""
        self._clear_at_close.update(self._earlier_runs)

    def _mark_unsynced(self, conn: sqlite3.Connection) -> None:
        """This run's row, in a FULL commit of its own, before its first NORMAL one."""
        conn.execute("INSERT OR REPLACE INTO unsynced_runs(run, boot_id) VALUES (?, ?)",
                     (self.run, self.boot_id))
        self._marked = True
        self._clear_at_close.add(self.run)

    def _clean_stop(self, conn: sqlite3.Connection) -> None:
        """A clean close: the rows handled are deleted in a FULL commit, which flushes
        every NORMAL commit before it. When it cannot be written the rows stay (the next
        start on another boot resyncs the sessions: safe)."""
        if not self._clear_at_close or self._lost is not None:
            return
        runs = sorted(self._clear_at_close)
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.execute("PRAGMA synchronous=FULL")
            self._full = True
            conn.execute(f"DELETE FROM unsynced_runs WHERE run IN "
                         f"({','.join('?' * len(runs))})", runs)
            self._clear_at_close.clear()
        except (sqlite3.Error, OSError) as exc:
            log.warning("%s: the clean stop could not be recorded (%s)", self.path, exc)

    # -- faults --------------------------------------------------------------------
    def _check_file(self, conn: sqlite3.Connection) -> None:
        """Raises ``StoreUnavailableError`` when the file or its WAL is not the one
        opened (a WAL gone is first copied into the file on ``conn``)."""
        if self._lost is None or self._missing:
            try:
                info = os.stat(self.path)
                same = (info.st_dev, info.st_ino) == self._file
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR):   # unsure: not lost
                    raise StoreUnavailableError(f"{self.path}: {exc.strerror}") from None
                if not self._missing:
                    self._lost, self._missing = (
                        f"the database file {self.path} was deleted or replaced (or its "
                        f"folder moved) while the server ran; put it back, or restore it "
                        f"and restart the server"), True
                    log.error("%s", self._lost)
                raise StoreUnavailableError(self._lost) from None
            if same and self._missing:   # the very file is back under its name
                self._lost, self._missing = None, False
                log.warning("%s is back: the store resumes", self.path)
            elif not same:
                self._lost, self._missing = (f"the database file {self.path} was deleted or "
                                             f"replaced while the server ran; restore it "
                                             f"and restart the server"), False
                log.error("%s", self._lost)
            if self._lost is None and self._wal_file is not None \
                    and _identity(f"{self.path}-wal") != self._wal_file:
                self._lost = self._wal_lost(conn)
                log.error("%s", self._lost)
        if self._lost is not None:
            raise StoreUnavailableError(self._lost)

    def _wal_lost(self, conn: sqlite3.Connection) -> str:
        """The WAL was deleted or replaced: what it holds is copied into the database
        file (which this process still has by its name); why the store is lost."""
        wal = f"{self.path}-wal"
        try:
            busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            saved = "its commits were copied into the database file"
            if busy:
                saved = ("its commits could not all be copied into the database file yet "
                         "(busy): stop the server with SIGTERM, not kill -9")
        except sqlite3.Error as exc:
            saved = (f"its commits could not be copied into the database file ({exc}): "
                     f"stop the server with SIGTERM, not kill -9")
        return (f"the WAL file {wal} was deleted or replaced while the server ran; {saved}; "
                f"restart the server")

    def _unavailable(self, exc: BaseException) -> str | None:
        if isinstance(exc, sqlite3.Error) and not isinstance(exc, _OWN_ERRORS):
            name = getattr(exc, "sqlite_errorname", None)
            return f"SQLite: {exc}" + (f" ({name})" if name else "")
        if isinstance(exc, OSError):
            return f"SQLite: {exc}"
        return None

    def _conflict(self, exc: BaseException) -> bool:
        # a unique key taken meanwhile; not every IntegrityError (a trigger's RAISE is one)
        return isinstance(exc, sqlite3.IntegrityError) and getattr(
            exc, "sqlite_errorname", "") in ("SQLITE_CONSTRAINT_UNIQUE",
                                             "SQLITE_CONSTRAINT_PRIMARYKEY")

    def _before_read(self) -> None:
        if self._lost is not None:
            raise StoreUnavailableError(self._lost)

    async def _ping(self) -> None:
        def check(conn: sqlite3.Connection) -> None:
            self._check_file(conn)
            folder = os.statvfs(os.path.dirname(os.path.abspath(self.path)))
            if folder.f_bavail * folder.f_frsize < MIN_FREE_BYTES:
                raise StoreUnavailableError(f"the disk of {self.path} is full")
            conn.execute("SELECT 1").fetchone()

        await self._read(check)

    # -- the writer ----------------------------------------------------------------
    def _run_batch(self, index: int, batch: list[Op]) -> None:
        """Optimistic first: the whole batch in one transaction with no savepoints (each
        statement is a call that gives up the GIL and must win it back from a busy event
        loop, so fewer statements is lower latency). Only when an operation raises is
        the batch rolled back and run again with a SAVEPOINT per operation."""
        conn = self._writer
        assert conn is not None
        try:
            self._check_file(conn)
            self._synchronous(conn, batch)
            if self._optimistic(conn, batch):
                return
            conn.execute("BEGIN IMMEDIATE")
            for op in batch:
                conn.execute("SAVEPOINT op")
                try:
                    op.result = op.fn(conn, op.events)
                except Exception as exc:   # noqa: BLE001 - handed to the caller
                    conn.execute("ROLLBACK TO op")
                    op.error, op.events = exc, []
                conn.execute("RELEASE op")
            conn.execute("COMMIT")
            self.commits += 1
            self.synced_commits += self._full
            self.wal.committed()
        except Exception as exc:   # noqa: BLE001 - the whole batch failed
            self._rollback(conn)
            for op in batch:
                op.error, op.events = exc, []

    def _synchronous(self, conn: sqlite3.Connection, batch: list[Op]) -> None:
        """FULL when one operation of ``batch`` is durable, else NORMAL (see the module
        docstring); a statement only when it changes."""
        full = any(op.durable for op in batch)
        if not full and not self._marked:
            self._mark_unsynced(conn)   # still FULL: autocommitted and flushed
        if full != self._full:
            conn.execute(f"PRAGMA synchronous={'FULL' if full else 'NORMAL'}")
            self._full = full

    def _optimistic(self, conn: sqlite3.Connection, batch: list[Op]) -> bool:
        """The batch without savepoints; ``False`` (rolled back, operations reset) when
        one of several raised. A lone operation's error is its own: no second run."""
        conn.execute("BEGIN IMMEDIATE")
        for op in batch:
            try:
                op.result = op.fn(conn, op.events)
            except Exception as exc:   # noqa: BLE001 - undone below
                self._rollback(conn)
                for each in batch:
                    each.result, each.events = None, []
                if len(batch) > 1:
                    return False
                op.error = exc
                return True
        conn.execute("COMMIT")
        self.commits += 1
        self.synced_commits += self._full
        self.wal.committed()
        return True

    def _abort(self, index: int) -> None:
        if self._writer is not None:
            self._rollback(self._writer)

    def _rollback(self, conn: sqlite3.Connection) -> None:
        self._queued = None   # recounted when next needed
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass   # SQLite rolls back on its own what it could not keep

    def _moved(self, before: str, after: str) -> None:
        if self._queued is not None:
            self._queued += (after == "queued") - (before == "queued")

    def _step(self, conn: sqlite3.Connection, out: list[CommittedEvent], task_id: str,
              from_states: Sequence[str], to_state: str,
              finish: FinishFactory | Finish | None, now: float) -> Transition | None:
        won = SQL.transition_in(conn, out, task_id, from_states, to_state, finish, now)
        if won is not None:
            self._moved(won.previous, won.task.status)
        return won

    # -- operations ----------------------------------------------------------------
    async def create_task(self, task: NewTask, event0: AnyEvent,
                          idem: IdempotencyClaim | None, *,
                          timeout: float | None = None,
                          max_queued: int | None = None) -> CreateOutcome:
        def op(conn: sqlite3.Connection, out: list[CommittedEvent]) -> CreateOutcome:
            if idem is not None:
                if (found := SQL.replay_key(conn, idem, task.created_at)) is not None:
                    return found
                conn.execute("INSERT INTO idempotency_keys VALUES (?,?,?,?,?)",
                             (idem.scope, idem.key, idem.fingerprint, task.id, idem.expires_at))
            if max_queued is not None:
                if self._queued is None:
                    self._queued = conn.execute(
                        "SELECT COUNT(*) FROM tasks WHERE status = 'queued'").fetchone()[0]
                if self._queued >= max_queued:
                    raise QueueFullError(max_queued, self._queued)
            conn.execute(
                "INSERT INTO tasks(id, response_id, status, on_restart, model, principal, "
                "request, created_at, updated_at, next_seq) VALUES (?,?,?,?,?,?,?,?,?,1)",
                (task.id, task.response_id, "queued", task.on_restart, task.model,
                 task.principal, task.request, task.created_at, task.created_at))
            SQL.insert_events(conn, task.id, 0, [event0], out)
            self._moved("", "queued")
            return CreateOutcome(queued_record(task), replayed=False)

        return await self._write(op, timeout)

    async def get_task(self, task_id: str) -> TaskRecord | None:
        return await self._read(lambda conn: SQL.select_task(conn, task_id))

    async def get_by_response(self, response_id: str) -> TaskRecord | None:
        return await self._read(lambda conn: SQL.select_by_response(conn, response_id))

    async def get_keyed(self, idem: IdempotencyClaim, now: float) -> TaskRecord | None:
        return await self._read(lambda conn: SQL.select_keyed(conn, idem, now))

    async def delete_task(self, task_id: str) -> bool:
        return await self._write(lambda conn, out: SQL.delete_finished(conn, task_id))

    async def list_tasks(self, principal: str | None, *, status: str | None, after: str | None,
                         limit: int, finished_since: float | None = None,
                         after_by_id: bool = False) -> list[TaskRecord]:
        return await self._read(
            lambda conn: SQL.select_page(conn, principal, status, after, limit,
                                           finished_since, after_by_id))

    async def claim(self, now: float, limit: int) -> list[TaskRecord]:
        def op(conn: sqlite3.Connection, out: list[CommittedEvent]) -> list[TaskRecord]:
            claimed = SQL.claim_oldest(conn, now, limit=limit)
            for _ in claimed:
                self._moved("queued", "loading")
            return claimed

        return await self._write(op)

    async def transition(self, task_id: str, from_states: Sequence[str], to_state: str,
                         finish: FinishFactory | Finish | None = None, *,
                         now: float) -> Transition | None:
        return await self._write(lambda conn, out: self._step(
            conn, out, task_id, from_states, to_state, finish, now))

    async def unclaim(self, task_id: str, *, now: float) -> bool:
        def op(conn: sqlite3.Connection, out: list[CommittedEvent]) -> bool:
            won = SQL.transition_in(conn, out, task_id, ("loading",), "queued", None, now,
                                    set_extra=UNCLAIM)
            if won is not None:
                self._moved("loading", "queued")
            return won is not None

        return await self._write(op)

    async def append_events(self, task_id: str, events: Sequence[AnyEvent],
                            while_states: Sequence[str]) -> list[CommittedEvent] | None:
        return await self._write(
            lambda conn, out: SQL.append_in(conn, out, task_id, events, while_states))

    async def request_cancel(self, task_id: str, finish: FinishFactory, *,
                             now: float) -> tuple[TaskRecord | None, bool]:
        def op(conn: sqlite3.Connection, out: list[CommittedEvent]
               ) -> tuple[TaskRecord | None, bool]:
            return cancel_in(lambda states, to, done: self._step(
                conn, out, task_id, states, to, done, now), finish,
                lambda: SQL.select_task(conn, task_id))

        return await self._write(op)

    async def read_events(self, task_id: str, after: int, limit: int) -> list[CommittedEvent]:
        return await self._read(lambda conn: SQL.select_events(conn, task_id, after, limit))

    async def recover(self, factory: RecoveryFactory, *, max_attempts: int,
                      now: float, own: bool = False) -> RecoveryReport:
        def op(conn: sqlite3.Connection, out: list[CommittedEvent]) -> RecoveryReport:
            rows = conn.execute(
                "SELECT id, status, on_restart, attempt FROM tasks WHERE status IN "
                "('loading', 'running', 'cancelling') ORDER BY seq").fetchall()
            return recover_rows(rows, lambda task_id, states, to, done: self._step(
                conn, out, task_id, states, to, done, now), factory, max_attempts)

        return await self._write(op)

    async def purge(self, *, now: float, event_retention: float, task_retention: float,
                    key_ttl: float) -> int:
        return await self._write(lambda conn, out: SQL.purge_tasks(
            conn, now=now, event_retention=event_retention, task_retention=task_retention))

    async def status_counts(self) -> dict[str, int]:
        return await self._read(SQL.select_counts)


def store_path(url: str) -> str:
    """``sqlite:///abs/path`` or ``sqlite://rel/path`` or a bare path → a file path."""
    if url.startswith("sqlite:///"):
        return "/" + url[len("sqlite:///"):].lstrip("/")
    if url.startswith("sqlite://"):
        return url[len("sqlite://"):]
    return url

