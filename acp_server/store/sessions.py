"""The session journal on the store: the bridge's ``SessionJournal`` on SQLite or
PostgreSQL, through the same group-commit writer as the LMSP tasks.

    store = store_for(url, state_dir=state_dir)
    async with store, StoreSessionJournal(store, ring_size=8000) as journal:
        async with Bridge(factory, workspace_cwd="/ws", journal=journal) as bridge:
            ...   # sessions restored at start, every accepted prompt committed before its 202

Contracts (besides ``bridge.journal``'s):

* At most one operation of the store's writer is queued or running at a time; it
  takes everything appended so far when the writer starts it (so what is appended
  while it waits in the queue joins it) and commits it with whatever else the writer
  batches (the tasks' operations, the audit log: one transaction, one fsync). While a
  commit is in flight, what is appended waits for the next one: group commit without
  a timer. Its outcome is handled in the writer's own task (``Op.on_done``): readers
  and the callers of ``wait`` are released with no extra task hop.
* A commit that fails because the store is unavailable (``StoreUnavailableError``:
  an outage, a full disk, a lock, a lost connection) fails the records somebody waits
  for (``SessionOpened``, ``PromptAccepted``: their callers answer 503,
  ``JournalUnavailableError``) and keeps the others (events, terminals, closes) in
  order for the next attempt, retried with a capped backoff. At most ``MAX_PENDING``
  records, and ``MAX_PENDING_BYTES`` of event envelopes, wait: past either the oldest
  events are let through to readers without being journaled, and their sessions get a
  new epoch in the next commit (the next start restores them under it: never a silent
  gap).
* A commit that fails for any other reason (a record the store refuses every time: a
  constraint, a value, a trigger, a bug) is not retried as it was: the next commit
  isolates the records it refuses, which are never run again, and commits the others
  (``acp_server.store.session_refusals``: what a refused record becomes, its log line
  and its count).
* Committed means it survives a crash of the server's process (``kill -9``): on
  SQLite the journal's own commits are written to the WAL without waiting for the
  disk (``synchronous=NORMAL``; a power loss may take back the last of them, never
  anything a task commit flushed after them), unless ``fsync`` (then, and whenever a
  task, token or audit write shares the commit: ``synchronous=FULL``). PostgreSQL
  commits are always flushed by the database (``synchronous_commit = on``).
* ``write_behind`` > 0 (``--session-write-behind``): events may reach readers before
  their commit, within that window, behind a per-session marker row
  (``acp_server.store.write_behind``); a session restored with its marker set gets a
  new epoch (``RestoredSession.gap``). 0: publish after commit.
* Tables (schema migration 3): ``sessions`` (the record, ``closed_at``; a branch's
  seed in ``seed``, migration 7, read by the restore, an adoption and a cold load
  alone, never by a listing),
  ``session_prompts`` (each accepted prompt; once settled only its terminal: the
  commit that settles it empties its record, the body nothing reads any more),
  ``session_segments`` (migration 8: a session's events of one commit in one row,
  ``acp_server.store.segments``; it replaced ``session_events``, one row an event).
  Per session at most ``ring_size`` events are kept, plus the rest of the segment
  straddling the bound (older segments are deleted as newer ones commit: a reader
  behind them gets ``ring_evicted``, as from the in-memory ring) and the newest
  ``MAX_PROMPT_TERMINALS`` settled prompts by settle time, as restore reads them
  (trimmed every ``TRIM_TERMINALS_EVERY`` settles of a session: at most that many
  more are on disk, across restarts too: the count is seeded at restore and changes
  only when a commit lands).
* Bounded in bytes too: once a session has had a quarter of ``max_session_bytes``
  of envelopes journaled since its last byte trim, its oldest events are deleted until
  the rest take at most ``max_session_bytes`` (never its newest event: the event ids
  go on from it; the segment straddling the bound is rewritten to its newest events).
  So a session's events take at most 1.25 × ``max_session_bytes`` plus one batch,
  across restarts too: the count is seeded at restore (and adopt) with what its
  events on disk take past the bound (``acp_server.store.session_trims``).
* After a power loss or a kernel crash (SQLite, the journal's commits not fsynced:
  ``SqliteTaskStore.unsynced_loss``, the last run had no clean stop and the boot id
  changed) ``restore`` gives every session a new epoch (``RestoredSession.gap``): the
  last commits readers saw may be gone, and their ids will be reused.
* ``restore`` logs and skips a row it cannot decode (a segment too: its events are a
  hole in the ids, so its session gets a new epoch). On a PostgreSQL store shared by
  several instances each restores only the sessions it made (``owner``: the store's
  stable instance id).
* Leases (``leases``: a ``SessionLeases``, PostgreSQL only; ``acp_server.store.leases``):
  a ``SessionOpened`` takes its session's lease in the commit that carries it; every
  commit is fenced (the records of a session whose token changed are dropped, and
  ``on_moved`` gets those sessions, on the event loop, after the commit: the bridge
  stops them here); ``renew`` runs every ``leases.renew_s`` while open; ``restore``
  brings back the live sessions whose lease this instance still holds;
  ``adopt(session_id)`` takes an expired lease over and reads that session back.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Self

import anyio
import anyio.abc

from acp_server.store.errors import Backoff, StoreUnavailableError
from acp_server.store.leases import SessionLeases
from acp_server.store.pg_engine import PostgresEngine
from acp_server.store.session_leasing import LOST, MAX_LOST, SessionLeasing  # noqa: F401
from acp_server.store.session_reads import SessionReads
from acp_server.store.session_refusals import Refusals, SessionRefusals
from acp_server.store.session_trims import (  # noqa: F401 - TRIM_TERMINALS_EVERY: theirs
    MAX_SESSION_BYTES,
    TRIM_TERMINALS_EVERY,
    SessionTrims,
)
from acp_server.store.session_writes import CommitPlan, Record, SessionWrites
from acp_server.store.write_behind import Marker, WriteBehind
from acp_server.store.writer import Op
from bridge.errors import STOPPING, JournalUnavailableError, SessionMovedError
from bridge.journal import (
    EventRecord,
    EventsReset,
    JournalRecord,
    PromptAccepted,
    PromptSettled,
    RestoredSession,
    SessionEnded,
    SessionOpened,
)

log = logging.getLogger("acp_server.store.sessions")

MAX_PENDING = 200_000
# event envelopes waiting for a store that does not commit: an agent's updates may be
# megabytes each (a stdio line is capped at 64 MiB), so the count alone held gigabytes
MAX_PENDING_BYTES = 256 * 1024 * 1024


CRITICAL = (SessionOpened, PromptAccepted)
SESSION_NOTICE = "s"   # a commit's NOTIFY kind: a session's events or its end (``read_after``)
MOVED = "session moved: another instance holds its lease"


class StoreSessionJournal(SessionLeasing, SessionTrims, SessionWrites, SessionRefusals,
                          SessionReads):
    """See the module docstring. ``store`` is an open ``GroupCommitStore``."""

    durable = True

    def __init__(self, store: Any, *, ring_size: int = 8000,
                 max_session_bytes: int = MAX_SESSION_BYTES,
                 leases: SessionLeases | None = None, write_behind: int = 0,
                 fsync: bool = False) -> None:
        """``write_behind``: the events per session readers may see before their
        commit (``acp_server.store.write_behind``); 0 publishes after commit.
        ``fsync``: every commit of the journal is flushed to the disk (survives a
        power loss), not only written to the store's file (survives ``kill -9``)."""
        self.store = store
        self.fsync = fsync
        self.ring_size = ring_size
        self.max_session_bytes = max_session_bytes
        self._unsized: dict[str, int] = {}   # envelope bytes per session since its trim
        # per session: its settled prompts on disk past the newest MAX_PROMPT_TERMINALS
        # (seeded at restore, updated once a commit has landed: ``_planned``)
        self._untrimmed: dict[str, int] = {}
        self._plan = CommitPlan()   # what the commit in flight trims and counts (``_take``)
        self._statements: dict[tuple[str, int], str] = {}   # multi-row INSERTs by size
        self._write_behind = WriteBehind(write_behind) if write_behind > 0 else None
        self.postgres = isinstance(store, PostgresEngine)
        # A shared (PostgreSQL) store: this instance restores only the sessions it made.
        self.owner: str | None = store.instance if self.postgres else None
        self.leases = leases if self.postgres else None
        self.fence: dict[str, int] = {}   # session id -> the lease token this instance holds
        self._lost: dict[str, None] = {}   # the sessions fenced LOST, oldest first
        self.on_moved: Callable[[set[str]], None] = lambda session_ids: None
        self._renew_now = anyio.Event()
        self.commits = 0
        self._on_events: Callable[[Sequence[EventRecord]], None] = lambda records: None
        self._pending: list[tuple[int, Record]] = []
        self._batch: list[tuple[int, Record]] = []   # the commit in flight
        self._batch_fence: dict[str, int] | None = None
        self._inflight: Op | None = None
        self._unsent: Op | None = None
        self._failing = False
        self._backoff = Backoff(first=0.05, cap=5.0)
        self._next = 1
        self._durable_through = 0
        self._failed: dict[int, str] = {}
        self.refusals = Refusals()   # the records the store refused (session_refusals)
        self._resend = False     # the next commit carries a failed one's records again
        self._batch_resend = False   # ... the commit in flight does (``_drop_covered``)
        self._isolate = False    # the next commit isolates what the store refuses
        self._isolating = False  # the commit in flight does
        self._reepoch: set[str] = set()   # sessions due a new epoch in the next commit
        self._held: set[str] = set()   # sessions whose events are never shed (``hold``)
        self._shed_at = MAX_PENDING   # past this many queued records, ``_shed``
        self._pending_bytes = 0   # the queued events' envelopes
        self._shed_bytes_at = MAX_PENDING_BYTES   # ... past this many bytes too
        self._batch_reepoch: set[str] = set()   # ... in the commit in flight
        self._wake = anyio.Event()
        self._flushed = anyio.Event()
        self._closing = False
        self.closing = anyio.Event()   # set as ``aclose`` begins (the stop): nothing more
        self._stopped = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None

    # -- lifecycle -------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[Self]:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._flusher)
            if self.leases is not None:
                tg.start_soon(self._renewer)
            try:
                yield self
            finally:
                with anyio.CancelScope(shield=True):
                    await self.aclose()
                    await self._release_leases()
                tg.cancel_scope.cancel()   # the renewer

    async def __aenter__(self) -> Self:
        self._exit = contextlib.AsyncExitStack()
        await self._exit.enter_async_context(self.open())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._exit.__aexit__(*exc)

    async def aclose(self) -> None:
        """Commit what is queued (one last attempt), then write nothing more."""
        if not self._closing:
            self._closing = True
            self.closing.set()
            self._kick()
            self._wake.set()
        await self._stopped.wait()

    # -- the SessionJournal protocol -----------------------------------------------------
    def bind(self, on_events: Callable[[Sequence[EventRecord]], None]) -> None:
        self._on_events = on_events

    def append(self, record: JournalRecord) -> int:
        if self._closing:   # a clean stop: nothing more is journaled, nor acknowledged
            return self._refused_at_stop() if isinstance(record, CRITICAL) else 0
        wb = self._write_behind
        if wb is None:
            return self._push(record)
        if isinstance(record, EventRecord):
            marker = wb.before_event(record.session_id, record.event_id, record.epoch)
            if marker is not None:
                self._push(marker)
            seq = self._push(record)
            if wb.early(record.session_id, record.event_id):
                self._on_events([record])   # readers see it now (the window)
            return seq
        if isinstance(record, (PromptAccepted, PromptSettled)):
            wb.prompt(record.session_id, 1 if isinstance(record, PromptAccepted) else -1)
        elif isinstance(record, (SessionEnded, EventsReset)):
            wb.ended(record.session_id)   # a new life counts its events from none
        return self._push(record)

    def _push(self, record: Record) -> int:
        seq = self._next
        self._next += 1
        self._pending.append((seq, record))
        if type(record) is EventRecord:   # (``isinstance`` of a msgspec struct costs more)
            self._pending_bytes += len(record.envelope)
        if self._inflight is None:
            self._kick()
        if self._failing and isinstance(record, CRITICAL):
            self._wake.set()   # somebody waits for it: the backoff ends now
        if len(self._pending) > self._shed_at or self._pending_bytes > self._shed_bytes_at:
            self._shed()
        return seq

    def _refused_at_stop(self) -> int:
        """A record somebody waits for (a session made, a prompt admitted) while the
        stop ends the journal: its sequence number, failed (``wait`` raises
        ``JournalUnavailableError``, its caller answers 503), never 0 (committed)."""
        seq = self._next
        self._next += 1
        self._failed[seq] = STOPPING
        return seq

    @property
    def appended(self) -> int:
        """The last record's sequence number: ``wait_through(appended)`` returns once
        all that was appended so far (and is to commit) is committed (a hand-off, an
        adoption wait for it: issue #24)."""
        return self._next - 1

    async def wait(self, seq: int, *, fail_fast: bool = False) -> None:
        while True:
            failed = self._failed.get(seq)
            if failed is not None:
                raise SessionMovedError(failed) if failed == MOVED \
                    else JournalUnavailableError(failed)
            if seq <= self._durable_through or seq == 0:
                return
            if self._stopped.is_set():
                raise JournalUnavailableError(STOPPING)
            if fail_fast and self._failing:   # kept for the next attempt, not waited for
                raise JournalUnavailableError("the store is unavailable; the record is "
                                              "committed once it is back")
            await self._flushed.wait()

    async def wait_through(self, seq: int, *, fail_fast: bool = False) -> None:
        """A barrier (an adoption, a hand-off: issue #24): once every record through
        ``seq`` that is to commit has committed. One whose commit failed for good (its
        own waiter was told: a session moved, a 503) does not fail it; ``fail_fast``
        as ``wait``'s."""
        while True:
            while seq in self._failed:   # dropped: the barrier is the record before it
                seq -= 1
            try:
                return await self.wait(seq, fail_fast=fail_fast)
            except JournalUnavailableError:
                if seq not in self._failed:
                    raise   # the store is failing (``fail_fast``), or the journal stopped

    # -- committing: one operation of the store's writer at a time ----------------------
    def _kick(self) -> None:
        """Queue the next commit when none is queued or running: its records are taken
        when the writer starts it (``_take``), so whatever is appended meanwhile joins;
        its outcome comes back in ``_landed`` (no task hop either way)."""
        if self._inflight is not None or self._failing or not self._pending \
                or self._stopped.is_set():
            return
        op = Op(self._commit_in, prepare=self._take, on_done=self._landed,
                durable=self.fsync)
        self._inflight = op
        try:
            queued = self.store.submit(op)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._inflight = None
            return
        if not queued:   # the writer's queue is full: the flusher waits for room
            self._unsent = op
            self._wake.set()

    def _take(self) -> None:
        self._batch, self._pending = self._pending, []
        self._shed_at, self._pending_bytes = MAX_PENDING, 0
        self._shed_bytes_at = MAX_PENDING_BYTES
        self._isolating, self._isolate = self._isolate, False
        self._batch_resend, self._resend = self._resend, False
        if self._reepoch:
            self._batch_reepoch, self._reepoch = self._reepoch, set()
        self._plan = self._planned(self._batch)
        # the lease tokens this commit is fenced by, as the batch starts
        self._batch_fence = dict(self.fence) if self.leases is not None else None

    def _commit_in(self, conn: Any, out: Any, *state: Any) -> tuple[Any, ...]:
        """(the leases taken, the sessions fenced out, the records refused: only when
        isolating, ``session_refusals``)."""
        records = [record for _, record in self._batch]
        if self._isolating:
            done: tuple[Any, ...] = self._apply_isolated(conn, records, self._batch_fence)
        else:
            done = (*self._apply(conn, records, self._batch_fence), ())
        if self._batch_reepoch:
            self._reepochs_in(conn, self._batch_reepoch)
        if state and self.postgres:   # readers on other instances wake (issue #24)
            refused = done[1]
            for sid in {r.session_id for r in records if isinstance(r, (EventRecord,
                        SessionEnded)) and r.session_id not in refused}:
                self.store.notice(state[0], SESSION_NOTICE, sid)
        return done

    def _landed(self, op: Op) -> None:
        batch, self._batch = self._batch, []
        self._inflight = None
        plan, self._plan = self._plan, CommitPlan()
        isolated, self._isolating = self._isolating, False
        reepoch, self._batch_reepoch = self._batch_reepoch, set()
        if op.error is not None:   # nothing counted: the records kept are planned again
            self._reepoch |= reepoch
            if self.own_fault(op.error):   # not the store's: find what it refuses
                self._own_failure(batch, op.error, isolated)
                return
            self._failed_batch(batch, op.error)   # type: ignore[arg-type]
            self._failing = True   # the flusher backs off, then commits again
            self._wake.set()
            return
        self._backoff.reset()
        if batch:
            taken, refused, refusals = op.result if op.result is not None \
                else ({}, set(), ())
            if refusals:
                self._refused_landed(batch, refusals)
            self.commits += 1
            plan.count_settled(self._untrimmed)
            for sid, size in plan.unsized.items():
                if sid in refused:
                    continue   # nothing of it was written
                if size is None:
                    self._unsized.pop(sid, None)
                else:
                    self._unsized[sid] = size
            self._committed(batch, taken, refused)
            self._durable_through = batch[-1][0]
            newest = plan.newest   # readers may see each bus's events through it
            self._on_events([r for (sid, _), r in newest.items() if sid not in refused]
                            if refused else list(newest.values()))
            self._signal()
            if self._write_behind is not None:
                self._behind_landed(self._write_behind, batch)
            if refused:
                self.on_moved(refused)
        if self._closing and not self._pending:
            self._wake.set()   # the last commit landed: the flusher ends
        else:
            self._kick()

    def _behind_landed(self, wb: WriteBehind, batch: list[tuple[int, Record]]) -> None:
        touched: set[str] = set()
        for _, record in batch:
            if isinstance(record, EventRecord):
                wb.committed(record.session_id, record.event_id, record.epoch)
            elif isinstance(record, Marker):
                wb.marker_landed(record)
            elif not isinstance(record, PromptSettled):
                continue
            touched.add(record.session_id)
        for marker in wb.quiet(touched):
            self._push(marker)

    async def _flusher(self) -> None:
        """What ``_kick``/``_landed`` cannot do without waiting: a full writer queue,
        the backoff after a failed commit, and the end (``aclose``)."""
        try:
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                if self._unsent is not None:
                    op, self._unsent = self._unsent, None
                    try:
                        await self.store.send(op)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        return
                if self._failing:
                    if self._closing:
                        return
                    with anyio.move_on_after(self._backoff.next()):
                        while not any(isinstance(r, CRITICAL) for _, r in self._pending):
                            await self._wake.wait()
                            self._wake = anyio.Event()
                    self._failing = False
                    self._kick()
                if self._closing and self._inflight is None and not self._pending:
                    return
        finally:
            self._closing = True
            self._stopped.set()
            self._signal()

    def _committed(self, batch: list[tuple[int, Record]], taken: dict[str, int],
                   refused: set[str]) -> None:
        """The leases a commit took, ended or found lost (see the module docstring)."""
        if self.leases is None:
            return   # no fence to keep (SQLite)
        self.fence.update(taken)
        for seq, record in batch:
            if record.session_id in refused:
                if isinstance(record, CRITICAL):
                    self._failed[seq] = MOVED
            elif isinstance(record, SessionEnded):
                self.fence.pop(record.session_id, None)
        for sid in refused:
            self.lose(sid)

    def _signal(self) -> None:
        self._flushed.set()
        self._flushed = anyio.Event()

    def _failed_batch(self, batch: list[tuple[int, Record]], exc: Exception) -> None:
        reason = exc.reason if isinstance(exc, StoreUnavailableError) else str(exc)
        log.warning("session journal: a commit failed (%s); retrying", reason)
        keep = []
        for seq, record in batch:
            if isinstance(record, CRITICAL):
                self._failed[seq] = reason
            else:
                keep.append((seq, record))
        if len(self._failed) > 65536:   # nobody waits for the oldest any more
            for seq in sorted(self._failed)[:32768]:
                del self._failed[seq]
        self._requeue(keep)
        self._resend = True   # it may have landed, its answer lost: ``_drop_covered``
        self._signal()

    def hold(self, session_id: str, held: bool) -> None:
        """While ``held``, none of the session's events is shed (``_shed``): a turn
        waits for its start's commit (``SessionJournal.hold``)."""
        if held:
            self._held.add(session_id)
        else:
            self._held.discard(session_id)

    def _requeue(self, items: list[tuple[int, Record]]) -> None:
        """A failed commit's records, back at the head of the queue, in order."""
        self._pending[:0] = items
        self._pending_bytes += envelope_bytes(items)

    def _shed(self) -> None:
        """Too much waits for a store that does not commit: the oldest events go to
        readers unjournaled (the next start gives their session a new epoch), but for
        those of the sessions ``hold`` keeps (each bounded by its bus's journal window):
        past ``MAX_PENDING`` records the oldest half of them, past ``MAX_PENDING_BYTES``
        the oldest events until half of that is left; so the next shed comes once
        another half of either is queued."""
        half, held = MAX_PENDING // 2, self._held
        by_count = len(self._pending) > self._shed_at
        left = self._pending_bytes
        target = MAX_PENDING_BYTES // 2 if left > self._shed_bytes_at else left
        pending, kept, shed, end = self._pending, [], [], 0
        while end < len(pending) and ((by_count and end < half) or left > target):
            record = pending[end][1]
            if isinstance(record, EventRecord) and record.session_id not in held:
                shed.append(record)
                left -= len(record.envelope)
            else:
                kept.append(pending[end])
            end += 1
        self._pending = kept + pending[end:]
        self._pending_bytes = left
        self._shed_at = max(MAX_PENDING, len(self._pending) + half)
        self._shed_bytes_at = max(MAX_PENDING_BYTES, left + MAX_PENDING_BYTES // 2)
        log.error("session journal: %d events let through unjournaled (the store does not "
                  "commit)", len(shed))
        self._reepoch.update(r.session_id for r in shed)   # a new epoch, next commit
        self._on_events(shed)


def envelope_bytes(items: Sequence[tuple[int, Record]]) -> int:
    """The envelopes' bytes of the events among ``items``."""
    return sum(len(record.envelope) for _, record in items if isinstance(record, EventRecord))
