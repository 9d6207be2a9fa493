"""The LMSP service: store + runner + live hub + retention, behind ``open_lmsp``.

    async with Bridge(factory, workspace_cwd=ws) as bridge, \\
            open_lmsp(bridge, store_url="sqlite:///var/lib/acp/lmsp.db", state_dir=ws) as lmsp:
        routes = acp_server.lmsp.routes(lmsp)      # composed by acp_server.server

Contracts:

* ``open_lmsp`` opens the store, runs restart recovery (§7.5) BEFORE the runner
  starts, then runs the runner and the periodic retention purge in its own task
  group; leaving it stops them (running tasks stay ``loading``/``running`` in the
  store: the next start applies their ``on_restart``) and closes the store.
  ``service.stop()`` does the stopping part early (a drain calls it before closing
  the bridge, so closing sessions does not fail the tasks).
* With a shared store (PostgreSQL, several instances), the background also renews
  this instance's leases, recovers expired ones (any instance's) per ``on_restart``,
  and turns other instances' notices into wake-ups (runner, live subscribers,
  cancels), with polling every ``poll_s`` as the fallback.
* ``model`` names an agent of the bridge (``bridge.agents.names``: the default agent,
  every configured one and ``--model-server``'s models, those listed later included:
  ``acp_server.lmsp.models``; the composition always configures ``reference``), or
  what ``models`` maps to a bridge and agent. A model nobody knows is looked for
  (``refresh_models``) before a task naming it is refused, or, queued, fails.
* Retention (§11.2) is judged by the clock (``LmspConfig.clock``), not by the purge: a
  task finished more than ``task_retention_s`` ago is 404 and its events more than
  ``event_retention_s`` ago are 410 even before the purge deletes them.
* Ownership (``acp_server.principals``): a task (and its response) belongs to the
  principal that created it (``TaskRecord.principal``). Every read, stream, cancel
  and delete made for a ``Caller`` answers 404 (``task_not_found`` /
  ``response_not_found``) when the caller may not see it (``Caller.sees``: its own,
  an admin's view, ``--share-sessions``); the same for ``previous_response_id``.
  Calls without a caller are the server's own (the runner, a dropped stream's cancel).
  Creating a task and cancelling one are audit records (``task.created``,
  ``task.cancelled``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping

import anyio
import anyio.abc
import msgspec

from acp_server.store import store_for
from acp_server.store.errors import Backoff, StoreUnavailableError
from acp_server.store.hub import Hub
from acp_server.lmsp.conversation import MAX_HISTORY_CHARS
from acp_server.lmsp.models import BridgeModels, available, refresh_models
from acp_server.lmsp.problems import LmspError, shown
from acp_server.lmsp.requests import ResponseRequest, decode_stored
from acp_server.lmsp.responses import (
    base_response,
    created_event,
    error_finish,
    recovery_finish,
)
from acp_server.lmsp.runner import Runner
from acp_server.lmsp.task_events import batches
from acp_server.principals import Caller
from acp_server.principals.audit import PROMPT_TEXT_MAX
from acp_server.store.tasks import (
    TERMINAL,
    CommittedEvent,
    IdempotencyClaim,
    KeyReusedError,
    NewTask,
    QueueFullError,
    RecoveryReport,
    SharedTaskStore,
    TaskRecord,
    TaskStore,
    is_shared,
    queued_record,
)
from acp_server.lmsp.wire import (
    Capabilities,
    CapabilityFlags,
    Limits,
    TaskObject,
    encode,
)
from bridge import Bridge
from bridge.ids import random_bits

log = logging.getLogger("acp_server.lmsp")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]   # 10 bits → two characters


def new_id(prefix: str) -> str:
    """``prefix_`` + a ULID (48-bit ms time, 80 random bits, Crockford base32: 26
    characters of 5 bits, the first two bits zero)."""
    value = (time.time_ns() // 1_000_000) << 80 | random_bits(80)   # bridge.ids: pooled
    return f"{prefix}_{crockford(value)}"


def crockford(value: int) -> str:
    """A 128-bit value in 26 Crockford base32 characters, the most significant first."""
    p = _PAIRS
    return (f"{p[value >> 120 & 1023]}{p[value >> 110 & 1023]}"
            f"{p[value >> 100 & 1023]}{p[value >> 90 & 1023]}{p[value >> 80 & 1023]}"
            f"{p[value >> 70 & 1023]}{p[value >> 60 & 1023]}{p[value >> 50 & 1023]}"
            f"{p[value >> 40 & 1023]}{p[value >> 30 & 1023]}{p[value >> 20 & 1023]}"
            f"{p[value >> 10 & 1023]}{p[value & 1023]}")


def _hidden(record: TaskRecord | None, caller: Caller | None, path: str) -> bool:
    """Whether ``record`` is there but not ``caller``'s to see (answered as unknown); a
    probe of another principal's task is an audit record (``not_owner``)."""
    if record is None or caller is None or caller.sees(record.principal):
        return False
    if record.principal is not None:
        caller.not_owner(record.id, path)
    return True


@dataclasses.dataclass(frozen=True, slots=True)
class LmspConfig:
    event_retention_s: float = 600
    task_retention_s: float = 86400
    idempotency_ttl_s: float = 86400
    max_request_bytes: int = 1 << 20
    purge_interval_s: float = 60
    max_attempts: int = 3
    keepalive_s: float = 15
    idempotency_wait_s: float = 10
    max_queued_tasks: int | None = 10_000
    live_sessions: int = 8          # ACP sessions kept for previous_response_id (LRU)
    history_chars: int = MAX_HISTORY_CHARS   # a fresh session's history: the newest, at most
    cancel_wait_s: float = 10       # POST /responses/{id}/cancel waits this for the stop
    permission_policy: str = "reject"   # --lmsp-permissions (acp_server/lmsp/permissions.py)
    # Wall-clock seconds for created/finished times, retention and the purge (tests
    # inject a fake one). Leases are on the database clock (``postgres``).
    clock: Callable[[], float] = dataclasses.field(default=time.time, compare=False)


class LmspService:
    def __init__(self, store: TaskStore, hub: Hub, models: Mapping[str, tuple[Bridge, str | None]],
                 config: LmspConfig, *, max_running_tasks: int) -> None:
        self.store = store
        self.hub = hub
        self.models = models
        self.config = config
        self.runner = Runner(store, models, max_running=max_running_tasks,
                             max_attempts=config.max_attempts,
                             live_sessions=config.live_sessions,
                             permission_policy=config.permission_policy,
                             history_chars=config.history_chars, clock=config.clock)
        self.recovery = RecoveryReport()
        self.closed = anyio.Event()
        self._background = anyio.CancelScope()

    def stop(self) -> None:
        """Stop the runner and the purge, end open event streams (idempotent). Call it
        before closing the bridge on a drain, so running tasks stay ``running`` in the
        store (restart recovery applies ``on_restart``) instead of failing."""
        self.closed.set()
        self.hub.close()
        self._background.cancel()

    async def run_background(self, *, task_status: anyio.abc.TaskStatus[None]
                             = anyio.TASK_STATUS_IGNORED) -> None:
        """The runner, the purge and (shared store) leases and polling; started once
        other instances' notices are wired to this service."""
        with self._background:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.runner.run)
                tg.start_soon(self._purge_loop)
                if is_shared(self.store):
                    self.store.on_notify = self._on_notice
                    tg.start_soon(self._lease_loop, self.store)
                    tg.start_soon(self._poll_loop, self.store)
                task_status.started()

    # -- several instances on one store (PostgreSQL) ---------------------------------
    def _on_notice(self, kind: str, task_id: str) -> None:
        """Another instance committed: events (``e``), queued work (``q``), a cancel
        request (``c``). Hints only (see ``_poll_loop``)."""
        if kind == "e":
            self.hub.poke(task_id)
        elif kind == "q":
            self.runner.wake()
        elif kind == "c":
            self.runner.cancel(task_id)
            self.hub.poke(task_id)

    async def _lease_loop(self, store: SharedTaskStore) -> None:
        """Every ``renew_s``: stop the tasks running here that another instance
        recovered (their lease expired: a renewal that could not land in time), renew
        this instance's leases (and stop tasks cancelled elsewhere), then recover tasks
        whose lease expired on any instance."""
        while True:
            try:
                runs = self.runner.handles()   # before asking: a later claim is not judged
                for task_id in await store.taken_over(list(runs)) if runs else ():
                    self.runner.taken_over(task_id, runs[task_id])
                _, cancelling = await store.renew_leases()
                for task_id in cancelling:
                    self.runner.cancel(task_id)
                report = await store.recover(recovery_finish,
                                             max_attempts=self.config.max_attempts,
                                             now=self.config.clock())
                if report.requeued:
                    self.runner.wake()
                if report.failed or report.requeued or report.cancelled:
                    log.warning("lmsp: recovered tasks of a dead instance: %s", report)
            except Exception as exc:   # noqa: BLE001 - retried at the next interval
                _log_failure("lease renewal/recovery", exc)
            await anyio.sleep(store.renew_s)

    async def _poll_loop(self, store: SharedTaskStore) -> None:
        """The fallback for lost notices: every ``poll_s`` look for queued work, wake
        the subscribers of tasks with new events (one query for all watched tasks),
        and stop local tasks cancelled elsewhere."""
        seen: dict[str, int] = {}
        while True:
            await anyio.sleep(store.poll_s)
            self.runner.wake()
            try:
                watched = self.hub.watched()
                latest = await store.next_seqs(watched) if watched else {}
                for task_id, next_seq in latest.items():
                    if seen.get(task_id) != next_seq:   # first sight included
                        self.hub.poke(task_id)
                seen = latest
                running = self.runner.running_ids()
                for task_id in await store.cancelling_among(running) if running else ():
                    self.runner.cancel(task_id)
            except Exception as exc:   # noqa: BLE001 - retried at the next interval
                _log_failure("poll", exc)

    # -- capabilities -----------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        c = self.config
        return Capabilities(
            capabilities=CapabilityFlags(),
            limits=Limits(event_retention_seconds=int(c.event_retention_s),
                          task_retention_seconds=int(c.task_retention_s),
                          idempotency_key_ttl_seconds=int(c.idempotency_ttl_s),
                          max_request_bytes=c.max_request_bytes),
            models=sorted(self.models))

    # -- tasks ------------------------------------------------------------------------
    async def create_task(self, request: ResponseRequest, *, on_restart: str,
                          key: str | None, route: str, caller: Caller
                          ) -> tuple[TaskRecord, bool]:
        """Durable before it returns. ``(task, replayed)``, owned by ``caller``. The
        stored request is ``request.canonical``; the idempotency fingerprint hashes
        those bytes and ``on_restart`` (members the service ignores are in neither);
        keys are per principal."""
        now = self.config.clock()
        idem = None
        if key is not None:
            idem = IdempotencyClaim(scope=f"{caller.name} {route}", key=key,
                                    fingerprint=hashlib.sha256(
                                        on_restart.encode() + b"\n" + request.canonical
                                    ).hexdigest(),
                                    expires_at=now + self.config.idempotency_ttl_s)
        try:
            await self._check_new(request, on_restart, caller)
        except LmspError:
            # a retry of a request that was accepted gets its task (§9.2), even when the
            # checks would refuse it now (its previous response deleted since, say)
            if idem is not None and (kept := await self.store.get_keyed(idem, now)) \
                    and not self._task_expired(kept, now):
                return kept, True
            raise
        task = NewTask(id=new_id("task"), response_id=new_id("resp"), on_restart=on_restart,
                       model=request.model, principal=caller.name,
                       request=request.canonical, created_at=now)

        async def create() -> Any:
            return await self.store.create_task(
                task, created_event(queued_record(task)), idem,
                timeout=self.config.idempotency_wait_s if idem is not None else None,
                max_queued=self.config.max_queued_tasks)

        try:
            outcome = await create()
            if outcome.replayed and self._task_expired(outcome.task, now):
                # a key never outlives its task (§9.2): the task is past retention (gone
                # to every read), so it and its key go now, and the request is new
                await self.store.delete_task(outcome.task.id)
                outcome = await create()
        except KeyReusedError:
            raise LmspError("idempotency_key_reused", "This Idempotency-Key was used with a "
                            "different request body.") from None
        except QueueFullError as exc:
            raise LmspError("prompt_queue_full", f"{exc.pending} tasks are already queued.",
                            limit=exc.limit, pendingCount=exc.pending) from None
        except TimeoutError:
            raise LmspError("idempotency_key_in_use", "A request with this Idempotency-Key "
                            "is still being processed.") from None
        if not outcome.replayed or outcome.task.status == "queued":
            self.runner.wake()   # (a replay: its first try may have timed out, a 409)
        if not outcome.replayed:
            detail = {"text": request.prompt_text[:PROMPT_TEXT_MAX]} \
                if caller.gate.audit.prompts else {}
            caller.record("task.created", outcome.task.id, response_id=outcome.task.response_id,
                          model=request.model, **detail)
        return outcome.task, outcome.replayed

    async def _check_new(self, request: ResponseRequest, on_restart: str,
                         caller: Caller) -> None:
        """What a new task must pass: a known model, a finished previous response of
        the caller's, an ``on_restart`` the agents support (``LmspError``)."""
        if on_restart == "resume":
            raise LmspError("unsupported_capability", "on_restart 'resume' needs snapshots, "
                            "which no configured agent supports.", capability="snapshots",
                            param="on_restart")
        if request.model not in self.models:
            await refresh_models(self.models)   # a model listed since?
        if request.model not in self.models:
            raise LmspError("model_not_found", f"The model {shown(request.model)!r} does "
                            f"not exist ({available(self.models)}).", model=shown(request.model))
        if request.previous_response_id is not None:
            previous = await self.get_response(request.previous_response_id,
                                               param="previous_response_id", caller=caller)
            if previous.status not in TERMINAL:
                raise LmspError("response_in_progress", f"The previous response "
                                f"{previous.response_id} has not finished yet; wait for it "
                                "(or cancel it) before continuing it.",
                                response_id=previous.response_id,
                                response_status=_response_status(previous))

    async def get_task(self, task_id: str, caller: Caller | None = None) -> TaskRecord:
        """The task; 404 when unknown, past retention, or not ``caller``'s to see."""
        record = await self.store.get_task(task_id)
        hidden = _hidden(record, caller, f"/lmsp/v1/tasks/{task_id}")
        if record is None or self._task_expired(record, self.config.clock()) or hidden:
            raise LmspError("task_not_found", f"No task {shown(task_id)!r}.",
                            task_id=shown(task_id))
        return record

    def _task_expired(self, record: TaskRecord, now: float) -> bool:
        return record.finished_at is not None and \
            record.finished_at + self.config.task_retention_s < now

    def _events_expired(self, record: TaskRecord, now: float) -> bool:
        return record.events_purged or (record.finished_at is not None and
                                        record.finished_at + self.config.event_retention_s < now)

    async def cancel(self, task_id: str, caller: Caller | None = None) -> TaskRecord:
        """§7.3: 200 with the task; 409 when it already succeeded or failed."""
        await self.get_task(task_id, caller)
        record, _ = await self.store.request_cancel(
            task_id, lambda rec: error_finish(rec, "", "", status="cancelled"),
            now=self.config.clock())
        if record is None:
            raise LmspError("task_not_found", f"No task {shown(task_id)!r}.",
                            task_id=shown(task_id))
        if record.status in ("succeeded", "failed"):
            raise LmspError("task_not_cancelable", f"Task {task_id} already finished with "
                            f"status '{record.status}'.", task_id=task_id,
                            task_status=record.status)
        if record.status == "cancelling":
            self.runner.cancel(task_id)
        if caller is not None and record.status in ("cancelling", "cancelled"):
            caller.record("task.cancelled", task_id)
        return record

    def task_object(self, record: TaskRecord) -> TaskObject:
        return TaskObject(
            id=record.id, status=record.status,  # type: ignore[arg-type]
            created_at=int(record.created_at), updated_at=int(record.updated_at),
            response_id=record.response_id, events_url=f"/lmsp/v1/tasks/{record.id}/events",
            on_restart=record.on_restart,  # type: ignore[arg-type]
            response=msgspec.Raw(record.response)
            if record.status == "succeeded" and record.response else None,
            error=msgspec.Raw(record.error) if record.status == "failed" and record.error
            else None)

    # -- responses (§6, OpenAI background mode) ----------------------------------------
    async def get_response(self, response_id: str, *, param: str | None = None,
                           caller: Caller | None = None) -> TaskRecord:
        """The task of a stored response; 404 ``response_not_found`` when unknown,
        deleted, past the task retention, created with ``store: false``, or not
        ``caller``'s to see."""
        record = await self.store.get_by_response(response_id)
        hidden = _hidden(record, caller, f"/lmsp/v1/responses/{response_id}")
        if record is None or self._task_expired(record, self.config.clock()) or hidden or \
                b'"store"' in record.request and _unstored(record):
            raise LmspError("response_not_found", f"No response {shown(response_id)!r}.",
                            response_id=shown(response_id),
                            **({"param": param} if param else {}))
        return record

    def response_object(self, record: TaskRecord) -> bytes:
        """The response as it stands: the final object once finished, else its
        ``queued`` / ``in_progress`` head (``loading``/``running``/``cancelling``)."""
        if record.status in TERMINAL and record.response:
            return record.response
        return encode(base_response(record, _response_status(record)))

    async def cancel_response(self, response_id: str, caller: Caller | None = None
                              ) -> TaskRecord:
        """A queued response is cancelled at once; a running one once its agent has
        stopped (waited for up to ``cancel_wait_s``); a cancelled one answers as is.
        A completed, incomplete or failed one: 400 ``response_not_cancelable``; one
        deleted meanwhile (a race with a DELETE): 404 ``response_not_found``."""
        record = await self.get_response(response_id, caller=caller)
        try:
            record = await self.cancel(record.id, caller)
            if record.status not in TERMINAL:
                with anyio.move_on_after(self.config.cancel_wait_s):
                    record = await self.wait_terminal(record.id)
        except LmspError as exc:
            if exc.code == "task_not_cancelable":
                finished = await self.store.get_task(record.id)
                if finished is not None:
                    status = _response_status(finished)
                    raise LmspError("response_not_cancelable", f"Cannot cancel a {status} "
                                    "response.", response_id=response_id,
                                    response_status=status) from None
            elif exc.code != "task_not_found":
                raise
            # a DELETE of the response came first
            raise LmspError("response_not_found", f"No response {shown(response_id)!r}.",
                            response_id=shown(response_id)) from None
        return record

    async def delete_response(self, response_id: str, caller: Caller | None = None) -> None:
        """Deletes a finished response (task, events, keys); 409
        ``response_in_progress`` while it is unfinished."""
        record = await self.get_response(response_id, caller=caller)
        if record.status not in TERMINAL or not await self.store.delete_task(record.id):
            current = await self.store.get_task(record.id)
            if current is None:
                raise LmspError("response_not_found",
                                f"No response {shown(response_id)!r}.",
                                response_id=shown(response_id))
            raise LmspError("response_in_progress", f"The response {response_id} has not "
                            "finished yet; cancel it first.", response_id=response_id,
                            response_status=_response_status(current))
        await self.runner.forget(response_id)
        self.hub.poke(record.id)
        if caller is not None:
            caller.record("task.deleted", record.id, response_id=response_id)

    # -- events -----------------------------------------------------------------------
    async def open_events(self, task_id: str, cursor: int | None, *,
                          param: str | None = None, caller: Caller | None = None
                          ) -> AsyncIterator[list[CommittedEvent]] | None:
        """Checks §6.4 (404/410/400); ``None`` means 204. The iterator yields batches
        of events in order (``[]`` for a keep-alive) and ends after the terminal one."""
        record = await self.get_task(task_id, caller)
        if self._events_expired(record, self.config.clock()):
            raise LmspError("event_history_expired", f"The events of task {task_id} are "
                            "older than the retention period.", task_id=task_id,
                            earliest_sequence_number=None,
                            retention_seconds=int(self.config.event_retention_s))
        last_written = record.next_seq - 1
        if cursor is not None and cursor > last_written:
            raise LmspError("invalid_request", f"The cursor {cursor} is past the last event "
                            f"({last_written}).", param=param or "Last-Event-ID",
                            errors=[])
        if cursor is not None and record.status in TERMINAL and cursor >= last_written:
            return None
        return batches(self.store, self.hub, task_id, -1 if cursor is None else cursor,
                       keepalive_s=self.config.keepalive_s, closed=self.closed)

    async def wait_terminal(self, task_id: str) -> TaskRecord:
        """The task once finished (or as it stands when the service closes), even past
        its retention then (its waiter gets what it waited for); 404 ``task_not_found``
        when it is gone (a DELETE of its response came first). Every
        terminal transition writes its terminal event, so the hub wakes the watch: on
        this instance at its commit, from another one through its notice (``e``) or,
        when a notice is lost, the shared store's polling (``_poll_loop``)."""
        backoff = Backoff(0.05, 5.0)
        with self.hub.watch(task_id) as watch:   # registered before the read
            while True:
                try:
                    record = await self.store.get_task(task_id)
                except StoreUnavailableError:   # wait for the store, then read again
                    await watch.wait(backoff.next())
                    continue
                if record is None:
                    raise LmspError("task_not_found", f"No task {shown(task_id)!r}.",
                                    task_id=shown(task_id))
                backoff.reset()
                if record.status in TERMINAL or self.closed.is_set():
                    return record
                await watch.wait(math.inf)

    # -- background -------------------------------------------------------------------
    async def purge_once(self) -> int:
        c = self.config
        return await self.store.purge(now=c.clock(), event_retention=c.event_retention_s,
                                      task_retention=c.task_retention_s,
                                      key_ttl=c.idempotency_ttl_s)

    async def _purge_loop(self) -> None:
        """The retention purge at start, then every ``purge_interval_s`` (a server that
        restarts more often than the interval still purges)."""
        while True:
            try:
                await self.purge_once()
            except Exception as exc:   # noqa: BLE001 - retried at the next interval
                _log_failure("retention purge", exc)
            await anyio.sleep(self.config.purge_interval_s)


def _log_failure(what: str, exc: Exception) -> None:
    """A background loop's failure: a store outage in one line (the store logs when it
    goes down and comes back), anything else with its traceback."""
    if isinstance(exc, StoreUnavailableError):
        log.info("lmsp %s skipped: %s", what, exc.reason)
    else:
        log.error("lmsp %s failed", what, exc_info=exc)


def _response_status(record: TaskRecord) -> str:
    """The response status of a task: queued, in_progress, or the final one."""
    if record.status == "queued":
        return "queued"
    if record.status not in TERMINAL:
        return "in_progress"
    if record.response:
        status = msgspec.json.decode(record.response).get("status")
        if isinstance(status, str):
            return status
    return {"succeeded": "completed"}.get(record.status, record.status)


def _unstored(record: TaskRecord) -> bool:
    return decode_stored(record.request).store is False


def bridge_models(bridge: Bridge) -> BridgeModels:
    """Every agent of ``bridge`` as a model of the same name (a live view)."""
    return BridgeModels(bridge)


@contextlib.asynccontextmanager
async def open_lmsp(bridge: Bridge, *, state_dir: str, store_url: str | None = None,
                    max_running_tasks: int = 4,
                    config: LmspConfig | None = None,
                    group_commit: bool = True, store: TaskStore | None = None,
                    models: Mapping[str, tuple[Bridge, str | None]] | None = None,
                    lease_s: float = 30, renew_s: float = 10, poll_s: float = 1.0,
                    busy_timeout_s: float = 5.0,
                    store_open: bool = False) -> AsyncIterator[LmspService]:
    """See the module docstring. ``store_url`` defaults to
    ``sqlite:///<state_dir>/lmsp.sqlite3``; ``store`` overrides it (other engines).
    ``models`` defaults to ``bridge_models(bridge)``. ``lease_s``, ``renew_s`` and
    ``poll_s`` are a PostgreSQL store's (``PostgresTaskStore``), ``busy_timeout_s`` a
    SQLite store's. ``store_open``: ``store`` is already open (and stays open: the
    session journal shares it, ``acp_server.server``)."""
    hub = Hub()
    if store is None:
        store = store_for(store_url, state_dir=state_dir, group_commit=group_commit,
                          lease_s=lease_s, renew_s=renew_s, poll_s=poll_s,
                          busy_timeout_s=busy_timeout_s)
    store.on_commit = hub.publish
    config = config or LmspConfig()
    async with contextlib.nullcontext(store) if store_open else store:
        service = LmspService(store, hub, bridge_models(bridge) if models is None else models,
                              config, max_running_tasks=max_running_tasks)
        service.recovery = await store.recover(recovery_finish,
                                               max_attempts=config.max_attempts,
                                               now=config.clock(), own=True)
        async with anyio.create_task_group() as tg:
            await tg.start(service.run_background)
            try:
                yield service
            finally:
                service.stop()
