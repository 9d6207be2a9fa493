"""The task store interface, implemented by SQLite (``sqlite``) and PostgreSQL (``postgres``).

    store = SqliteTaskStore(path, on_commit=hub.publish)
    async with store:
        outcome = await store.create_task(new, event0, idem)       # durable on return
        won = await store.transition(task_id, ("running",), "succeeded", finish)

Contracts every implementation keeps (the test-suite in ``tests/lmsp`` is
parametrizable over stores through the ``store_factory`` fixture):

* A method returns only after its writes are durably committed (fsync).
* Each status change is ONE conditional update (``WHERE status IN from_states``);
  events produced by a transition are inserted in the same transaction, with numbers
  taken from ``tasks.next_seq`` in that transaction: gapless, never reused.
* A terminal status is never left; only the winning transition writes its events.
* ``on_commit(events)`` is called after the commit, in commit order, with every event
  the transaction wrote: the only way events reach live subscribers.
* ``create_task`` writes the task row, event 0 and the idempotency key in one
  transaction; a key already present answers with its task (``replayed``) or raises
  ``KeyReusedError`` for a different fingerprint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeGuard

import msgspec

from acp_server.store.errors import StoreHealth

# An event draft: a msgspec Struct whose fields include ``type`` and ``sequence_number``
# (a door's wire type, e.g. ``acp_server.lmsp.wire``); the store numbers and encodes it.
AnyEvent = Any
encode = msgspec.json.Encoder().encode

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
ACTIVE = frozenset({"loading", "running", "cancelling"})


@dataclasses.dataclass(frozen=True, slots=True)
class TaskRecord:
    id: str
    response_id: str
    status: str
    on_restart: str
    model: str
    principal: str
    request: bytes          # the response request, JSON
    created_at: float
    updated_at: float
    finished_at: float | None
    next_seq: int           # number the next event will get
    attempt: int            # attempts started (claims)
    response: bytes | None  # final ResponseObject JSON (any terminal status)
    error: bytes | None     # problem object JSON when failed
    events_purged: bool


@dataclasses.dataclass(frozen=True, slots=True)
class CommittedEvent:
    task_id: str
    seq: int
    type: str
    data: bytes             # the event JSON exactly as sent


@dataclasses.dataclass(frozen=True, slots=True)
class NewTask:
    id: str
    response_id: str
    on_restart: str
    model: str
    principal: str
    request: bytes
    created_at: float


@dataclasses.dataclass(frozen=True, slots=True)
class IdempotencyClaim:
    scope: str              # principal + route
    key: str
    fingerprint: str
    expires_at: float


@dataclasses.dataclass(frozen=True, slots=True)
class CreateOutcome:
    task: TaskRecord
    replayed: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Finish:
    """What a winning transition writes besides the status."""

    events: Sequence[AnyEvent] = ()
    response: bytes | None = None
    error: bytes | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Transition:
    task: TaskRecord        # the row after the update
    events: list[CommittedEvent]
    previous: str = ""      # the status it left


@dataclasses.dataclass(frozen=True, slots=True)
class RecoveryReport:
    failed: int = 0
    requeued: int = 0
    cancelled: int = 0


class KeyReusedError(Exception):
    """The idempotency key exists with another fingerprint (422)."""


class QueueFullError(Exception):
    """``max_queued`` tasks are already queued (503 ``prompt_queue_full``)."""

    def __init__(self, limit: int, pending: int) -> None:
        super().__init__(f"{pending} tasks queued (limit {limit})")
        self.limit = limit
        self.pending = pending


# Builds what a transition writes from the row as read in the transaction.
FinishFactory = Callable[[TaskRecord], Finish]
# (row, target status) -> what recovery writes for it
RecoveryFactory = Callable[[TaskRecord, str], Finish]


class TaskStore(Protocol):
    # Called after each commit with the events it wrote (``open_lmsp`` sets it).
    on_commit: Callable[[list[CommittedEvent]], None] | None
    # Transactions committed so far (group commit is observable through it).
    commits: int
    # Called after each commit with the status each committed transition moved a
    # task to (``moves_of``); the metrics set it.
    on_transition: Callable[[str], None] | None
    # What the store knows of its own availability (``errors.StoreHealth``).
    health: StoreHealth
    # Several server instances share the store: the service then renews leases,
    # recovers expired ones and polls (``SharedTaskStore``, ``is_shared``).
    shared: bool

    async def __aenter__(self) -> TaskStore: ...
    async def __aexit__(self, *exc: object) -> None: ...

    async def create_task(self, task: NewTask, event0: AnyEvent,
                          idem: IdempotencyClaim | None, *,
                          timeout: float | None = None,
                          max_queued: int | None = None) -> CreateOutcome:
        """``QueueFullError`` when ``max_queued`` tasks are queued already (checked after
        the idempotency key, so a replay never fails on it).
        ``TimeoutError`` when the commit is not seen within ``timeout`` (the write
        may still land; an idempotent retry then replays it)."""

    async def get_task(self, task_id: str) -> TaskRecord | None:
        """The task, or ``None``: also for any string a client sends (a NUL in it, 10 000
        characters), never an error of the engine's."""

    async def get_by_response(self, response_id: str) -> TaskRecord | None:
        """The task that produces ``response_id`` (indexed); ``None`` as ``get_task``."""

    async def get_keyed(self, idem: IdempotencyClaim, now: float) -> TaskRecord | None:
        """The task a live key names with the same fingerprint (a read: nothing is
        claimed or deleted), else ``None``."""

    async def delete_task(self, task_id: str) -> bool:
        """Deletes a *finished* task with its events and idempotency keys, in one
        transaction; ``False`` when it is unfinished or gone."""

    async def list_tasks(self, principal: str | None, *, status: str | None, after: str | None,
                         limit: int, finished_since: float | None = None,
                         after_by_id: bool = False) -> list[TaskRecord]:
        """Up to ``limit`` of ``principal``'s tasks (``None``: everyone's), newest
        first, created before the task ``after`` (``GET /lmsp/v1/tasks``); with
        ``after_by_id``, before the id ``after`` in id order (ids are time-ordered),
        for an anchor that is gone; with ``finished_since``, only those not finished
        before it (retention)."""

    async def claim_next(self, now: float) -> TaskRecord | None:
        """The oldest ``queued`` task → ``loading`` (attempt + 1), or ``None``."""

    async def claim(self, now: float, limit: int) -> list[TaskRecord]:
        """Up to ``limit`` of the oldest ``queued`` tasks → ``loading``, in one write."""

    async def transition(self, task_id: str, from_states: Sequence[str], to_state: str,
                         finish: FinishFactory | Finish | None = None, *,
                         now: float) -> Transition | None:
        """``None`` when the task was not in ``from_states`` (another commit won)."""

    async def unclaim(self, task_id: str, *, now: float) -> bool:
        """``loading`` → ``queued`` undoing the claim (its attempt not counted; no
        events): the runner could not start it yet. ``False`` when no longer loading."""

    async def append_events(self, task_id: str, events: Sequence[AnyEvent],
                            while_states: Sequence[str]) -> list[CommittedEvent] | None:
        """Non-state events (deltas); ``None`` when the task left ``while_states``."""

    async def request_cancel(self, task_id: str, finish: FinishFactory, *,
                             now: float) -> tuple[TaskRecord | None, bool]:
        """queued → cancelled (writing ``finish``), loading/running → cancelling;
        otherwise unchanged. Returns (row after, changed)."""

    async def read_events(self, task_id: str, after: int, limit: int) -> list[CommittedEvent]: ...

    async def recover(self, factory: RecoveryFactory, *, max_attempts: int,
                      now: float, own: bool = False) -> RecoveryReport:
        """Startup: every loading/running/cancelling task per its ``on_restart``
        (``own``: the start-up call; a shared store then also takes this instance's
        own tasks, whatever their lease)."""

    async def purge(self, *, now: float, event_retention: float, task_retention: float,
                    key_ttl: float) -> int: ...

    async def status_counts(self) -> dict[str, int]:
        """Tasks in the store by status (``STATUS_COUNTS_SQL``)."""

    async def probe(self, timeout: float = 2.0) -> str | None:
        """``None`` when the store serves, else why not (``/health?deep=1``)."""


class SharedTaskStore(TaskStore, Protocol):
    """A store several instances share (PostgreSQL): leases and cross-instance notices."""

    # Another instance committed: ``(kind, task_id)``, kind ``e`` events, ``q`` queued
    # work, ``c`` cancel requested (hints only; the service also polls).
    on_notify: Callable[[str, str], None] | None
    renew_s: float
    poll_s: float

    async def renew_leases(self) -> tuple[set[str], set[str]]: ...
    async def taken_over(self, task_ids: Sequence[str]) -> list[str]: ...
    async def next_seqs(self, task_ids: Sequence[str]) -> dict[str, int]: ...
    async def cancelling_among(self, task_ids: Sequence[str]) -> list[str]: ...


def is_shared(store: TaskStore) -> TypeGuard[SharedTaskStore]:
    """The store's own word (``shared``) that it is a ``SharedTaskStore``."""
    return store.shared


# The task columns, in the order ``record_from_row`` reads them (both stores' SQL).
COLUMNS = ("id, response_id, status, on_restart, model, principal, request, created_at, "
           "updated_at, finished_at, next_seq, attempt, response, error, events_purged")


def record_from_row(row: Sequence[Any]) -> TaskRecord:
    """A ``TaskRecord`` from a row of ``COLUMNS`` (blobs as bytes, flags as bool)."""
    return TaskRecord(row[0], row[1], row[2], row[3], row[4], row[5], bytes(row[6]), row[7],
                      row[8], row[9], row[10], row[11],
                      None if row[12] is None else bytes(row[12]),
                      None if row[13] is None else bytes(row[13]), bool(row[14]))


def queued_record(task: NewTask) -> TaskRecord:
    """The record of a task just created (what its INSERT wrote)."""
    return TaskRecord(task.id, task.response_id, "queued", task.on_restart, task.model,
                      task.principal, task.request, task.created_at, task.created_at, None, 1,
                      0, None, None, False)


def delete_statements(p: str, task_id: str) -> list[tuple[str, tuple[Any, ...]]]:
    """``delete_task`` as (SQL, params) for either store, the task row first (its row
    count says whether anything was deleted: only a finished task is)."""
    finished = ", ".join(f"'{status}'" for status in sorted(TERMINAL))
    return [
        (f"DELETE FROM tasks WHERE id = {p} AND status IN ({finished})", (task_id,)),
        (f"DELETE FROM task_events WHERE task_id = {p}", (task_id,)),
        (f"DELETE FROM idempotency_keys WHERE task_id = {p}", (task_id,)),
    ]
# Tasks by status (both stores; an index-only scan of ``tasks_status``).
STATUS_COUNTS_SQL = "SELECT status, COUNT(*) FROM tasks GROUP BY status"


def moves_of(result: Any) -> list[str]:
    """The statuses a committed write moved tasks to, read from what the write
    returned: a created task (``queued``), a claim (``loading``), a ``Transition``,
    a changed ``request_cancel``, a ``RecoveryReport``; nothing for other writes.
    Stores call ``on_transition`` with each, after the commit."""
    if isinstance(result, Transition):
        return [result.task.status]
    if isinstance(result, CreateOutcome):
        return [] if result.replayed else ["queued"]
    if isinstance(result, TaskRecord):
        return [result.status]
    if isinstance(result, list):   # a claim of several
        return [r.status for r in result if isinstance(r, TaskRecord)]
    if isinstance(result, RecoveryReport):
        return ["failed"] * result.failed + ["queued"] * result.requeued \
            + ["cancelled"] * result.cancelled
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], TaskRecord) \
            and result[1] is True:
        return [result[0].status]
    return []


UNCLAIM: Extra = (", attempt = attempt - 1", ())


class ClaimsOne:
    """``TaskStore.claim_next`` for a store whose ``claim`` takes many in one write."""

    async def claim(self, now: float, limit: int) -> list[TaskRecord]:
        raise NotImplementedError

    async def claim_next(self, now: float) -> TaskRecord | None:
        claimed = await self.claim(now, 1)
        return claimed[0] if claimed else None


class ObservedMoves:
    """``TaskStore.on_transition`` for a ``GroupCommitStore``: its ``_observe`` hook."""

    on_transition: Callable[[str], None] | None = None

    def _observe(self, result: Any) -> None:
        if self.on_transition is not None:
            for status in moves_of(result):
                self.on_transition(status)


def restart_target(status: str, on_restart: str, attempt: int, max_attempts: int) -> str:
    """Where an unfinished task goes when what ran it is gone (a restart, an expired
    lease, a dead agent): ``cancelling`` → ``cancelled`` whatever the policy; ``retry``
    with attempts left → ``queued``; anything else → ``failed``."""
    if status == "cancelling":
        return "cancelled"
    if on_restart == "retry" and attempt < max_attempts:
        return "queued"
    return "failed"


def purge_statements(p: str, *, now: float, event_retention: float,
                     task_retention: float) -> list[tuple[str, tuple[Any, ...]]]:
    """The retention purge as (SQL, params) for either store (``p`` is the driver's
    placeholder). The row counts of the first and the last statement add up to what
    was purged: the events of tasks past ``event_retention`` (their tasks are marked),
    then everything of tasks past ``task_retention``, and expired idempotency keys."""
    ended = f"SELECT id FROM tasks WHERE finished_at IS NOT NULL AND finished_at < {p}"
    events_before, tasks_before = now - event_retention, now - task_retention
    return [
        (f"DELETE FROM task_events WHERE task_id IN ({ended} AND events_purged = {p})",
         (events_before, False)),
        (f"UPDATE tasks SET events_purged = {p} WHERE finished_at IS NOT NULL "
         f"AND finished_at < {p} AND events_purged = {p}", (True, events_before, False)),
        (f"DELETE FROM task_events WHERE task_id IN ({ended})", (tasks_before,)),
        (f"DELETE FROM idempotency_keys WHERE expires_at < {p} OR task_id IN ({ended})",
         (now, tasks_before)),
        (f"DELETE FROM tasks WHERE finished_at IS NOT NULL AND finished_at < {p}",
         (tasks_before,)),
    ]


def list_statement(p: str, *, principal: str | None, status: str | None, after: str | None,
                   limit: int, finished_since: float | None = None,
                   after_by_id: bool = False, binary: str = ""
                   ) -> tuple[str, tuple[Any, ...]]:
    """The page query as (SQL, params) for either store (``p`` is the placeholder,
    ``binary`` the collation clause of a bytewise text comparison): ``limit`` rows of
    ``COLUMNS``, newest first, older than the task ``after`` (with ``after_by_id``:
    whose id sorts before ``after``); ``principal`` ``None``: every principal's."""
    where: list[str] = ["1 = 1"] if principal is None else [f"principal = {p}"]
    params: list[Any] = [] if principal is None else [principal]
    if status is not None:
        where.append(f"status = {p}")
        params.append(status)
    if after is not None:
        where.append(f"id{binary} < {p}" if after_by_id
                     else f"seq < (SELECT seq FROM tasks WHERE id = {p})")
        params.append(after)
    if finished_since is not None:
        where.append(f"(finished_at IS NULL OR finished_at >= {p})")
        params.append(finished_since)
    sql = f"SELECT {COLUMNS} FROM tasks WHERE {' AND '.join(where)} ORDER BY seq DESC LIMIT {p}"
    return sql, (*params, limit)


# -- the operations both stores run, on a DB-API connection (``conn.execute``) ------------
# Extra SQL of one statement: (clause, its params).
Extra = tuple[str, Sequence[Any]]
NO_EXTRA: Extra = ("", ())
# Events per SQLite INSERT (4 parameters each: far below SQLite's 32,766 and the 999
# of builds before 3.32); each row count is its own statement in the connection's cache.
EVENT_ROWS = 64
_INSERT_EVENTS = "INSERT INTO task_events(task_id, seq, type, data) VALUES "


class Dialect:
    """What differs in the two engines' SQL; SQLite's here, PostgreSQL's in ``postgres``."""

    p = "?"              # the driver's placeholder
    binary = ""          # a text comparison byte by byte (SQLite's default BINARY)
    lock = ""            # appended to the read of a row the transaction will update
    skip_locked = ""     # appended to the claim's pick of the oldest queued task

    def insert_events(self, conn: Any, task_id: str, first_seq: int,
                      events: Sequence[AnyEvent], out: list[CommittedEvent]) -> None:
        """Numbers ``events`` from ``first_seq``, inserts them, appends them to ``out``:
        one multi-row INSERT per ``EVENT_ROWS`` (``executemany`` steps once per row, and
        every step gives up the interpreter lock and must win it back from the loop)."""
        rows = numbered(task_id, first_seq, events, out)
        for start in range(0, len(rows), EVENT_ROWS):
            chunk = rows[start:start + EVENT_ROWS]
            conn.execute(_INSERT_EVENTS + ",".join(["(?,?,?,?)"] * len(chunk)),
                         [v for e in chunk for v in (e.task_id, e.seq, e.type, e.data)])

    def select_task(self, conn: Any, task_id: str, lock: bool = False) -> TaskRecord | None:
        row = conn.execute(f"SELECT {COLUMNS} FROM tasks WHERE id = {self.p}"
                           f"{self.lock if lock else ''}", (task_id,)).fetchone()
        return None if row is None else record_from_row(row)

    def _key_row(self, conn: Any, idem: IdempotencyClaim, *, lock: bool = False) -> Any:
        """(fingerprint, task id, expires_at) of ``idem``'s key, or ``None``."""
        return conn.execute(f"SELECT fingerprint, task_id, expires_at FROM idempotency_keys "
                            f"WHERE scope = {self.p} AND key = {self.p}"
                            f"{self.lock if lock else ''}", (idem.scope, idem.key)).fetchone()

    def select_keyed(self, conn: Any, idem: IdempotencyClaim, now: float) -> TaskRecord | None:
        row = self._key_row(conn, idem)
        if row is None or row[0] != idem.fingerprint or row[2] <= now:
            return None
        return self.select_task(conn, row[1])

    def select_by_response(self, conn: Any, response_id: str) -> TaskRecord | None:
        row = conn.execute(f"SELECT {COLUMNS} FROM tasks WHERE response_id = {self.p}",
                           (response_id,)).fetchone()
        return None if row is None else record_from_row(row)

    def select_page(self, conn: Any, principal: str | None, status: str | None, after: str | None,
                    limit: int, finished_since: float | None = None,
                    after_by_id: bool = False) -> list[TaskRecord]:
        sql, params = list_statement(self.p, principal=principal, status=status, after=after,
                                     limit=limit, finished_since=finished_since,
                                     after_by_id=after_by_id, binary=self.binary)
        return [record_from_row(r) for r in conn.execute(sql, params).fetchall()]

    def select_events(self, conn: Any, task_id: str, after: int,
                      limit: int) -> list[CommittedEvent]:
        rows = conn.execute(
            f"SELECT seq, type, data FROM task_events WHERE task_id = {self.p} AND seq > {self.p} "
            f"ORDER BY seq LIMIT {self.p}", (task_id, after, limit)).fetchall()
        return [CommittedEvent(task_id, r[0], r[1], bytes(r[2])) for r in rows]

    def select_counts(self, conn: Any) -> dict[str, int]:
        return dict(conn.execute(STATUS_COUNTS_SQL).fetchall())

    def replay_key(self, conn: Any, idem: IdempotencyClaim,
                   created_at: float) -> CreateOutcome | None:
        """The task a live key already names (``replayed``; ``KeyReusedError`` for another
        fingerprint), else ``None`` after deleting a stale key: the caller inserts it."""
        p = self.p
        row = self._key_row(conn, idem, lock=True)
        existing = self.select_task(conn, row[1]) if row is not None else None
        if row is not None and existing is not None and row[2] > created_at:
            if row[0] != idem.fingerprint:
                raise KeyReusedError(idem.key)
            return CreateOutcome(existing, replayed=True)
        if row is not None:
            conn.execute(f"DELETE FROM idempotency_keys WHERE scope = {p} AND key = {p}",
                         (idem.scope, idem.key))
        return None

    def delete_finished(self, conn: Any, task_id: str) -> bool:
        """``TaskStore.delete_task`` inside the caller's transaction."""
        (first, first_params), *rest = delete_statements(self.p, task_id)
        if conn.execute(first, first_params).rowcount == 0:
            return False
        for sql, params in rest:
            conn.execute(sql, params)
        return True

    def purge_tasks(self, conn: Any, *, now: float, event_retention: float,
                    task_retention: float) -> int:
        counts = [conn.execute(sql, params).rowcount for sql, params in purge_statements(
            self.p, now=now, event_retention=event_retention, task_retention=task_retention)]
        return counts[0] + counts[-1]

    def claim_oldest(self, conn: Any, now: float, set_extra: Extra = NO_EXTRA,
                     limit: int = 1) -> list[TaskRecord]:
        """The ``limit`` oldest ``queued`` tasks → ``loading`` (attempt + 1), in one
        statement, oldest first."""
        p = self.p
        rows = conn.execute(
            f"UPDATE tasks SET status = 'loading', attempt = attempt + 1, updated_at = {p}"
            f"{set_extra[0]} WHERE seq IN (SELECT seq FROM tasks WHERE status = 'queued' "
            f"ORDER BY seq LIMIT {p}{self.skip_locked}) AND status = 'queued' "
            f"RETURNING {COLUMNS}", (now, *set_extra[1], limit)).fetchall()
        return sorted(map(record_from_row, rows), key=lambda r: r.id)

    def transition_in(self, conn: Any, out: list[CommittedEvent], task_id: str,
                      from_states: Sequence[str], to_state: str,
                      finish: FinishFactory | Finish | None, now: float, *,
                      set_extra: Extra = NO_EXTRA, where_extra: Extra = NO_EXTRA
                      ) -> Transition | None:
        """One conditional UPDATE and its events, in the caller's transaction. The row is
        read first (locked where the engine locks) when ``finish`` is a factory, so it
        sees what it updates, or when several ``from_states`` are allowed; a ready
        ``Finish`` from one state is a single UPDATE.
        ``None`` = the task was not in ``from_states`` (another commit won)."""
        if callable(finish) or len(from_states) != 1:
            current = self.select_task(conn, task_id, lock=True)
            if current is None or current.status not in from_states:
                return None
            done, previous = finish(current) if callable(finish) else (finish or Finish()), \
                current.status
        else:   # nothing to read first: the conditional UPDATE decides alone
            done, previous = finish or Finish(), from_states[0]
        p = self.p
        marks = ",".join([p] * len(from_states))
        row = conn.execute(
            f"UPDATE tasks SET status = {p}, updated_at = {p}, next_seq = next_seq + {p}, "
            f"finished_at = CASE WHEN {p} THEN {p} ELSE finished_at END, "
            f"response = COALESCE({p}, response), error = COALESCE({p}, error){set_extra[0]} "
            f"WHERE id = {p} AND status IN ({marks}){where_extra[0]} RETURNING {COLUMNS}",
            (to_state, now, len(done.events), to_state in TERMINAL, now, done.response,
             done.error, *set_extra[1], task_id, *from_states, *where_extra[1])).fetchone()
        if row is None:
            return None
        record = record_from_row(row)
        events: list[CommittedEvent] = []
        self.insert_events(conn, task_id, record.next_seq - len(done.events), done.events, events)
        out.extend(events)
        return Transition(record, events, previous)

    def append_in(self, conn: Any, out: list[CommittedEvent], task_id: str,
                  events: Sequence[AnyEvent], while_states: Sequence[str],
                  where_extra: Extra = NO_EXTRA) -> list[CommittedEvent] | None:
        """``TaskStore.append_events`` inside the caller's transaction."""
        p = self.p
        marks = ",".join([p] * len(while_states))
        row = conn.execute(
            f"UPDATE tasks SET next_seq = next_seq + {p} WHERE id = {p} AND status IN ({marks})"
            f"{where_extra[0]} RETURNING next_seq",
            (len(events), task_id, *while_states, *where_extra[1])).fetchone()
        if row is None:
            return None
        self.insert_events(conn, task_id, row[0] - len(events), events, out)
        return list(out)


def numbered(task_id: str, first_seq: int, events: Sequence[AnyEvent],
             out: list[CommittedEvent]) -> list[CommittedEvent]:
    """``events`` encoded with their sequence numbers (also appended to ``out``)."""
    done = [CommittedEvent(task_id, first_seq + i, draft.type,
                           encode(msgspec.structs.replace(draft, sequence_number=first_seq + i)))
            for i, draft in enumerate(events)]
    out.extend(done)
    return done


# (from states, to state, finish) -> the transition, or None when it lost
Step = Callable[[Sequence[str], str, FinishFactory | None], Transition | None]
# the same for the task given first
TaskStep = Callable[[str, Sequence[str], str, FinishFactory | None], Transition | None]


def cancel_in(step: Step, finish: FinishFactory,
              current: Callable[[], TaskRecord | None]) -> tuple[TaskRecord | None, bool]:
    """``TaskStore.request_cancel`` with the store's transition ``step``."""
    won = step(("queued",), "cancelled", finish)
    if won is None:   # any instance may ask; the owner finishes it
        won = step(("loading", "running"), "cancelling", None)
    if won is not None:
        return won.task, True
    return current(), False


def recover_rows(rows: Sequence[Sequence[Any]], step: TaskStep, factory: RecoveryFactory,
                 max_attempts: int) -> RecoveryReport:
    """``recover`` over rows of (id, status, on_restart, attempt), each per its
    ``restart_target``."""
    counts = {"failed": 0, "queued": 0, "cancelled": 0}
    for task_id, status, policy, attempt in rows:
        target = restart_target(status, policy, attempt, max_attempts)
        finish = None if target == "queued" else (lambda rec, t=target: factory(rec, t))
        if step(task_id, (status,), target, finish) is not None:
            counts[target] += 1
    return RecoveryReport(failed=counts["failed"], requeued=counts["queued"],
                          cancelled=counts["cancelled"])
