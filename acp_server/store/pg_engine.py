"""The PostgreSQL engine under the store: connections that heal, batches, LISTEN.

    class PostgresTaskStore(PostgresEngine):          # postgres.py: the task operations
        async def touch(self, task_id: str) -> None:
            await self._write(lambda conn, out, batch: conn.execute(...))

Contracts:

* psycopg 3's *synchronous* API on anyio worker threads (asyncio and trio alike):
  ``writers`` writer loops (default 1) drain one bounded queue of operations and run
  each batch in one transaction, without savepoints first, then (when an operation
  raised) again with a SAVEPOINT per operation (an operation is
  ``fn(conn, events_out, batch)``; ``batch`` is the transaction's ``Batch``); reads use
  a small pool of autocommit connections. An operation that lost a deadlock or a
  serialization race is rolled back alone and re-run in a later transaction.
* Connections heal. A broken connection (a restart, ``pg_terminate_backend``, a
  network cut) is replaced on next use; connecting is gated by a capped exponential
  backoff (``Backoff``: 50 ms doubling to ``RECONNECT_CAP_S``), and while the gate is
  shut operations fail at once with ``StoreUnavailableError`` instead of queueing
  behind connect timeouts. A batch whose connection broke *before* its COMMIT was sent
  is re-run once on a fresh connection (the server rolled it back); one whose COMMIT
  was cut fails with ``StoreUnavailableError`` (it may have landed: an idempotent
  retry replays it). A read whose connection broke is retried once on a fresh one.
* The schema is migrated at start-up (``schema.migrate_postgres``).
* No statement waits for ever for a server that does not answer (paused, or behind a
  network gone silent: its connections stay open, no timeout of the server's fires).
  Every round trip on every connection (writers, readers, the LISTEN connection's
  own statements, start-up) is given ``answer_s`` (``lock_timeout_s`` plus
  ``ANSWER_MARGIN_S``, at least ``MIN_ANSWER_S``: a statement may wait a lock that
  long, then the server answers at once), the schema migration ``MIGRATION_ANSWERS``
  times as long; past it the connection is abandoned from the client's side
  (``pg_answers.Watchdog``) and the call goes on as on any lost connection: a batch
  not yet at its COMMIT is re-sent once on a new connection, one whose COMMIT was sent
  fails with its outcome unknown, a read is tried once more on a new connection. A
  server that hangs whole answers no new connection either (``CONNECT_TIMEOUT_S``,
  then the connection gate shuts): the call fails with ``StoreUnavailableError`` (the
  doors' 503) within ``answer_s`` plus ``CONNECT_TIMEOUT_S``, and the calls after it
  fail at once while the gate is shut. When only the connection went silent (a
  firewall that dropped it, its backend stuck) the new connection serves: a lease
  renewal lands before its lease expires whenever ``lock_timeout_s`` leaves the
  margin ``Settings.lease_margin_warning`` asks for. New connections are made as for
  any outage, so everything resumes by itself once the server answers.
* A connection idle inside a transaction for ``IDLE_IN_TRANSACTION_S`` (its process
  paused or hung mid-batch) is ended by the server, which releases its locks; the
  batch then fails or re-runs as for any lost connection.
* No statement waits for ever for a lock another session holds (a ``LOCK TABLE``, a
  row held ``FOR UPDATE``): every connection waits at most ``lock_timeout_s``
  (``--store-busy-timeout-ms``; PostgreSQL's ``lock_timeout``), then the operation
  fails with ``StoreUnavailableError`` (the doors' 503), never re-run as a lost race.
  A batch waits it out once: the operation that timed out is not run again in the
  batch's careful pass, and from then on its statements wait at most
  ``CONTENDED_LOCK_S``; so do the statements of the batches that start within
  ``lock_timeout_s`` after it (the next batch after that may wait a lock out again:
  a short wait that failed extends nothing, so a busy store is not kept failing
  fast). So while the lock is held, the writes that need it mostly answer 503 at once
  and the others commit without delay: a session journal commit or a lease renewal
  is not held up behind every task write waiting for a locked ``tasks`` (the session
  leases expired so, and another instance adopted sessions their owner still ran).
* Notices: an operation adds ``(kind, task_id)`` to ``batch.notices``; the commit
  sends them all in one ``pg_notify`` statement on ``channel`` as
  ``kind:instance:id[,id…]``, in the COMMIT's round trip (``_commit``), each id's
  ``%`` and ``,`` escaped (``%25``, ``%2C``: a session id is any string an agent
  chose) and the payloads split under PostgreSQL's 8,000 bytes (UTF-8);
  ``_on_notice(kind, ids)`` gets other instances' notices on the event loop. The
  LISTEN connection reconnects with the same backoff; notices lost meanwhile are what
  the service's polling is for. It also reconnects as soon as any other connection
  is made (the store is back), not only when its backoff is due.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from acp_server.store.errors import Backoff, StoreUnavailableError, first_line
from acp_server.store.pg_answers import Answered, Watchdog
from acp_server.store.schema import migrate_postgres
from acp_server.store.tasks import CommittedEvent
from acp_server.store.writer import GroupCommitStore, Op

log = logging.getLogger("acp_server.store")

Conn = Answered
WRITERS = 1   # measured: one writer batches more than two contend (GIL, locks)
READERS = 4
RETRIES = 5
CONNECT_TIMEOUT_S = 3
RECONNECT_CAP_S = 5.0
LISTEN_READY_S = 10   # start-up waits this long at most for LISTEN (polling covers)
NOTICE_BYTES = 7000   # a pg_notify payload stays under PostgreSQL's 8000 bytes
IDLE_IN_TRANSACTION_S = 2.0   # a batch's statements follow each other within milliseconds
# A round trip unanswered this long past the lock timeout (and at least MIN_ANSWER_S in
# all): the server hangs (a COMMIT's flush waits no lock: it has the whole bound)
ANSWER_MARGIN_S = 0.5
MIN_ANSWER_S = 2.0
MIGRATION_ANSWERS = 10   # the schema migration may rewrite a table: this many times as long
TRANSIENT = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure)
# A batch that waited ``lock_timeout_s`` for a lock: how long its other statements wait.
CONTENDED_LOCK_S = 0.02
# Errors that mean the database cannot serve now (besides every OperationalError).
UNAVAILABLE = (psycopg.OperationalError, pg_errors.ReadOnlySqlTransaction,
               pg_errors.DiskFull, pg_errors.InsufficientResources)
# ... except class 54, program_limit_exceeded (an index row or a statement too large):
# an OperationalError in psycopg, but it fails the same write every time: a refusal.
REFUSED_CLASSES = ("54",)


def lock_timed_out(exc: BaseException) -> bool:
    """A lock waited for past ``lock_timeout`` (maybe as the cause of a store error)."""
    return isinstance(exc, pg_errors.LockNotAvailable) \
        or isinstance(exc.__cause__, pg_errors.LockNotAvailable)


def lock_waits(conn: Conn, seconds: float, *, local: bool = True) -> None:
    """Lock waits of ``conn`` (this transaction's, or the session's) bounded."""
    scope = "LOCAL " if local else ""
    conn.execute(f"SET {scope}lock_timeout = {max(1, int(seconds * 1000))}")


def _refused_for_good(exc: BaseException) -> bool:
    sqlstate = getattr(exc, "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate[:2] in REFUSED_CLASSES


@dataclasses.dataclass
class Batch:
    """Per-transaction state: the queued count (once) and the notices to send."""

    queued: int | None = None
    notices: set[tuple[str, str]] = dataclasses.field(default_factory=set)


def _escaped(task_id: str) -> str:
    """An id as a payload carries it: its ``%`` and ``,`` escaped (``_parse``)."""
    if "%" in task_id or "," in task_id:
        return task_id.replace("%", "%25").replace(",", "%2C")
    return task_id


def _parse(payload: str) -> tuple[str, str, list[str]]:
    """``kind:instance:id,…`` → (kind, instance, ids), each id as it was sent."""
    kind, _, rest = payload.partition(":")
    instance, _, ids = rest.partition(":")
    return kind, instance, [urllib.parse.unquote(i) if "%" in i else i
                            for i in ids.split(",")]


class PostgresEngine(GroupCommitStore[Conn]):
    """See the module docstring. ``url``: a libpq URL (``postgresql://…``; add
    ``?options=-csearch_path%3Dname`` for a schema other than ``public``)."""

    def __init__(self, url: str, *, on_commit: Callable[[list[CommittedEvent]], None]
                 | None, group_commit: bool, writers: int, instance: str | None,
                 lock_timeout_s: float = 5.0) -> None:
        super().__init__(on_commit=on_commit, group_commit=group_commit, writers=writers,
                         readers=READERS)
        self.url = url
        self.instance = instance or secrets.token_hex(6)
        self.channel = "lmsp"
        self.lock_timeout_s = lock_timeout_s   # every lock wait, at most (module docstring)
        # every round trip, at most: then the connection is abandoned (module docstring)
        self.answer_s = max(lock_timeout_s + ANSWER_MARGIN_S, MIN_ANSWER_S)
        self._watchdog = Watchdog(self._no_answer)
        self._contended_until = 0.0   # monotonic: till then, batches wait CONTENDED_LOCK_S
        self._writers: list[Conn] = []
        # writers + the listener: a reservation of long-lived threads (each holds its
        # token for the store's life), not a pool for other work to share
        self._write_limiter = anyio.CapacityLimiter(writers + 1)
        self._stop = threading.Event()
        # set on stop and on each connection made: a LISTEN waiting out its backoff
        # reconnects as soon as the store is seen back (a hand-off asked of this
        # instance is heard then, not up to RECONNECT_CAP_S later)
        self._listen_wake = threading.Event()
        self._listen_backoff = Backoff(0.05, RECONNECT_CAP_S)
        self._gate = threading.Lock()
        self._backoff = Backoff(0.05, RECONNECT_CAP_S)
        self._retry_at = 0.0            # monotonic: no connection attempt before
        self._down = ""                 # why the last connection attempt failed

    # -- hooks for the operations ----------------------------------------------------
    def _prepare(self, conn: Conn, batch: list[Op], state: Batch, careful: bool) -> list[Op]:
        """Run what the batch may do in bulk; returns the operations left to run
        (``careful``: inside the savepoint ``op``, which it may roll back to)."""
        return batch

    def _on_notice(self, kind: str, ids: list[str]) -> None:
        """Another instance's notice (on the event loop)."""

    def _wanted(self, kind: str, ids: list[str]) -> list[str]:
        """The ids of a notice worth a hop to the event loop (the listener's thread:
        a cheap, thread-safe look only)."""
        return ids

    def notice(self, state: Batch, kind: str, task_id: str = "") -> None:
        state.notices.add((kind, task_id))

    def _notices_due(self, state: Batch) -> None:
        """Just before a COMMIT: add the notices held back for it (``postgres.py``
        holds the sessions' back, see ``HOLD_S``)."""

    def _notices_unsent(self, state: Batch) -> None:
        """A COMMIT that failed, or whose outcome is unknown: its notices may not have
        gone out (``postgres.py`` holds the sessions' again for the next commit; a
        notice twice is harmless, a reader re-reads; the others are left to polling)."""

    # -- connections -----------------------------------------------------------------
    def _connect(self, autocommit: bool = False) -> Conn:
        """A new connection, or ``StoreUnavailableError`` (at once while the backoff
        gate is shut)."""
        with self._gate:
            if time.monotonic() < self._retry_at:
                raise StoreUnavailableError(self._down)
        conn: Conn | None = None
        try:
            conn = self._watchdog.connect(self.url, answer_s=self.answer_s,
                                          autocommit=autocommit,
                                          connect_timeout=CONNECT_TIMEOUT_S)
            conn.execute("SET synchronous_commit = on")   # durable on COMMIT, always
            # A process paused (SIGSTOP) or hung inside a transaction must not hold its
            # row locks for ever: the server ends such a session and rolls it back, so
            # another instance can take a session lease over (store/leases.py).
            conn.execute(f"SET idle_in_transaction_session_timeout = "
                         f"{int(IDLE_IN_TRANSACTION_S * 1000)}")
            lock_waits(conn, self.lock_timeout_s, local=False)
            if not autocommit:
                conn.commit()
        except psycopg.Error as exc:
            if conn is not None:
                conn.close()
            with self._gate:
                self._retry_at = time.monotonic() + self._backoff.next()
                self._down = f"PostgreSQL: {first_line(exc)}"
            raise StoreUnavailableError(self._down) from exc
        with self._gate:
            self._backoff.reset()
            self._retry_at = 0.0
        self._listen_wake.set()
        return conn

    @staticmethod
    def _no_answer(reason: str) -> None:
        """A connection abandoned because the server did not answer (the watchdog's
        thread); its call goes on as on a lost connection (module docstring)."""
        log.warning("%s: the server hangs, or the connection went silent", reason)

    async def _connect_all(self) -> None:
        try:
            first = await anyio.to_thread.run_sync(self._connect)
            self._writers.append(first)
            first.answer_s = self.answer_s * MIGRATION_ANSWERS
            await anyio.to_thread.run_sync(migrate_postgres, first)
            first.answer_s = self.answer_s
            row = await anyio.to_thread.run_sync(
                lambda: first.execute("SELECT current_schema()").fetchone())
            first.commit()
            self.channel = f"lmsp_{row[0] if row else 'public'}"[:63]
            for _ in range(self.writers - 1):
                self._writers.append(await anyio.to_thread.run_sync(self._connect))
            for _ in range(READERS):
                self._readers.append(await anyio.to_thread.run_sync(self._connect, True))
        except BaseException as exc:
            self._disconnect_all()
            reason = self._unavailable(exc)   # a lock waited out by the migration, say
            if reason is not None and not isinstance(exc, StoreUnavailableError):
                raise StoreUnavailableError(reason) from exc   # the start is tried again
            raise

    def _disconnect_all(self) -> None:
        for conn in (*self._writers, *self._readers):
            conn.close()
        self._writers.clear()
        self._readers.clear()
        self._watchdog.close()

    async def _background(self, tg: anyio.abc.TaskGroup) -> None:
        # notices committed after start-up reach us (unless LISTEN fails: polling then)
        await tg.start(self._listen)

    def _stopping(self) -> None:
        self._stop.set()         # the listener ends within its poll timeout
        self._listen_wake.set()

    def _usable(self, conn: Conn) -> bool:
        return not (conn.closed or conn.broken)

    def _reconnect(self) -> Conn:
        return self._connect(True)

    def _read_lost(self, conn: Conn, exc: BaseException) -> bool:
        # a pooled connection whose backend ended (a restart, ``pg_terminate_backend``)
        # looks usable until a query fails on it; psycopg marks it broken then. Any
        # error class: a snapshot's (``session_reads.snapshot``) ended by the server's
        # idle-in-transaction timeout is an InternalError (class 25)
        return isinstance(exc, psycopg.Error) and not self._usable(conn)

    def _unavailable(self, exc: BaseException) -> str | None:
        if isinstance(exc, UNAVAILABLE) and not _refused_for_good(exc):
            return f"PostgreSQL: {first_line(exc)}"
        return None

    async def _ping(self) -> None:
        await self._read(lambda conn: conn.execute("SELECT 1").fetchone())

    # -- the writers -----------------------------------------------------------------
    def _run_batch(self, index: int, batch: list[Op]) -> None:
        """Runs in a worker thread. The batch goes first without savepoints (one round
        trip less per operation); when an operation raises, it is run again with a
        SAVEPOINT per operation. Transient losers re-run in a following transaction; a
        batch whose connection broke before COMMIT is re-run once on a new one."""
        waited = time.monotonic() >= self._contended_until   # may wait a lock out
        pending, resend, careful, contended = batch, True, False, not waited
        try:
            for attempt in range(RETRIES + 1):
                pending, outcome = self._transaction(
                    index, pending, last=attempt >= RETRIES - 1, resend=resend,
                    careful=careful, contended=contended)
                if outcome == "resent":
                    resend = False
                elif outcome in ("careful", "locked"):
                    careful, contended = True, contended or outcome == "locked"
                if not pending:
                    return
        finally:   # the next batches fail fast for a while (module docstring)
            if waited and any(op.error is not None and lock_timed_out(op.error)
                              for op in batch):
                self._contended_until = time.monotonic() + self.lock_timeout_s

    def _abort(self, index: int) -> None:
        try:
            self._writers[index].rollback()
        except psycopg.Error:
            pass   # a broken connection is replaced before the next batch

    def _transaction(self, index: int, batch: list[Op], *, last: bool, resend: bool,
                     careful: bool, contended: bool = False) -> tuple[list[Op], str]:
        """(operations to run again, why: ``""`` transient losers, ``"resent"`` the
        connection broke, ``"careful"`` an operation raised in an optimistic run,
        ``"locked"`` it waited out ``lock_timeout_s``: failed, the others run again
        waiting ``CONTENDED_LOCK_S`` at most, ``contended``)."""
        conn = self._writers[index]
        if not self._usable(conn):
            try:
                conn = self._writers[index] = self._connect()
            except StoreUnavailableError as exc:
                for op in batch:
                    op.result, op.error, op.events = None, exc, []
                return [], ""
        state = Batch()
        retry: list[Op] = []
        committing = False
        running: Op | None = None   # the optimistic run's operation in progress

        def rollback() -> None:   # to the savepoint: a SET LOCAL made after it is undone
            conn.execute("ROLLBACK TO SAVEPOINT op")
            if contended:
                lock_waits(conn, CONTENDED_LOCK_S)
        try:
            if contended:
                lock_waits(conn, CONTENDED_LOCK_S)
            if careful:
                conn.execute("SAVEPOINT op")
            rest = self._prepare(conn, batch, state, careful)
            for i, op in enumerate(rest):
                if not careful:   # an error aborts the transaction: see below
                    running = op
                    op.result = op.fn(conn, op.events, state)
                    continue
                # One savepoint per operation; between two operations RELEASE + SAVEPOINT
                # go in one round trip, and ROLLBACK TO keeps the savepoint for the next.
                try:
                    op.result = op.fn(conn, op.events, state)
                except TRANSIENT as exc:
                    rollback()
                    op.events = []
                    if last:
                        op.error = exc
                    else:
                        retry.append(op)
                except Exception as exc:   # noqa: BLE001 - handed to the caller
                    if conn.broken:
                        raise
                    contended = contended or lock_timed_out(exc)   # waited out once: enough
                    rollback()
                    op.error, op.events = self._locked(exc), []
                else:
                    if i < len(rest) - 1:
                        conn.execute("RELEASE SAVEPOINT op; SAVEPOINT op")
            committing = True
            self._commit(conn, state)
            self.commits += 1
            self.synced_commits += 1   # PostgreSQL commits every batch durably
        except Exception as exc:   # noqa: BLE001 - the whole batch failed (bulk creates too)
            try:
                conn.rollback()
            except psycopg.Error:
                pass
            if committing:
                self._notices_unsent(state)
            lost = not self._usable(conn)
            if not careful and not lost and not committing:   # again, with savepoints
                for op in batch:
                    op.result, op.error, op.events = None, None, []
                if lock_timed_out(exc):   # not waited out twice (nor once per create)
                    if running is not None:   # (None: the bulk creates of ``_prepare``)
                        running.error = self._locked(exc)
                    return [op for op in batch if op is not running], "locked"
                return batch, "careful"
            again = resend and not committing and lost
            if committing and lost:
                exc = StoreUnavailableError(f"PostgreSQL: the connection was lost during "
                                            f"COMMIT ({first_line(exc)}); the outcome is "
                                            f"unknown")
            for op in batch:
                op.result, op.error, op.events = None, None if again else exc, []
            if again:
                log.warning("PostgreSQL connection lost (%s); the batch is re-sent",
                            first_line(exc))
            return (batch, "resent") if again else ([], "")
        return retry, ""

    def _locked(self, exc: Exception) -> Exception:
        """A lock waited out (``lock_timed_out``) as the store error the doors answer
        503; any other error as it is."""
        if not isinstance(exc, pg_errors.LockNotAvailable):
            return exc
        error = StoreUnavailableError(f"PostgreSQL: a lock another session holds was not "
                                      f"released within the busy timeout ({first_line(exc)})")
        error.__cause__ = exc
        return error

    def _commit(self, conn: Conn, state: Batch) -> None:
        """COMMIT, the transaction's notices in the same round trip: one query in the
        simple protocol, ``SELECT pg_notify(…) FROM unnest(ARRAY[…]); COMMIT`` (one
        payload per kind, the ids escaped and joined, split to stay under PostgreSQL's
        payload limit, in bytes: a session id may be any UTF-8; counted in characters,
        a payload past it failed the COMMIT, and every later one that carried it
        again). Measured: with two instances a commit carries half the prompts, so its
        fixed round trips are what doubles; a connection lost in it leaves the outcome
        unknown, as for a lost COMMIT."""
        self._notices_due(state)
        if not state.notices:
            conn.commit()
            return
        by_kind: dict[str, list[str]] = {}
        for kind, task_id in state.notices:
            by_kind.setdefault(kind, []).append(task_id)
        payloads = []
        for kind, ids in sorted(by_kind.items()):
            head, chunk = f"{kind}:{self.instance}:", []
            size = len(head)   # in UTF-8 bytes, as PostgreSQL counts: an id may not be ASCII
            for task_id in sorted(map(_escaped, ids)):
                length = len(task_id) if task_id.isascii() else len(task_id.encode())
                if chunk and size + length + 1 > NOTICE_BYTES:
                    payloads.append(head + ",".join(chunk))
                    chunk, size = [], len(head)
                chunk.append(task_id)
                size += length + 1
            payloads.append(head + ",".join(chunk))
        conn.execute(sql.SQL("SELECT pg_notify({}, p) FROM unnest({}::text[]) AS p; COMMIT")
                     .format(sql.Literal(self.channel), sql.Literal(payloads)), prepare=False)
        conn.commit()   # psycopg's own state: the server has committed already

    # -- cross-instance notices ------------------------------------------------------
    async def _listen(self, *, task_status: anyio.abc.TaskStatus[None]
                      = anyio.TASK_STATUS_IGNORED) -> None:
        """Started (``task_status``) once LISTEN is on, or has failed once, or after
        ``LISTEN_READY_S``: notices lost meanwhile are found by the service's polling."""
        ready = threading.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._report_ready, ready, task_status)
            await anyio.to_thread.run_sync(self._listen_thread, ready,
                                           limiter=self._write_limiter)
            tg.cancel_scope.cancel()

    @staticmethod
    async def _report_ready(ready: threading.Event,
                            task_status: anyio.abc.TaskStatus[None]) -> None:
        await anyio.to_thread.run_sync(ready.wait, LISTEN_READY_S, abandon_on_cancel=True)
        task_status.started()

    def _listen_thread(self, ready: threading.Event) -> None:
        """LISTEN on a dedicated connection until the store closes; reconnects with a
        capped backoff, or at once when another connection is made meanwhile (the
        store is back); the service's polling covers notices lost meanwhile."""
        while not self._stop.is_set():
            try:
                with self._watchdog.connect(self.url, answer_s=self.answer_s,
                                            autocommit=True,
                                            connect_timeout=CONNECT_TIMEOUT_S) as conn:
                    conn.execute(f'LISTEN "{self.channel}"')
                    conn.answer_s = None   # waiting for notices: silence is no hang
                    ready.set()
                    self._listen_backoff.reset()
                    while not self._stop.is_set():   # each notice as soon as it arrives
                        for notice in conn.notifies(timeout=0.2):
                            kind, instance, ids = _parse(notice.payload)
                            if instance != self.instance:   # ours: no hop to the loop
                                ids = self._wanted(kind, ids)
                                if ids:
                                    anyio.from_thread.run_sync(self._on_notice, kind, ids)
            except Exception as exc:   # noqa: BLE001 - psycopg, or the loop going away
                log.warning("LISTEN connection lost (%s); reconnecting", first_line(exc))
                ready.set()
                self._listen_wake.clear()
                self._listen_wake.wait(self._listen_backoff.next())
