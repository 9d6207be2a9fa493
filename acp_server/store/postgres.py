"""The PostgreSQL task store: several server instances share one database.

    store = PostgresTaskStore("postgresql://acp@db/acp", on_commit=hub.publish,
                              lease_s=30, renew_s=10)
    async with store:
        outcome = await store.create_task(new, event0, None)   # committed (WAL fsynced)
        claimed = await store.claim_next(time.time())          # FOR UPDATE SKIP LOCKED

Contracts (besides those of ``acp_server.store.tasks``):

* The engine (``pg_engine``): batches, healing connections, LISTEN. The batch's
  plain creates share one multi-row INSERT (``_prepare``). The ``max_queued`` check
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
  Start-up recovery and that release, like every statement (``pg_engine``), wait at
  most ``lock_timeout_s`` for a lock another session holds (then
  ``StoreUnavailableError``: the start is tried again; the leases expire on their own),
  never for ever; start-up recovery never skips a locked row of this instance's own (a
  task of this instance skipped would be renewed by it for ever).
* The sessions' notices (``s``) are coalesced: a commit sends those held since the
  last one that sent any when ``HOLD_S`` has passed since, else holds its own; held
  notices wait for a later commit, or, once the writes stop, ``HOLD_S`` more (an
  empty transaction then sends them; a COMMIT that fails holds its notices again for
  the next one, and the empty transaction gives up on a store error until a commit
  lands). With more than one writer a held notice may
  leave with another writer's commit before its own lands (a hint: readers re-read
  by sequence, and polling covers what it missed). Measured, two instances behind
  HAProxy: a NOTIFY per commit woke every instance's listener (its own commits
  included) and PostgreSQL's listening backends hundreds of times a second, 18 % of
  all the CPU of the run; a reader elsewhere now hears of a commit within ``HOLD_S``
  plus a commit.
* Cross-instance wake-ups: each transaction NOTIFYs ``lmsp_<schema>`` with
  ``kind:instance:id,…`` (``e`` events, ``q`` new queued work, ``c`` cancel requested;
  ``s``, ``t`` and ``HANDOFF_KINDS`` go to the sessions', tokens' and hand-offs' hooks);
  ``on_notify(kind, task_id)`` gets the other instances' notices in the event loop.
  They are hints only: readers always re-read by sequence number, and the service
  polls every ``poll_s`` as a fallback.
* A task or response id with a NUL (a client's, from a URL's ``%00``) names no task:
  ``get_task`` / ``get_by_response`` answer ``None`` without asking the database,
  whose TEXT cannot hold one (psycopg raises ``DataError`` before sending it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Container, Sequence
from typing import Any

import anyio
import anyio.abc
import msgspec
from psycopg import errors as pg_errors

from acp_server.store.audit import AuditOps
from acp_server.store.identity import claim_identity
from acp_server.store.pg_engine import WRITERS, Batch, Conn, PostgresEngine
from acp_server.store.tasks import (
    COLUMNS,
    record_from_row,
    UNCLAIM,
    ACTIVE,
    NO_EXTRA,
    TERMINAL,
    AnyEvent,
    CommittedEvent,
    ClaimsOne,
    CreateOutcome,
    Dialect,
    Extra,
    Finish,
    FinishFactory,
    IdempotencyClaim,
    NewTask,
    ObservedMoves,
    QueueFullError,
    RecoveryFactory,
    RecoveryReport,
    TaskRecord,
    Transition,
    cancel_in,
    encode,
    numbered,
    queued_record,
    recover_rows,
)
from acp_server.store.tokens import TokenOps
from acp_server.store.writer import Op

__all__ = ["PostgresTaskStore", "is_postgres_url"]
NUL = "\x00"   # PostgreSQL TEXT cannot hold it: an id with one names nothing
log = logging.getLogger("acp_server.store")

NOW = "extract(epoch FROM clock_timestamp())"   # the database clock, seconds
COLUMNS_OF_TASKS = ", ".join(f"tasks.{c.strip()}" for c in COLUMNS.split(","))
# Notices of the hand-offs of idle sessions between instances (``acp_server.fleet``):
# asked, given, refused (busy).
HANDOFF_KINDS = frozenset({"h", "g", "b"})
# The sessions' notices go out at most once per HOLD_S (see the module docstring).
HOLD_S = 0.02
# A create without idempotency key (task, event 0, max_queued): it may join the
# batch's one multi-row INSERT (``_prepare``) instead of running its operation.
Bulk = tuple[NewTask, AnyEvent, int | None]


def queued_count(conn: Conn) -> int:
    """Queued tasks, exact until the transaction ends: transactions that check the
    queue limit (any writer, any instance) take this lock, so they count in turn."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.lmsp.queue'))")
    row = conn.execute("SELECT COUNT(*) FROM tasks WHERE status = 'queued'").fetchone()
    return int(row[0]) if row else 0


class PostgresDialect(Dialect):
    p = "%s"
    binary = ' COLLATE "C"'
    lock = " FOR UPDATE"
    skip_locked = " FOR UPDATE SKIP LOCKED"

    def insert_events(self, conn: Any, task_id: str, first_seq: int,
                      events: Sequence[AnyEvent], out: list[CommittedEvent]) -> None:
        rows = numbered(task_id, first_seq, events, out)
        if rows:   # one statement, one round trip, whatever the count
            conn.execute("INSERT INTO task_events(task_id, seq, type, data) SELECT %s, "
                         "unnest(%s::integer[]), unnest(%s::text[]), unnest(%s::bytea[])",
                         (task_id, [r.seq for r in rows], [r.type for r in rows],
                          [r.data for r in rows]))


    def claim_oldest(self, conn: Any, now: float, set_extra: Extra = NO_EXTRA,
                     limit: int = 1) -> list[TaskRecord]:
        """The picked rows are locked once, in a materialized CTE (an ``IN (subquery)``
        may be re-run by the planner, and ``SKIP LOCKED`` then skips its own rows)."""
        rows = conn.execute(
            f"WITH picked AS MATERIALIZED (SELECT seq FROM tasks WHERE status = 'queued' "
            f"ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED) "
            f"UPDATE tasks SET status = 'loading', attempt = attempt + 1, updated_at = %s"
            f"{set_extra[0]} FROM picked WHERE tasks.seq = picked.seq "
            f"RETURNING {COLUMNS_OF_TASKS}", (limit, now, *set_extra[1])).fetchall()
        return sorted(map(record_from_row, rows), key=lambda r: r.id)


PG = PostgresDialect()


class PostgresTaskStore(TokenOps, AuditOps, ClaimsOne, ObservedMoves, PostgresEngine):
    """See the module docstring. ``url``: a libpq URL (``postgresql://…``; add
    ``?options=-csearch_path%3Dname`` for a schema other than ``public``). The tokens
    and the audit log (``TokenOps``, ``AuditOps``) share its writer; a token created or
    revoked is a notice of kind ``t`` to the other instances (``on_tokens_changed``)."""

    shared = True   # several instances: the service runs leases, sweeps and polling
    _p = "%s"

    def __init__(self, url: str, *, on_commit: Callable[[list[CommittedEvent]], None]
                 | None = None, group_commit: bool = True, lease_s: float = 30,
                 renew_s: float = 10, poll_s: float = 1.0, writers: int = WRITERS,
                 state_dir: str | None = None, lock_timeout_s: float = 5.0) -> None:
        """``lock_timeout_s``: how long any statement waits for a lock another session
        holds (``--store-busy-timeout-ms``; ``pg_engine``), then 503."""
        # Stable across restarts with a state dir (identity.py): own tasks recovered at once.
        self._identity = claim_identity(state_dir, url) if state_dir else None
        super().__init__(url, on_commit=on_commit, group_commit=group_commit, writers=writers,
                         instance=self._identity.instance if self._identity else None,
                         lock_timeout_s=lock_timeout_s)
        self.on_notify: Callable[[str, str], None] | None = None
        # the sessions other instances committed events of (``acp_server.fleet``), and
        # those it wants to hear of (a container read from the listener's thread: a
        # notice of other sessions costs no hop to the event loop)
        self.on_sessions: Callable[[list[str]], None] | None = None
        self.sessions_followed: Container[str] = ()
        # hand-offs of idle sessions (``acp_server.fleet.handoff``): the notices of
        # kinds ``HANDOFF_KINDS`` it wants (a cheap look, on the listener's thread),
        # then on the event loop
        self.handoff_wanted: Callable[[str, list[str]], list[str]] = lambda kind, ids: []
        self.on_handoff: Callable[[str, list[str]], None] | None = None
        self.lease_s, self.renew_s, self.poll_s = lease_s, renew_s, poll_s
        # Seconds added to the database clock of the leases (tests move time with it).
        self.clock_offset_s = 0.0
        # the sessions' notices held back (writer threads add, a COMMIT takes them)
        self._held: set[str] = set()
        self._held_lock = threading.Lock()
        self._sent_at = self._settled_at = 0.0   # time.monotonic()
        self._held_wake: anyio.Event | None = None      # made in the event loop
        self._held_scope: anyio.CancelScope | None = None

    # -- the sessions' notices, coalesced ------------------------------------------
    def notice(self, state: Batch, kind: str, task_id: str = "") -> None:
        if kind != "s":
            super().notice(state, kind, task_id)
            return
        with self._held_lock:
            self._held.add(task_id)

    def _notices_due(self, state: Batch) -> None:
        if not self._held:
            return
        now = time.monotonic()
        with self._held_lock:
            if now - self._sent_at < HOLD_S:
                return
            state.notices.update(("s", sid) for sid in self._held)
            self._held.clear()
            self._sent_at = now

    def _notices_unsent(self, state: Batch) -> None:
        held = [sid for kind, sid in state.notices if kind == "s"]
        if held:
            with self._held_lock:
                self._held.update(held)

    def _settle(self, batch: list[Op]) -> None:
        super()._settle(batch)
        self._settled_at = time.monotonic()
        if self._held and self._held_wake is not None:
            self._held_wake.set()

    async def _send_held(self) -> None:
        """Held notices go out in an empty transaction once no commit has landed for
        ``HOLD_S`` (the writes stopped; while they go on, a due commit takes them)."""
        assert self._held_scope is not None
        with self._held_scope:
            while True:
                self._held_wake = anyio.Event()
                await self._held_wake.wait()
                while self._held:
                    await anyio.sleep(HOLD_S)
                    if self._held and time.monotonic() - self._settled_at >= HOLD_S:
                        try:
                            await self._write(lambda conn, out, state: None)
                        except Exception:   # noqa: BLE001 - hints: polling covers them
                            break

    # -- lifecycle -----------------------------------------------------------------
    async def _background(self, tg: anyio.abc.TaskGroup) -> None:
        await super()._background(tg)
        self._held_scope = anyio.CancelScope()   # cancelled (even before entered) on stop
        tg.start_soon(self._send_held)

    def _stopping(self) -> None:
        super()._stopping()
        if self._held_scope is not None:
            self._held_scope.cancel()

    def _disconnect_all(self) -> None:
        super()._disconnect_all()
        if self._identity is not None:
            self._identity.release()

    async def _closing(self) -> None:
        try:
            await self.release_leases()
        except Exception:   # noqa: BLE001 - the leases then expire on their own
            log.warning("could not release the leases of %s", self.instance)

    def _conflict(self, exc: BaseException) -> bool:
        return isinstance(exc, pg_errors.UniqueViolation)

    def _token_notice(self, state: Batch, token_ids: Sequence[str]) -> None:
        for token_id in token_ids:
            self.notice(state, "t", token_id)

    def _wanted(self, kind: str, ids: list[str]) -> list[str]:
        if kind in HANDOFF_KINDS:
            return self.handoff_wanted(kind, ids)
        if kind != "s":
            return ids
        followed = self.sessions_followed
        return [sid for sid in ids if sid in followed]

    def _on_notice(self, kind: str, ids: list[str]) -> None:
        if kind == "s":   # a session's journal (acp_server.store.sessions): its readers
            if self.on_sessions is not None:
                self.on_sessions(ids)
            return
        if kind in HANDOFF_KINDS:   # a hand-off asked, given or refused
            if self.on_handoff is not None:
                self.on_handoff(kind, ids)
            return
        if kind == "t":   # tokens: not the tasks' (the service ignores unknown kinds)
            if self.on_tokens_changed is not None:
                self.on_tokens_changed(ids)
            return
        if self.on_notify is not None:
            for task_id in ids:
                self.on_notify(kind, task_id)

    def _prepare(self, conn: Conn, batch: list[Op], state: Batch, careful: bool) -> list[Op]:
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
        except pg_errors.Error:
            if not careful:
                raise   # the batch runs again, carefully
            conn.execute("ROLLBACK TO SAVEPOINT op")
            state.queued = None
            return batch
        if careful:
            conn.execute("RELEASE SAVEPOINT op; SAVEPOINT op")
        for op, task, kind, data in zip(plain, tasks, types, datas):
            op.events.append(CommittedEvent(task.id, 0, kind, data))
            op.result = CreateOutcome(queued_record(task), replayed=False)
        if state.queued is not None:
            state.queued += len(plain)
        self.notice(state, "q")
        return [op for op in batch if op.bulk is None]

    # -- operations ----------------------------------------------------------------
    async def create_task(self, task: NewTask, event0: AnyEvent,
                          idem: IdempotencyClaim | None, *,
                          timeout: float | None = None,
                          max_queued: int | None = None) -> CreateOutcome:
        def op(conn: Conn, out: list[CommittedEvent], state: Batch) -> CreateOutcome:
            if idem is not None:
                if (found := PG.replay_key(conn, idem, task.created_at)) is not None:
                    return found
                # waits for a concurrent insert of the key (any instance) to end
                inserted = conn.execute(
                    "INSERT INTO idempotency_keys VALUES (%s, %s, %s, %s, %s) "
                    "ON CONFLICT (scope, key) DO NOTHING RETURNING 1",
                    (idem.scope, idem.key, idem.fingerprint, task.id,
                     idem.expires_at)).fetchone()
                if inserted is None:   # another instance committed it first
                    found = PG.replay_key(conn, idem, task.created_at)
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
            self.notice(state, "q")
            return CreateOutcome(queued_record(task), replayed=False)

        bulk: Bulk | None = (task, event0, max_queued) if idem is None else None
        return await self._write(op, timeout, bulk)

    async def get_task(self, task_id: str) -> TaskRecord | None:
        if NUL in task_id:   # no TEXT holds one (psycopg refuses to send it): no such task
            return None
        return await self._read(lambda conn: PG.select_task(conn, task_id))

    async def get_by_response(self, response_id: str) -> TaskRecord | None:
        if NUL in response_id:
            return None
        return await self._read(lambda conn: PG.select_by_response(conn, response_id))

    async def get_keyed(self, idem: IdempotencyClaim, now: float) -> TaskRecord | None:
        return await self._read(lambda conn: PG.select_keyed(conn, idem, now))

    async def delete_task(self, task_id: str) -> bool:
        def op(conn: Conn, out: list[CommittedEvent], state: Batch) -> bool:
            deleted = PG.delete_finished(conn, task_id)
            if deleted:
                self.notice(state, "e", task_id)   # watchers re-read: the task is gone
            return deleted

        return await self._write(op)

    async def list_tasks(self, principal: str | None, *, status: str | None, after: str | None,
                         limit: int, finished_since: float | None = None,
                         after_by_id: bool = False) -> list[TaskRecord]:
        return await self._read(
            lambda conn: PG.select_page(conn, principal, status, after, limit,
                                           finished_since, after_by_id))

    async def claim(self, now: float, limit: int) -> list[TaskRecord]:
        lease: Extra = (f", owner = %s, lease_expires_at = {NOW} + %s",
                        (self.instance, self.clock_offset_s + self.lease_s))
        return await self._write(
            lambda conn, out, state: PG.claim_oldest(conn, now, lease, limit))

    def _owned(self) -> Extra:
        """Runner writes: only while no other instance owns the task."""
        return " AND (owner IS NULL OR owner = %s)", (self.instance,)

    def _transition(self, conn: Conn, out: list[CommittedEvent], state: Batch, task_id: str,
                    from_states: Sequence[str], to_state: str,
                    finish: FinishFactory | Finish | None, now: float, *,
                    owned: bool = True, extra: Extra = NO_EXTRA) -> Transition | None:
        """``Dialect.transition_in`` (row locked first), ownership kept, its notices added."""
        requeue = to_state == "queued"
        released: Extra = (", owner = CASE WHEN %s THEN NULL ELSE owner END, "
                           "lease_expires_at = CASE WHEN %s THEN NULL ELSE lease_expires_at "
                           "END" + extra[0], (requeue, requeue or to_state in TERMINAL,
                                              *extra[1]))
        won = PG.transition_in(conn, out, task_id, from_states, to_state, finish, now,
                            set_extra=released,
                            where_extra=self._owned() if owned else NO_EXTRA)
        if won is None:
            return None
        if won.events:
            self.notice(state, "e", task_id)
        if requeue:
            self.notice(state, "q")
        if to_state == "cancelling":
            self.notice(state, "c", task_id)
        return won

    async def transition(self, task_id: str, from_states: Sequence[str], to_state: str,
                         finish: FinishFactory | Finish | None = None, *,
                         now: float) -> Transition | None:
        return await self._write(
            lambda conn, out, state: self._transition(conn, out, state, task_id, from_states,
                                                      to_state, finish, now))

    async def unclaim(self, task_id: str, *, now: float) -> bool:
        return await self._write(lambda conn, out, state: self._transition(
            conn, out, state, task_id, ("loading",), "queued", None, now,
            extra=UNCLAIM) is not None)

    async def append_events(self, task_id: str, events: Sequence[AnyEvent],
                            while_states: Sequence[str]) -> list[CommittedEvent] | None:
        def op(conn: Conn, out: list[CommittedEvent], state: Batch
               ) -> list[CommittedEvent] | None:
            written = PG.append_in(conn, out, task_id, events, while_states, self._owned())
            if written is not None:
                self.notice(state, "e", task_id)
            return written

        return await self._write(op)

    async def request_cancel(self, task_id: str, finish: FinishFactory, *,
                             now: float) -> tuple[TaskRecord | None, bool]:
        def op(conn: Conn, out: list[CommittedEvent], state: Batch
               ) -> tuple[TaskRecord | None, bool]:   # any instance may ask
            return cancel_in(lambda states, to, done: self._transition(
                conn, out, state, task_id, states, to, done, now, owned=False), finish,
                lambda: PG.select_task(conn, task_id))

        return await self._write(op)

    async def read_events(self, task_id: str, after: int, limit: int) -> list[CommittedEvent]:
        return await self._read(lambda conn: PG.select_events(conn, task_id, after, limit))

    # -- leases and recovery -------------------------------------------------------
    async def renew_leases(self) -> tuple[set[str], set[str]]:
        """Extends this instance's leases: ``(owned ids, of which cancelling)``. A row
        another session holds locked is skipped (not renewed this time; nobody recovers
        it while it is locked: ``recover`` skips it too), so one locked task does not
        leave every other lease of this instance to expire."""
        def op(conn: Conn, out: list[CommittedEvent], state: Batch
               ) -> tuple[set[str], set[str]]:
            rows = conn.execute(
                f"WITH mine AS MATERIALIZED (SELECT seq FROM tasks WHERE owner = %s "
                f"AND status = ANY(%s) FOR UPDATE SKIP LOCKED) "
                f"UPDATE tasks SET lease_expires_at = {NOW} + %s FROM mine "
                f"WHERE tasks.seq = mine.seq RETURNING tasks.id, tasks.status",
                (self.instance, list(ACTIVE), self.clock_offset_s + self.lease_s)).fetchall()
            return {r[0] for r in rows}, {r[0] for r in rows if r[1] == "cancelling"}

        return await self._write(op)

    async def taken_over(self, task_ids: Sequence[str]) -> list[str]:
        """Which of these tasks (this instance runs them) are no longer this instance's
        to run: not active under it any more (a recovery of its expired lease queued it
        again, another instance claimed it, or failed or cancelled it: its
        ``on_restart``), or gone. A turn of this instance's that ended and committed its
        final state is among them too: the caller tells (``Runner.taken_over``)."""
        ids = list(task_ids)
        return await self._read(lambda conn: [r[0] for r in conn.execute(
            "SELECT id FROM tasks WHERE id = ANY(%s) AND NOT (status = ANY(%s) AND "
            "owner IS NOT DISTINCT FROM %s)",
            (ids, list(ACTIVE), self.instance)).fetchall()])

    def _release_op(self, conn: Conn, out: list[CommittedEvent], state: Batch) -> None:
        # on a lock held elsewhere past ``lock_timeout_s``: they expire on their own
        conn.execute(f"UPDATE tasks SET lease_expires_at = {NOW} + %s WHERE owner = %s "
                     f"AND status = ANY(%s)", (self.clock_offset_s - 1, self.instance,
                                               list(ACTIVE)))

    async def release_leases(self) -> None:
        """Expire this instance's leases now (closing does it; tests use it to play a
        crash without waiting ``lease_s``)."""
        await self._write(self._release_op)

    async def recover(self, factory: RecoveryFactory, *, max_attempts: int,
                      now: float, own: bool = False) -> RecoveryReport:
        """Every active task whose lease expired (any instance's), and at start-up every
        task this instance owned (its previous run died), per its ``on_restart``. Rows
        another session has locked are skipped, except at start-up (``own``) this
        instance's own: a lock another session holds on one of them (a row's, or the
        table's on any) is waited for at most ``lock_timeout_s``, then
        ``StoreUnavailableError`` (``pg_engine``, as for any statement: nothing of it
        committed; the start is tried again, ``acp_server.serve_cli``). Skipped, a task of this
        instance would stay running, its lease renewed by this instance for ever; another
        instance's locked row is left to a later recovery, as the periodic one does."""
        def op(conn: Conn, out: list[CommittedEvent], state: Batch) -> RecoveryReport:
            rows = conn.execute(
                "SELECT id, status, on_restart, attempt FROM tasks WHERE status = "
                "ANY(%s) AND owner = %s ORDER BY seq FOR UPDATE",
                (list(ACTIVE), mine)).fetchall() if mine else []
            rows += conn.execute(
                f"SELECT id, status, on_restart, attempt FROM tasks WHERE status = "
                f"ANY(%s) AND (lease_expires_at IS NULL OR lease_expires_at < {NOW} + %s) "
                f"AND owner IS DISTINCT FROM %s ORDER BY seq FOR UPDATE SKIP LOCKED",
                (list(ACTIVE), self.clock_offset_s, mine)).fetchall()
            return recover_rows(rows, lambda task_id, states, to, done: self._transition(
                conn, out, state, task_id, states, to, done, now, owned=False),
                factory, max_attempts)

        mine = self.instance if own and self._identity is not None else ""
        return await self._write(op)

    async def next_seqs(self, task_ids: Sequence[str]) -> dict[str, int]:
        """``next_seq`` of each task that exists (the poll fallback for ``e`` notices)."""
        ids = list(task_ids)
        return await self._read(lambda conn: dict(conn.execute(
            "SELECT id, next_seq FROM tasks WHERE id = ANY(%s)", (ids,)).fetchall()))

    async def cancelling_among(self, task_ids: Sequence[str]) -> list[str]:
        """Which of these tasks are ``cancelling`` (the poll fallback for ``c`` notices)."""
        ids = list(task_ids)
        return await self._read(lambda conn: [r[0] for r in conn.execute(
            "SELECT id FROM tasks WHERE id = ANY(%s) AND status = 'cancelling'",
            (ids,)).fetchall()])

    async def purge(self, *, now: float, event_retention: float, task_retention: float,
                    key_ttl: float) -> int:
        return await self._write(lambda conn, out, state: PG.purge_tasks(
            conn, now=now, event_retention=event_retention, task_retention=task_retention))

    async def status_counts(self) -> dict[str, int]:
        return await self._read(PG.select_counts)


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))
