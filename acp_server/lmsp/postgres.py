"""The PostgreSQL task store: several server instances share one database.

    store = PostgresTaskStore("postgresql://acp@db/acp", on_commit=hub.publish,
                              lease_s=30, renew_s=10)
    async with store:
        outcome = await store.create_task(new, event0, None)   # committed (WAL fsynced)
        claimed = await store.claim_next(time.time())          # FOR UPDATE SKIP LOCKED

Contracts (besides those of ``acp_server.lmsp.store``):

* psycopg 3's *synchronous* API on anyio worker threads (asyncio and trio alike):
  ``writers`` writer loops (default 1) drain one bounded queue of operations and run
  each batch in one transaction (SAVEPOINT per operation, like SQLite's group commit;
  the batch's plain creates share one multi-row INSERT); reads use a small pool of
  autocommit connections. An operation that lost a deadlock or a
  serialization race is rolled back alone and re-run in a later transaction.
* The schema (``pg_schema``) is created and migrated at start-up under an advisory
  lock; the applied versions are in ``schema_version``. The ``max_queued`` check
  takes a transaction advisory lock, so the limit holds across writers and instances.
* Ownership: a claim sets ``owner`` (this store's ``instance``) and a lease of
  ``lease_s`` seconds on the database clock; ``renew_leases`` extends every lease of
  this instance. Runner transitions and deltas are also conditional on
  ``owner IS NULL OR owner = instance``: an instance that lost its lease writes nothing.
  ``recover`` (start-up, and periodically by the service) applies ``on_restart`` to
  tasks whose lease expired, whoever owned them. Closing the store expires this
  instance's leases, so another instance (or the next start) recovers at once. With
  a state directory the instance id is stable across restarts (``identity.py``), so
  start-up recovery also takes this instance's own tasks after a crash, at once.
* Cross-instance wake-ups: each transaction NOTIFYs ``lmsp_<schema>`` with
  ``kind:instance:task`` (``e`` events, ``q`` new queued work, ``c`` cancel requested);
  ``on_notify(kind, task_id)`` gets the other instances' notices in the event loop.
  They are hints only: readers always re-read by sequence number, and the service
  polls every ``poll_s`` as a fallback.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import msgspec
import psycopg
from psycopg import errors as pg_errors

from acp_server.lmsp.identity import claim_identity
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
    NewTask,
    QueueFullError,
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
from acp_server.lmsp.pg_schema import (
    MIGRATIONS,
    Conn,
    delete_finished,
    insert_events,
    migrate,
    queued_count,
    select_by_response,
    select_task,
)
from acp_server.lmsp.wire import AnyEvent, encode

__all__ = ["MIGRATIONS", "PostgresTaskStore", "is_postgres_url"]
log = logging.getLogger("acp_server.lmsp")

MAX_BATCH = 256
QUEUE_SIZE = 4096
WRITERS = 1   # measured: one writer batches more than two contend (GIL, locks)
READERS = 4
RETRIES = 5
ACTIVE = ("loading", "running", "cancelling")
NOW = "extract(epoch FROM clock_timestamp())"   # the database clock, seconds
TRANSIENT = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure,
             pg_errors.LockNotAvailable)


@dataclasses.dataclass(eq=False)
class _Op:
    fn: Callable[[Conn, list[CommittedEvent], _Batch], Any]
    done: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    result: Any = None
    error: BaseException | None = None
    events: list[CommittedEvent] = dataclasses.field(default_factory=list)
    # A create without idempotency key (task, event 0, max_queued): it may join the
    # batch's one multi-row INSERT (``_bulk_creates``) instead of running ``fn``.
    bulk: tuple[NewTask, AnyEvent, int | None] | None = None


@dataclasses.dataclass
class _Batch:
    """Per-transaction state: the queued count (once) and the notices to send."""

    queued: int | None = None
    notices: set[str] = dataclasses.field(default_factory=set)


class PostgresTaskStore:
    """See the module docstring. ``url``: a libpq URL (``postgresql://…``; add
    ``?options=-csearch_path%3Dname`` for a schema other than ``public``)."""

    shared = True   # several instances: the service runs leases, sweeps and polling

    def __init__(self, url: str, *, on_commit: Callable[[list[CommittedEvent]], None]
                 | None = None, group_commit: bool = True, lease_s: float = 30,
                 renew_s: float = 10, poll_s: float = 1.0, writers: int = WRITERS,
                 state_dir: str | None = None) -> None:
        self.url = url
        self.on_commit = on_commit
        self.on_transition: Callable[[str], None] | None = None
        self.on_notify: Callable[[str, str], None] | None = None
        self.group_commit = group_commit
        self.lease_s, self.renew_s, self.poll_s = lease_s, renew_s, poll_s
        self.writers = writers
        # Stable across restarts with a state dir (identity.py): own tasks recovered at once.
        self._identity = claim_identity(state_dir, url) if state_dir else None
        self.instance = self._identity.instance if self._identity else secrets.token_hex(6)
        self.commits = 0
        self.channel = "lmsp"
        self._writers: list[Conn] = []
        self._readers: deque[Conn] = deque()
        self._read_limiter = anyio.CapacityLimiter(READERS)
        self._thread_limiter = anyio.CapacityLimiter(writers + 1)   # writers + listener
        self._send, self._receive = anyio.create_memory_object_stream[_Op](QUEUE_SIZE)
        self._tg: anyio.abc.TaskGroup | None = None
        self._stop = threading.Event()
        self._listening = threading.Event()

    # -- lifecycle -----------------------------------------------------------------
    async def __aenter__(self) -> PostgresTaskStore:
        first = await anyio.to_thread.run_sync(self._connect)
        try:
            await anyio.to_thread.run_sync(migrate, first)
            row = await anyio.to_thread.run_sync(
                lambda: first.execute("SELECT current_schema()").fetchone())
            self.channel = f"lmsp_{row[0] if row else 'public'}"[:63]
            self._writers.append(first)
            for _ in range(self.writers - 1):
                self._writers.append(await anyio.to_thread.run_sync(self._connect))
            for _ in range(READERS):
                self._readers.append(await anyio.to_thread.run_sync(self._connect, True))
        except BaseException:
            self._close_all()
            if self._identity is not None:
                self._identity.release()
            raise
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        for index in range(self.writers):
            self._tg.start_soon(self._write_loop, index)
        self._tg.start_soon(self._listen)
        # notices committed after start-up reach us (unless LISTEN fails: polling then)
        await anyio.to_thread.run_sync(self._listening.wait, 10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._tg is not None
        with anyio.CancelScope(shield=True):
            try:
                await self.release_leases()
            except Exception:   # noqa: BLE001 - the leases then expire on their own
                log.warning("could not release the leases of %s", self.instance)
        self._send.close()       # the writers drain what is queued, then end
        self._stop.set()         # the listener ends within its poll timeout
        try:
            await self._tg.__aexit__(None, None, None)
        finally:
            self._close_all()
            if self._identity is not None:
                self._identity.release()

    def _connect(self, autocommit: bool = False) -> Conn:
        conn = psycopg.connect(self.url, autocommit=autocommit)
        conn.execute("SET synchronous_commit = on")   # durable on COMMIT, whatever the default
        if not autocommit:
            conn.commit()
        return conn

    def _close_all(self) -> None:
        for conn in (*self._writers, *self._readers):
            conn.close()

    # -- the writers ---------------------------------------------------------------
    async def _write_loop(self, index: int) -> None:
        async for first in self._receive:   # shared by the writers; ends when closed
            batch = [first]
            while self.group_commit and len(batch) < MAX_BATCH:
                try:
                    batch.append(self._receive.receive_nowait())
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._run_batch, index, batch,
                                               limiter=self._thread_limiter)
            if self.on_commit is not None:
                for op in batch:
                    if op.error is None and op.events:
                        self.on_commit(op.events)
            for op in batch:
                op.done.set()

    def _run_batch(self, index: int, batch: list[_Op]) -> None:
        """Runs in a worker thread. Transient losers re-run in a following transaction."""
        pending = batch
        for attempt in range(RETRIES):
            pending = self._transaction(index, pending, last=attempt == RETRIES - 1)
            if not pending:
                return

    def _transaction(self, index: int, batch: list[_Op], *, last: bool) -> list[_Op]:
        conn = self._writers[index]
        if conn.closed or conn.broken:
            try:
                conn = self._writers[index] = self._connect()
            except psycopg.Error as exc:
                for op in batch:
                    op.error, op.events = exc, []
                return []
        state = _Batch()
        retry: list[_Op] = []
        try:
            # One savepoint per operation; between two operations RELEASE + SAVEPOINT go
            # in one round trip, and ROLLBACK TO keeps the savepoint for the next one.
            conn.execute("SAVEPOINT op")
            rest = self._bulk_creates(conn, batch, state)
            for i, op in enumerate(rest):
                try:
                    op.result = op.fn(conn, op.events, state)
                except TRANSIENT as exc:
                    conn.execute("ROLLBACK TO SAVEPOINT op")
                    op.events = []
                    if last:
                        op.error = exc
                    else:
                        retry.append(op)
                except Exception as exc:   # noqa: BLE001 - handed to the caller
                    conn.execute("ROLLBACK TO SAVEPOINT op")
                    op.error, op.events = exc, []
                else:
                    if i < len(rest) - 1:
                        conn.execute("RELEASE SAVEPOINT op; SAVEPOINT op")
            for notice in sorted(state.notices):
                conn.execute("SELECT pg_notify(%s, %s)", (self.channel, notice))
            conn.commit()
            self.commits += 1
        except Exception as exc:   # noqa: BLE001 - the whole batch failed (bulk creates too)
            try:
                conn.rollback()
            except psycopg.Error:
                pass
            for op in batch:
                op.result, op.error, op.events = None, exc, []
            return []
        return retry

    def _bulk_creates(self, conn: Conn, batch: list[_Op], state: _Batch) -> list[_Op]:
        """The batch's plain creates in one statement (one round trip for all, not two
        each); returns the operations left to run. On any error, or when the queue
        limit could be reached, none is done here: each then runs on its own."""
        plain = [op for op in batch if op.bulk is not None]
        if len(plain) < 2:
            return batch
        limits = [op.bulk[2] for op in plain if op.bulk is not None and op.bulk[2] is not None]
        if limits:
            state.queued = queued_count(conn)
            if state.queued + len(plain) > min(limits):
                return batch
        tasks = [op.bulk[0] for op in plain if op.bulk is not None]
        types = [op.bulk[1].type for op in plain if op.bulk is not None]
        datas = [encode(msgspec.structs.replace(op.bulk[1], sequence_number=0))
                 for op in plain if op.bulk is not None]
        ids = [t.id for t in tasks]
        try:
            conn.execute(
                "WITH task AS (INSERT INTO tasks(id, response_id, status, on_restart, model, "
                "principal, request, created_at, updated_at, next_seq) SELECT i, r, 'queued', "
                "o, m, p, q, c, c, 1 FROM unnest(%s::text[], %s::text[], %s::text[], "
                "%s::text[], %s::text[], %s::bytea[], %s::float8[]) AS t(i, r, o, m, p, q, c)) "
                "INSERT INTO task_events(task_id, seq, type, data) "
                "SELECT unnest(%s::text[]), 0, unnest(%s::text[]), unnest(%s::bytea[])",
                (ids, [t.response_id for t in tasks], [t.on_restart for t in tasks],
                 [t.model for t in tasks], [t.principal for t in tasks],
                 [t.request for t in tasks], [t.created_at for t in tasks],
                 ids, types, datas))
        except psycopg.Error:
            conn.execute("ROLLBACK TO SAVEPOINT op")
            state.queued = None
            return batch
        conn.execute("RELEASE SAVEPOINT op; SAVEPOINT op")
        for op, task, kind, data in zip(plain, tasks, types, datas):
            op.events.append(CommittedEvent(task.id, 0, kind, data))
            op.result = CreateOutcome(queued_record(task), replayed=False)
        if state.queued is not None:
            state.queued += len(plain)
        self._notice(state, "q")
        return [op for op in batch if op.bulk is None]

    async def _write(self, fn: Callable[[Conn, list[CommittedEvent], _Batch], Any],
                     timeout: float | None = None,
                     bulk: tuple[NewTask, AnyEvent, int | None] | None = None) -> Any:
        op = _Op(fn, bulk=bulk)
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

    async def _read(self, fn: Callable[[Conn], Any]) -> Any:
        async with self._read_limiter:
            conn = self._readers.popleft()
            try:
                if conn.closed or conn.broken:
                    conn = await anyio.to_thread.run_sync(self._connect, True)
                return await anyio.to_thread.run_sync(fn, conn)
            finally:
                self._readers.append(conn)

    def _notice(self, state: _Batch, kind: str, task_id: str = "") -> None:
        state.notices.add(f"{kind}:{self.instance}:{task_id}")

    # -- cross-instance notices ----------------------------------------------------
    async def _listen(self) -> None:
        await anyio.to_thread.run_sync(self._listen_thread, limiter=self._thread_limiter)

    def _listen_thread(self) -> None:
        """LISTEN on a dedicated connection until the store closes; reconnects (the
        service's polling covers notices lost meanwhile)."""
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True) as conn:
                    conn.execute(f'LISTEN "{self.channel}"')
                    self._listening.set()
                    while not self._stop.is_set():   # each notice as soon as it arrives
                        for notice in conn.notifies(timeout=0.2):
                            anyio.from_thread.run_sync(self._deliver, notice.payload)
            except psycopg.Error:
                log.warning("LISTEN connection lost; reconnecting", exc_info=True)
                self._stop.wait(1.0)

    def _deliver(self, payload: str) -> None:
        kind, _, rest = payload.partition(":")
        instance, _, task_id = rest.partition(":")
        if self.on_notify is not None and instance != self.instance:
            self.on_notify(kind, task_id)

    # -- operations ----------------------------------------------------------------
    async def create_task(self, task: NewTask, event0: AnyEvent,
                          idem: IdempotencyClaim | None, *,
                          timeout: float | None = None,
                          max_queued: int | None = None) -> CreateOutcome:
        def replay(conn: Conn) -> CreateOutcome | None:
            assert idem is not None
            row = conn.execute("SELECT fingerprint, task_id, expires_at FROM idempotency_keys "
                               "WHERE scope = %s AND key = %s FOR UPDATE",
                               (idem.scope, idem.key)).fetchone()
            existing = select_task(conn, row[1]) if row is not None else None
            if row is not None and existing is not None and row[2] > task.created_at:
                if row[0] != idem.fingerprint:
                    raise KeyReusedError(idem.key)
                return CreateOutcome(existing, replayed=True)
            if row is not None:
                conn.execute("DELETE FROM idempotency_keys WHERE scope = %s AND key = %s",
                             (idem.scope, idem.key))
            return None

        def op(conn: Conn, out: list[CommittedEvent], state: _Batch) -> CreateOutcome:
            if idem is not None:
                if (found := replay(conn)) is not None:
                    return found
                # waits for a concurrent insert of the key (any instance) to end
                inserted = conn.execute(
                    "INSERT INTO idempotency_keys VALUES (%s, %s, %s, %s, %s) "
                    "ON CONFLICT (scope, key) DO NOTHING RETURNING 1",
                    (idem.scope, idem.key, idem.fingerprint, task.id,
                     idem.expires_at)).fetchone()
                if inserted is None:   # another instance committed it first
                    found = replay(conn)
                    if found is None:
                        raise pg_errors.SerializationFailure("idempotency key churn")
                    return found
            if max_queued is not None:
                if state.queued is None:
                    state.queued = queued_count(conn)
                if state.queued >= max_queued:
                    raise QueueFullError(max_queued, state.queued)
                state.queued += 1
            data = encode(msgspec.structs.replace(event0, sequence_number=0))
            conn.execute(   # the row and event 0 in one statement
                "WITH task AS (INSERT INTO tasks(id, response_id, status, on_restart, model, "
                "principal, request, created_at, updated_at, next_seq) "
                "VALUES (%s, %s, 'queued', %s, %s, %s, %s, %s, %s, 1)) "
                "INSERT INTO task_events(task_id, seq, type, data) VALUES (%s, 0, %s, %s)",
                (task.id, task.response_id, task.on_restart, task.model, task.principal,
                 task.request, task.created_at, task.created_at, task.id, event0.type, data))
            out.append(CommittedEvent(task.id, 0, event0.type, data))
            self._notice(state, "q")
            return CreateOutcome(queued_record(task), replayed=False)

        bulk = (task, event0, max_queued) if idem is None else None
        return await self._write(op, timeout, bulk)  # type: ignore[no-any-return]

    async def get_task(self, task_id: str) -> TaskRecord | None:
        return await self._read(  # type: ignore[no-any-return]
            lambda conn: select_task(conn, task_id))

    async def get_by_response(self, response_id: str) -> TaskRecord | None:
        return await self._read(  # type: ignore[no-any-return]
            lambda conn: select_by_response(conn, response_id))

    async def delete_task(self, task_id: str) -> bool:
        def op(conn: Conn, out: list[CommittedEvent], state: _Batch) -> bool:
            deleted = delete_finished(conn, task_id)
            if deleted:
                self._notice(state, "e", task_id)   # watchers re-read: the task is gone
            return deleted

        return await self._write(op)  # type: ignore[no-any-return]

    async def list_tasks(self, principal: str, *, status: str | None, after: str | None,
                         limit: int) -> list[TaskRecord]:
        sql, params = list_statement("%s", principal=principal, status=status, after=after,
                                     limit=limit)
        return await self._read(  # type: ignore[no-any-return]
            lambda conn: [record_from_row(r) for r in conn.execute(sql, params).fetchall()])

    async def claim_next(self, now: float) -> TaskRecord | None:
        def op(conn: Conn, out: list[CommittedEvent], state: _Batch) -> TaskRecord | None:
            row = conn.execute(
                f"UPDATE tasks SET status = 'loading', attempt = attempt + 1, updated_at = %s, "
                f"owner = %s, lease_expires_at = {NOW} + %s "
                f"WHERE seq = (SELECT seq FROM tasks WHERE status = 'queued' ORDER BY seq "
                f"LIMIT 1 FOR UPDATE SKIP LOCKED) AND status = 'queued' RETURNING {COLUMNS}",
                (now, self.instance, self.lease_s)).fetchone()
            return None if row is None else record_from_row(row)

        return await self._write(op)  # type: ignore[no-any-return]

    def _transition(self, conn: Conn, out: list[CommittedEvent], state: _Batch, task_id: str,
                    from_states: Sequence[str], to_state: str,
                    finish: FinishFactory | Finish | None, now: float, *,
                    owned: bool = True, expired: bool = False) -> Transition | None:
        """One conditional UPDATE (row locked first so ``finish`` sees what it updates);
        its events and notice in the same transaction. ``None`` = another commit won."""
        current = select_task(conn, task_id, lock=True)
        if current is None or current.status not in from_states:
            return None
        done = finish(current) if callable(finish) else (finish or Finish())
        terminal = to_state in TERMINAL
        requeue = to_state == "queued"
        where = "id = %s AND status = ANY(%s)"
        args: list[Any] = [task_id, list(from_states)]
        if owned:
            where += " AND (owner IS NULL OR owner = %s)"
            args.append(self.instance)
        if expired:
            where += f" AND lease_expires_at < {NOW}"
        row = conn.execute(
            f"UPDATE tasks SET status = %s, updated_at = %s, next_seq = next_seq + %s, "
            f"finished_at = CASE WHEN %s THEN %s ELSE finished_at END, "
            f"response = COALESCE(%s, response), error = COALESCE(%s, error), "
            f"owner = CASE WHEN %s THEN NULL ELSE owner END, "
            f"lease_expires_at = CASE WHEN %s THEN NULL ELSE lease_expires_at END "
            f"WHERE {where} RETURNING {COLUMNS}",
            (to_state, now, len(done.events), terminal, now, done.response, done.error,
             requeue, requeue or terminal, *args)).fetchone()
        if row is None:
            return None
        record = record_from_row(row)
        events: list[CommittedEvent] = []
        insert_events(conn, task_id, record.next_seq - len(done.events), done.events, events)
        out.extend(events)
        if events:
            self._notice(state, "e", task_id)
        if requeue:
            self._notice(state, "q")
        if to_state == "cancelling":
            self._notice(state, "c", task_id)
        return Transition(record, events, current.status)

    async def transition(self, task_id: str, from_states: Sequence[str], to_state: str,
                         finish: FinishFactory | Finish | None = None, *,
                         now: float) -> Transition | None:
        return await self._write(  # type: ignore[no-any-return]
            lambda conn, out, state: self._transition(conn, out, state, task_id, from_states,
                                                      to_state, finish, now))

    async def append_events(self, task_id: str, events: Sequence[AnyEvent],
                            while_states: Sequence[str]) -> list[CommittedEvent] | None:
        def op(conn: Conn, out: list[CommittedEvent], state: _Batch
               ) -> list[CommittedEvent] | None:
            row = conn.execute(
                "UPDATE tasks SET next_seq = next_seq + %s WHERE id = %s AND status = ANY(%s) "
                "AND (owner IS NULL OR owner = %s) RETURNING next_seq",
                (len(events), task_id, list(while_states), self.instance)).fetchone()
            if row is None:
                return None
            insert_events(conn, task_id, row[0] - len(events), events, out)
            self._notice(state, "e", task_id)
            return list(out)

        return await self._write(op)  # type: ignore[no-any-return]

    async def request_cancel(self, task_id: str, finish: FinishFactory, *,
                             now: float) -> tuple[TaskRecord | None, bool]:
        def op(conn: Conn, out: list[CommittedEvent], state: _Batch
               ) -> tuple[TaskRecord | None, bool]:
            won = self._transition(conn, out, state, task_id, ("queued",), "cancelled",
                                   finish, now, owned=False)
            if won is None:   # any instance may ask; the owner finishes it
                won = self._transition(conn, out, state, task_id, ("loading", "running"),
                                       "cancelling", None, now, owned=False)
            if won is not None:
                return won.task, True
            return select_task(conn, task_id), False

        return await self._write(op)  # type: ignore[no-any-return]

    async def read_events(self, task_id: str, after: int, limit: int) -> list[CommittedEvent]:
        def fn(conn: Conn) -> list[CommittedEvent]:
            rows = conn.execute(
                "SELECT seq, type, data FROM task_events WHERE task_id = %s AND seq > %s "
                "ORDER BY seq LIMIT %s", (task_id, after, limit)).fetchall()
            return [CommittedEvent(task_id, r[0], r[1], bytes(r[2])) for r in rows]

        return await self._read(fn)  # type: ignore[no-any-return]

    # -- leases and recovery -------------------------------------------------------
    async def renew_leases(self) -> tuple[set[str], set[str]]:
        """Extends this instance's leases: ``(owned ids, of which cancelling)``."""
        def op(conn: Conn, out: list[CommittedEvent], state: _Batch
               ) -> tuple[set[str], set[str]]:
            rows = conn.execute(
                f"UPDATE tasks SET lease_expires_at = {NOW} + %s WHERE owner = %s "
                f"AND status = ANY(%s) RETURNING id, status",
                (self.lease_s, self.instance, list(ACTIVE))).fetchall()
            return {r[0] for r in rows}, {r[0] for r in rows if r[1] == "cancelling"}

        return await self._write(op)  # type: ignore[no-any-return]

    def _release_op(self, conn: Conn, out: list[CommittedEvent], state: _Batch) -> None:
        conn.execute(f"UPDATE tasks SET lease_expires_at = {NOW} - 1 WHERE owner = %s "
                     f"AND status = ANY(%s)", (self.instance, list(ACTIVE)))

    async def release_leases(self) -> None:
        """Expire this instance's leases now (closing does it; tests use it to play a
        crash without waiting ``lease_s``)."""
        await self._write(self._release_op)

    async def recover(self, factory: RecoveryFactory, *, max_attempts: int,
                      now: float, own: bool = False) -> RecoveryReport:
        """Every active task whose lease expired (any instance's), and at start-up every
        task this instance owned (its previous run died), per its ``on_restart``."""
        def op(conn: Conn, out: list[CommittedEvent], state: _Batch) -> RecoveryReport:
            rows = conn.execute(
                f"SELECT id, status, on_restart, attempt FROM tasks WHERE status = ANY(%s) "
                f"AND (lease_expires_at IS NULL OR lease_expires_at < {NOW} OR owner = %s) "
                f"ORDER BY seq FOR UPDATE SKIP LOCKED",
                (list(ACTIVE), mine)).fetchall()
            counts = {"failed": 0, "queued": 0, "cancelled": 0}
            for task_id, status, policy, attempt in rows:
                target = restart_target(status, policy, attempt, max_attempts)
                finish = None if target == "queued" else (lambda rec, t=target: factory(rec, t))
                if self._transition(conn, out, state, task_id, (status,), target, finish, now,
                                    owned=False) is not None:
                    counts[target] += 1
            return RecoveryReport(failed=counts["failed"], requeued=counts["queued"],
                                  cancelled=counts["cancelled"])

        mine = self.instance if own and self._identity is not None else ""
        return await self._write(op)  # type: ignore[no-any-return]

    async def next_seqs(self, task_ids: Sequence[str]) -> dict[str, int]:
        """``next_seq`` of each task that exists (the poll fallback for ``e`` notices)."""
        ids = list(task_ids)
        return await self._read(lambda conn: dict(conn.execute(  # type: ignore
            "SELECT id, next_seq FROM tasks WHERE id = ANY(%s)", (ids,)).fetchall()))

    async def cancelling_among(self, task_ids: Sequence[str]) -> list[str]:
        """Which of these tasks are ``cancelling`` (the poll fallback for ``c`` notices)."""
        ids = list(task_ids)
        return await self._read(lambda conn: [r[0] for r in conn.execute(  # type: ignore
            "SELECT id FROM tasks WHERE id = ANY(%s) AND status = 'cancelling'",
            (ids,)).fetchall()])

    async def purge(self, *, now: float, event_retention: float, task_retention: float,
                    key_ttl: float) -> int:
        def op(conn: Conn, out: list[CommittedEvent], state: _Batch) -> int:
            counts = [conn.execute(sql, params).rowcount for sql, params in purge_statements(
                "%s", now=now, event_retention=event_retention, task_retention=task_retention)]
            return counts[0] + counts[-1]

        return await self._write(op)  # type: ignore[no-any-return]

    async def status_counts(self) -> dict[str, int]:
        return await self._read(  # type: ignore[no-any-return]
            lambda conn: dict(conn.execute(STATUS_COUNTS_SQL).fetchall()))


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))
