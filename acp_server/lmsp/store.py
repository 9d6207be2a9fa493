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
from typing import Any, Protocol

from acp_server.lmsp.wire import AnyEvent

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

    async def get_task(self, task_id: str) -> TaskRecord | None: ...

    async def get_by_response(self, response_id: str) -> TaskRecord | None:
        """The task that produces ``response_id`` (indexed)."""

    async def delete_task(self, task_id: str) -> bool:
        """Deletes a *finished* task with its events and idempotency keys, in one
        transaction; ``False`` when it is unfinished or gone."""

    async def list_tasks(self, principal: str, *, status: str | None, after: str | None,
                         limit: int) -> list[TaskRecord]:
        """Up to ``limit`` of ``principal``'s tasks, newest first, created before the
        task ``after`` (``GET /lmsp/v1/tasks``)."""

    async def claim_next(self, now: float) -> TaskRecord | None:
        """The oldest ``queued`` task → ``loading`` (attempt + 1), or ``None``."""

    async def transition(self, task_id: str, from_states: Sequence[str], to_state: str,
                         finish: FinishFactory | Finish | None = None, *,
                         now: float) -> Transition | None:
        """``None`` when the task was not in ``from_states`` (another commit won)."""

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
    if isinstance(result, RecoveryReport):
        return ["failed"] * result.failed + ["queued"] * result.requeued \
            + ["cancelled"] * result.cancelled
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], TaskRecord) \
            and result[1] is True:
        return [result[0].status]
    return []


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


def list_statement(p: str, *, principal: str, status: str | None, after: str | None,
                   limit: int) -> tuple[str, tuple[Any, ...]]:
    """The page query as (SQL, params) for either store (``p`` is the placeholder):
    ``limit`` rows of ``COLUMNS``, newest first, older than the task ``after``."""
    where, params = [f"principal = {p}"], [principal]
    if status is not None:
        where.append(f"status = {p}")
        params.append(status)
    if after is not None:
        where.append(f"seq < (SELECT seq FROM tasks WHERE id = {p})")
        params.append(after)
    sql = f"SELECT {COLUMNS} FROM tasks WHERE {' AND '.join(where)} ORDER BY seq DESC LIMIT {p}"
    return sql, (*params, limit)
