"""The SQLite task store: WAL, ``synchronous=FULL``, one writer thread, group commit.

    async with SqliteTaskStore("/var/lib/acp/lmsp.db", on_commit=hub.publish) as store:
        outcome = await store.create_task(new, event0, None)   # fsynced on return

Contracts (see ``acp_server.lmsp.store`` for the interface):

* Writes are *operations* (a function of the connection) sent through a bounded
  memory stream to one writer task, which runs everything queued so far — at most
  ``MAX_BATCH`` — in one ``BEGIN IMMEDIATE … COMMIT`` on one worker thread
  (``CapacityLimiter(1)``): concurrent creates share one transaction and one fsync.
  Each operation runs inside a SAVEPOINT, so one failing operation rolls back alone.
  ``group_commit=False`` commits every operation on its own (the benchmark baseline).
* Callers wake only after the COMMIT; ``on_commit`` gets the batch's events first.
* Reads use separate connections (WAL readers never block the writer).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import msgspec

from acp_server.lmsp.store import (
    COLUMNS,
    STATUS_COUNTS_SQL,
    TERMINAL,
    CommittedEvent,
    CreateOutcome,
    Finish,
    FinishFactory,
    IdempotencyClaim,
    KeyReusedError,
    QueueFullError,
    NewTask,
    delete_statements,
    RecoveryFactory,
    RecoveryReport,
    TaskRecord,
    Transition,
    queued_record,
    list_statement,
    record_from_row,
    purge_statements,
    restart_target,
    moves_of,
)
from acp_server.lmsp.wire import AnyEvent, encode

MAX_BATCH = 256
QUEUE_SIZE = 4096
READERS = 2

SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,      -- creation order
    id TEXT NOT NULL UNIQUE,
    response_id TEXT NOT NULL,
    status TEXT NOT NULL,
    on_restart TEXT NOT NULL,
    model TEXT NOT NULL,
    principal TEXT NOT NULL,
    request BLOB NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    finished_at REAL,
    next_seq INTEGER NOT NULL DEFAULT 0,
    attempt INTEGER NOT NULL DEFAULT 0,
    response BLOB,
    error BLOB,
    events_purged INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS tasks_status ON tasks(status, seq);
CREATE INDEX IF NOT EXISTS tasks_finished ON tasks(finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS tasks_response ON tasks(response_id);
CREATE TABLE IF NOT EXISTS task_events (
    task_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (task_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    task_id TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idem_task ON idempotency_keys(task_id);
"""

def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10)
    conn.execute("PRAGMA busy_timeout=10000")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


@dataclasses.dataclass(eq=False)
class _Op:
    fn: Callable[[sqlite3.Connection], Any]
    done: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    result: Any = None
    error: BaseException | None = None
    events: list[CommittedEvent] = dataclasses.field(default_factory=list)


def _select(conn: sqlite3.Connection, task_id: str) -> TaskRecord | None:
    row = conn.execute(f"SELECT {COLUMNS} FROM tasks WHERE id = ?", (task_id,)).fetchone()
    return None if row is None else record_from_row(row)


def _insert_events(conn: sqlite3.Connection, task_id: str, first_seq: int,
                   events: Sequence[AnyEvent], out: list[CommittedEvent]) -> None:
    rows = []
    for offset, draft in enumerate(events):
        seq = first_seq + offset
        data = encode(msgspec.structs.replace(draft, sequence_number=seq))
        rows.append((task_id, seq, draft.type, data))
        out.append(CommittedEvent(task_id, seq, draft.type, data))
    conn.executemany("INSERT INTO task_events(task_id, seq, type, data) VALUES (?,?,?,?)", rows)


def _transition(conn: sqlite3.Connection, out: list[CommittedEvent], task_id: str,
                from_states: Sequence[str], to_state: str,
                finish: FinishFactory | Finish | None, now: float) -> Transition | None:
    """One conditional UPDATE; its events in the same transaction. ``None`` = lost."""
    current = _select(conn, task_id)
    if current is None or current.status not in from_states:
        return None
    done = finish(current) if callable(finish) else (finish or Finish())
    marks = ",".join("?" * len(from_states))
    terminal = to_state in TERMINAL
    row = conn.execute(
        f"UPDATE tasks SET status = ?, updated_at = ?, next_seq = next_seq + ?, "
        f"finished_at = CASE WHEN ? THEN ? ELSE finished_at END, "
        f"response = COALESCE(?, response), error = COALESCE(?, error) "
        f"WHERE id = ? AND status IN ({marks}) RETURNING {COLUMNS}",
        (to_state, now, len(done.events), terminal, now, done.response, done.error, task_id,
         *from_states)).fetchone()
    if row is None:
        return None
    record = record_from_row(row)
    events: list[CommittedEvent] = []
    _insert_events(conn, task_id, record.next_seq - len(done.events), done.events, events)
    out.extend(events)
    return Transition(record, events, current.status)


class SqliteTaskStore:
    """See the module docstring. ``path`` is a file path (``sqlite:///`` stripped)."""

    def __init__(self, path: str, *, on_commit: Callable[[list[CommittedEvent]], None]
                 | None = None, group_commit: bool = True) -> None:
        self.path = store_path(path)
        self.on_commit = on_commit
        self.on_transition: Callable[[str], None] | None = None
        self.group_commit = group_commit
        self.commits = 0        # transactions committed (for the benchmark and tests)
        self._writer: sqlite3.Connection | None = None
        self._readers: deque[sqlite3.Connection] = deque()
        self._write_limiter = anyio.CapacityLimiter(1)
        self._read_limiter = anyio.CapacityLimiter(READERS)
        self._send, self._receive = anyio.create_memory_object_stream[_Op](QUEUE_SIZE)
        self._tg: anyio.abc.TaskGroup | None = None
        # Queued tasks, kept by the writer thread (for ``max_queued`` without a COUNT
        # per create); ``None`` = unknown, recounted when next needed.
        self._queued: int | None = None

    # -- lifecycle -----------------------------------------------------------------
    async def __aenter__(self) -> SqliteTaskStore:
        self._writer = await anyio.to_thread.run_sync(self._open_writer)
        for _ in range(READERS):
            self._readers.append(await anyio.to_thread.run_sync(_connect, self.path))
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._write_loop)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._tg is not None
        self._send.close()          # the loop drains what is queued, then ends
        await self._tg.__aexit__(None, None, None)
        for conn in (self._writer, *self._readers):
            if conn is not None:
                conn.close()

    def _open_writer(self) -> sqlite3.Connection:
        conn = _connect(self.path)
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        assert mode.lower() == "wal", mode
        conn.executescript(SCHEMA)
        return conn

    # -- the writer ----------------------------------------------------------------
    async def _write_loop(self) -> None:
        async with self._receive:
            async for first in self._receive:
                batch = [first]
                while self.group_commit and len(batch) < MAX_BATCH:
                    try:
                        batch.append(self._receive.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self._run_batch, batch,
                                                   limiter=self._write_limiter)
                if self.on_commit is not None:
                    for op in batch:
                        if op.error is None and op.events:
                            self.on_commit(op.events)
                for op in batch:
                    op.done.set()

    def _run_batch(self, batch: list[_Op]) -> None:
        conn = self._writer
        assert conn is not None
        try:
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
        except Exception as exc:   # noqa: BLE001 - the whole batch failed
            self._queued = None
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for op in batch:
                op.error, op.events = exc, []

    async def _write(self, fn: Callable[..., Any], timeout: float | None = None) -> Any:
        op = _Op(fn)
        with anyio.move_on_after(timeout, shield=True) as scope:
            await self._send.send(op)
            await op.done.wait()   # shielded: the write happens anyway, see it through
        if scope.cancelled_caught:
            raise TimeoutError("the store did not commit in time")
        if op.error is not None:
            raise op.error
        if self.on_transition is not None:
            for status in moves_of(op.result):
                self.on_transition(status)
        return op.result

    async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        async with self._read_limiter:
            conn = self._readers.popleft()
            try:
                return await anyio.to_thread.run_sync(fn, conn)
            finally:
                self._readers.append(conn)

    # -- operations ----------------------------------------------------------------
    async def create_task(self, task: NewTask, event0: AnyEvent,
                          idem: IdempotencyClaim | None, *,
                          timeout: float | None = None,
                          max_queued: int | None = None) -> CreateOutcome:
        def op(conn: sqlite3.Connection, out: list[CommittedEvent]) -> CreateOutcome:
            if idem is not None:
                row = conn.execute(
                    "SELECT fingerprint, task_id, expires_at FROM idempotency_keys "
                    "WHERE scope = ? AND key = ?", (idem.scope, idem.key)).fetchone()
                existing = _select(conn, row[1]) if row is not None else None
                if row is not None and existing is not None and row[2] > task.created_at:
                    if row[0] != idem.fingerprint:
                        raise KeyReusedError(idem.key)
                    return CreateOutcome(existing, replayed=True)
                if row is not None:
                    conn.execute("DELETE FROM idempotency_keys WHERE scope = ? AND key = ?",
                                 (idem.scope, idem.key))
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
            _insert_events(conn, task.id, 0, [event0], out)
            self._moved("", "queued")
            return CreateOutcome(queued_record(task), replayed=False)

        return await self._write(op, timeout)  # type: ignore[no-any-return]

    async def get_task(self, task_id: str) -> TaskRecord | None:
        return await self._read(lambda conn: _select(conn, task_id))  # type: ignore[no-any-return]

    async def get_by_response(self, response_id: str) -> TaskRecord | None:
        def fn(conn: sqlite3.Connection) -> TaskRecord | None:
            row = conn.execute(f"SELECT {COLUMNS} FROM tasks WHERE response_id = ?",
                               (response_id,)).fetchone()
            return None if row is None else record_from_row(row)

        return await self._read(fn)  # type: ignore[no-any-return]

    async def delete_task(self, task_id: str) -> bool:
        def op(conn: sqlite3.Connection, out: list[CommittedEvent]) -> bool:
            statements = delete_statements("?", task_id)
            if conn.execute(*statements[0]).rowcount == 0:
                return False
            for sql, params in statements[1:]:
                conn.execute(sql, params)
            return True

        return await self._write(op)  # type: ignore[no-any-return]

    async def list_tasks(self, principal: str, *, status: str | None, after: str | None,
                         limit: int) -> list[TaskRecord]:
        sql, params = list_statement("?", principal=principal, status=status, after=after,
                                     limit=limit)
        return await self._read(  # type: ignore[no-any-return]
            lambda conn: [record_from_row(r) for r in conn.execute(sql, params).fetchall()])

    async def claim_next(self, now: float) -> TaskRecord | None:
        def op(conn: sqlite3.Connection, out: list[CommittedEvent]) -> TaskRecord | None:
            row = conn.execute(
                f"UPDATE tasks SET status = 'loading', attempt = attempt + 1, updated_at = ? "
                f"WHERE seq = (SELECT seq FROM tasks WHERE status = 'queued' ORDER BY seq "
                f"LIMIT 1) AND status = 'queued' RETURNING {COLUMNS}", (now,)).fetchone()
            if row is None:
                return None
            self._moved("queued", "loading")
            return record_from_row(row)

        return await self._write(op)  # type: ignore[no-any-return]

    async def transition(self, task_id: str, from_states: Sequence[str], to_state: str,
                         finish: FinishFactory | Finish | None = None, *,
                         now: float) -> Transition | None:
        return await self._write(  # type: ignore[no-any-return]
            lambda conn, out: self._counted(_transition(conn, out, task_id, from_states,
                                                        to_state, finish, now)))

    def _moved(self, before: str, after: str) -> None:
        if self._queued is not None:
            self._queued += (after == "queued") - (before == "queued")

    def _counted(self, won: Transition | None) -> Transition | None:
        if won is not None:
            self._moved(won.previous, won.task.status)
        return won

    async def append_events(self, task_id: str, events: Sequence[AnyEvent],
                            while_states: Sequence[str]) -> list[CommittedEvent] | None:
        def op(conn: sqlite3.Connection, out: list[CommittedEvent]
               ) -> list[CommittedEvent] | None:
            marks = ",".join("?" * len(while_states))
            row = conn.execute(
                f"UPDATE tasks SET next_seq = next_seq + ? WHERE id = ? AND status IN ({marks}) "
                f"RETURNING next_seq", (len(events), task_id, *while_states)).fetchone()
            if row is None:
                return None
            _insert_events(conn, task_id, row[0] - len(events), events, out)
            return list(out)

        return await self._write(op)  # type: ignore[no-any-return]

    async def request_cancel(self, task_id: str, finish: FinishFactory, *,
                             now: float) -> tuple[TaskRecord | None, bool]:
        def op(conn: sqlite3.Connection, out: list[CommittedEvent]
               ) -> tuple[TaskRecord | None, bool]:
            won = self._counted(_transition(conn, out, task_id, ("queued",), "cancelled",
                                            finish, now))
            if won is None:
                won = _transition(conn, out, task_id, ("loading", "running"), "cancelling",
                                  None, now)
            if won is not None:
                return won.task, True
            return _select(conn, task_id), False

        return await self._write(op)  # type: ignore[no-any-return]

    async def read_events(self, task_id: str, after: int, limit: int) -> list[CommittedEvent]:
        def fn(conn: sqlite3.Connection) -> list[CommittedEvent]:
            rows = conn.execute(
                "SELECT seq, type, data FROM task_events WHERE task_id = ? AND seq > ? "
                "ORDER BY seq LIMIT ?", (task_id, after, limit)).fetchall()
            return [CommittedEvent(task_id, r[0], r[1], bytes(r[2])) for r in rows]

        return await self._read(fn)  # type: ignore[no-any-return]

    async def recover(self, factory: RecoveryFactory, *, max_attempts: int,
                      now: float, own: bool = False) -> RecoveryReport:
        def op(conn: sqlite3.Connection, out: list[CommittedEvent]) -> RecoveryReport:
            ids = conn.execute(
                "SELECT id, status, on_restart, attempt FROM tasks WHERE status IN "
                "('loading', 'running', 'cancelling') ORDER BY seq").fetchall()
            counts = {"failed": 0, "queued": 0, "cancelled": 0}
            for task_id, status, policy, attempt in ids:
                target = restart_target(status, policy, attempt, max_attempts)
                finish = None if target == "queued" else (lambda rec, t=target: factory(rec, t))
                if self._counted(_transition(conn, out, task_id, (status,), target, finish,
                                             now)) is not None:
                    counts[target] += 1
            return RecoveryReport(failed=counts["failed"], requeued=counts["queued"],
                                  cancelled=counts["cancelled"])

        return await self._write(op)  # type: ignore[no-any-return]

    async def purge(self, *, now: float, event_retention: float, task_retention: float,
                    key_ttl: float) -> int:
        def op(conn: sqlite3.Connection, out: list[CommittedEvent]) -> int:
            counts = [conn.execute(sql, params).rowcount for sql, params in purge_statements(
                "?", now=now, event_retention=event_retention, task_retention=task_retention)]
            return counts[0] + counts[-1]

        return await self._write(op)  # type: ignore[no-any-return]

    async def status_counts(self) -> dict[str, int]:
        return await self._read(  # type: ignore[no-any-return]
            lambda conn: dict(conn.execute(STATUS_COUNTS_SQL).fetchall()))


def store_path(url: str) -> str:
    """``sqlite:///abs/path`` or ``sqlite://rel/path`` or a bare path → a file path."""
    if url.startswith("sqlite:///"):
        return "/" + url[len("sqlite:///"):].lstrip("/")
    if url.startswith("sqlite://"):
        return url[len("sqlite://"):]
    return url

