"""One bridge session: its FIFO, its admission counter, its bus, its permissions.

    session = Session(session_id, workspace_cwd, agent, options)
    session.start(task_group)                      # the FIFO worker and timers run there
    ticket = session.admit(prompt, prompt_id=None, deadline_ms=None)   # or PromptQueueFullError

Contracts:

* ``admit`` is the one admission decision: it checks the limit, counts the prompt
  (``pending_count`` is ``len(pending)``) and raises, with no ``await`` in it, so
  admission cannot race on any backend.
* Work runs strictly in arrival order, one item at a time (prompts and branches).
* A prompt settles exactly once (``_settle``): its ticket gets the outcome, its slot is
  released, its terminal event is published. Every path — completion, agent error,
  cancel while queued or running, deadline, close, agent death — goes through it.
* A failed prompt never blocks the FIFO: the worker moves on whatever the outcome.
* A prompt's turn on its agent is ``bridge.turn``'s (``run_turn``, called by the
  worker; ``forward_cancel`` for a cancel or deadline of it): on a durable journal a
  prompt reaches its agent only once its start (its echo) is committed, so after a
  crash it is known started, never run twice (its contracts there).
* ``start`` hands the worker and the session's timers to the owner's task group (no
  task group of the session's own); ``stop`` ends all of them: a worker waiting for
  work returns, a running job and every timer are cancelled.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from bridge import events as ev
from bridge.bus import EventBus
from bridge.cancel import CancelToken
from bridge.errors import (
    STOPPING,
    AgentError,
    JournalUnavailableError,
    PromptCancelledError,
    PromptDeadlineExceededError,
    PromptIdInUseError,
    PromptQueueFullError,
    SessionClosedError,
    SessionNotRestorableError,
)
from bridge.ids import new_prompt_id, uuid4_str
from bridge.journal import (
    EventRecord,
    MemoryJournal,
    PromptAccepted,
    PromptSettled,
    SessionJournal,
)
from bridge.journaling import named
from bridge.observer import NO_OBSERVER, BridgeObserver
from bridge.options import BridgeOptions
from bridge.pending import (  # re-exported: the FIFO's items live in bridge.pending
    DONE,
    QUEUED,
    RUNNING,
    PendingPrompt,
    QueueWaitStats,
    WorkItem,
    prompt_text,
)
from bridge.status import (
    AskedPermission,
    PromptTerminal,
    SessionHistory,
    SessionInfo,
    SessionStatus,
    TurnFailure,
)
from bridge.session_views import HeldTurn, hold_turn, session_info, session_status
from bridge.terminals import Terminals
from bridge.ticket import PromptResult, PromptTicket
from bridge.turn import forward_cancel, run_turn
from bridge.wire import agent_error_kind
from bridge.wakeup import Wakeup

if TYPE_CHECKING:
    from bridge.agents.base import AgentConnection

NO_JOURNAL = MemoryJournal()
MAX_TRACKED_CLIENTS = 1024


class Session:
    def __init__(self, session_id: str, workspace_cwd: str, agent: AgentConnection,
                 options: BridgeOptions, queue_wait: QueueWaitStats, *,
                 observer: BridgeObserver = NO_OBSERVER) -> None:
        self.session_id = session_id
        self.workspace_cwd = workspace_cwd
        self.agent = agent
        self.options = options
        self.created_at = time.time()
        self.last_seen = time.monotonic()
        self.bus = EventBus(ring_size=options.event_ring_size,
                            ring_bytes=options.event_ring_bytes,
                            max_subscribers=options.max_subscribers_per_session,
                            max_queued=options.subscriber_max_queued,
                            max_queued_bytes=options.subscriber_max_queued_bytes,
                            flow_wait_s=options.subscriber_flow_wait_ms / 1000,
                            session_id=session_id, on_evict=observer.subscriber_evicted)
        self.observer = observer
        self.limit = options.pending_prompt_limit
        self.pending: dict[str, PendingPrompt] = {}   # admitted, not settled: the slots
        self.active: PendingPrompt | None = None
        self.clients: dict[str, float] = {}
        self.closing = False
        self.holds_slot = False   # a slot of the session cap (bridge.capacity) is its own
        self.forked_from: str | None = None
        self.origin: str | None = None   # who made it (create_session's label), or None
        self.owner: str | None = None    # the principal that made it (an opaque label)
        # the agent profile this session runs on (its slot's); a restored session's
        # even while that agent is not configured here (bridge.restore)
        self.agent_name = ""
        self.agent_result: dict[str, Any] = {}   # the agent's session/new (load, ...) answer
        self.setting = anyio.Lock()   # one setter on the agent at a time (agent_calls)
        # How its prompts ended (bridge.status), kept across a close and a cold load.
        self.prompt_terminals = Terminals()
        self._work: deque[PendingPrompt | WorkItem] = deque()
        self._work_added = Wakeup()
        self._ended: BaseException | None = None   # why its work fails (``fail_all``)
        self._task_group: anyio.abc.TaskGroup | None = None   # the owner's (``start``)
        self._scope = anyio.CancelScope()   # the worker's: cancels the job it runs
        self._stopped = False
        self._side_scopes: set[anyio.CancelScope] = set()   # timers, cancel notices
        self._awaited: set[anyio.CancelScope] = set()   # requests past their turn (awaited)
        self._queue_wait = queue_wait
        # Called once per cancel (of the running prompt, or by its deadline) with a
        # reason: cancels the session's pending permission requests.
        self.on_cancel: Callable[[Session, str], None] = lambda session, reason: None
        # Called when a prompt that ran settles, with its id: the questions asked during
        # its turn and still open are cancelled (the agent answered the prompt).
        self.on_turn_end: Callable[[Session, str], None] = lambda session, prompt_id: None
        self.journal: SessionJournal = NO_JOURNAL
        self.journal_stopped = False   # a clean stop ended its journal (``unjournal``)
        # Restored from the journal, but its agent could not restore it: why (prompts
        # are refused with SessionNotRestorableError), else None. While ``agent_side``
        # is still set (its agent not listed yet, bridge.restore) each use looks again.
        self.not_restorable: str | None = None
        self.replaying = False   # the agent's session/load replay: not published again
        self.restored = False    # brought back from the journal at start
        self.recorded = False    # its record is in the journal (``journaling.named``)
        self.seed: str | None = None   # a branch's parent conversation (``SessionOpened.seed``)
        self.scope = "thread"          # its record's (``single``: an agent's default session)
        self.settings: dict[str, Any] = {}   # ``bridge.settings``: what the agent accepted
        self.display_name: str | None = None   # its first prompt's (listings; journaled)
        # A restored session's last activity the journal knows (epoch seconds): its
        # ``updated_at`` until it is next touched (not the restart's time).
        self.journaled_activity: float | None = None
        # The end of its last prompt that ran (epoch seconds, strictly increasing; None
        # before the first), and how that turn failed, until the next one starts
        # running (``run_turn``): status's ``updatedAt`` and ``turnError``, as qwen's.
        self.turn_ended_at: float | None = None
        self.turn_failure: TurnFailure | None = None
        # Its prompts settled whose terminals readers cannot see yet (``session_views``)
        self.held_turns: list[HeldTurn] | None = None
        # Restored from the journal, its agent side not yet (bridge.restore): awaited
        # before the agent is first used (a prompt's acknowledgement and its turn, a
        # load, a fork, a forwarded request); ``None`` once done, or never needed.
        self.agent_side: Callable[[], Awaitable[None]] | None = None
        # A turn the agent did not end within ``cancel_grace_ms`` of its cancel, still
        # running at the agent (``bridge.turn``): set when the agent answers it or is
        # gone. Meanwhile its updates and questions are dropped, and the next prompt
        # waits for it.
        self.straggler: anyio.Event | None = None
        # Called when the agent has not ended that turn ``abandoned_turn_timeout_ms``
        # later, with its prompt id, the straggler, the wait for the agent's answer and
        # the time waited: the bridge gives up on the agent (``bridge.abandoning``).
        self.on_abandoned: Callable[[Session, str | None, anyio.Event, anyio.CancelScope,
                                     int], None] = lambda *args: None

    def journal_to(self, journal: SessionJournal) -> None:
        """Journal this session from now on: its events are held on the bus until
        committed (``bridge.journal``), its prompts and terminals recorded."""
        if not journal.durable:
            return
        self.journal = journal
        self.bus.hold = True
        sid, epoch = self.session_id, self.bus.epoch
        append = journal.append

        def sink(event: ev.Event, envelope: bytes) -> None:
            append(EventRecord(session_id=sid, event_id=event.id,  # type: ignore[arg-type]
                               type=event.type, prompt_id=event.prompt_id,
                               envelope=envelope, epoch=epoch))

        self.bus.sink = sink

    def unjournal(self) -> None:
        """Stop journaling (a clean stop: what follows is not recorded) and let every
        held event through. A journaled session admits no prompt from then on
        (``JournalUnavailableError``): none would be journaled, and it closes anyway."""
        self.journal_stopped = self.journal_stopped or self.journal.durable
        self.journal = NO_JOURNAL
        self.bus.sink = None
        self.bus.hold = False
        self.bus.release(self.bus.last_event_id)

    def abandon(self) -> None:
        """Another instance took the session over: record and publish nothing more
        (``EventBus.abandon``)."""
        self.journal = NO_JOURNAL
        self.bus.abandon()

    # -- lifecycle -----------------------------------------------------------------
    def start(self, owner: anyio.abc.TaskGroup) -> None:
        """Run the FIFO worker in ``owner`` (synchronous: ``admit`` and cancels work as
        soon as this returns). Its timers and cancel notices run there too, each in a
        scope of its own that ``stop`` cancels. Call it before the session is
        reachable."""
        self._task_group = owner
        owner.start_soon(self._run_worker)

    async def _run_worker(self) -> None:
        with self._scope:
            await self._worker()

    def stop(self) -> None:
        """End the worker: the job it runs and every job queued fail (``fail_all``'s
        error, else closed); a waiter is never left waiting. A worker waiting for work
        returns (no cancellation to deliver); one running a job is cancelled, and so
        is every timer and cancel notice of the session; a request ``awaited`` past its
        turn gets ``cancel_grace_ms`` more."""
        if self._ended is None:
            self._ended = self.close_error("closed")
        self._stopped = True
        for item in [i for i in self._work if isinstance(i, WorkItem)]:
            self._work.remove(item)
            item.outcome = self._ended
            item.done.set()
        for scope in self._side_scopes:
            scope.cancel()
        if self._awaited:
            grace = anyio.current_time() + self.options.cancel_grace_ms / 1000
            for scope in self._awaited:
                scope.deadline = min(scope.deadline, grace)
        if self._work_added.waiting:
            self._work_added.set()
        else:
            self._scope.cancel()

    @contextlib.contextmanager
    def awaited(self) -> Iterator[anyio.CancelScope]:
        """The scope of a request that may outlive its turn (``bridge.turn``: an agent
        in another process's ``session/prompt``), cancelled ``cancel_grace_ms`` after
        ``stop`` (or after it is entered, when stopped already)."""
        with anyio.CancelScope() as scope:
            self._awaited.add(scope)
            if self._stopped:
                scope.deadline = anyio.current_time() + self.options.cancel_grace_ms / 1000
            try:
                yield scope
            finally:
                self._awaited.discard(scope)

    def _start_side(self, job: Callable[[PendingPrompt], Awaitable[None]],
                    pending: PendingPrompt) -> None:
        """``job(pending)`` in the owner's task group, cancelled by ``stop``."""
        self._running().start_soon(self._side, job, pending)

    async def _side(self, job: Callable[[PendingPrompt], Awaitable[None]],
                    pending: PendingPrompt) -> None:
        if self._stopped:
            return
        with anyio.CancelScope() as scope:
            self._side_scopes.add(scope)
            try:
                await job(pending)
            finally:
                self._side_scopes.discard(scope)

    def touch(self) -> None:
        self.last_seen = time.monotonic()
        self.journaled_activity = None

    def knows_client(self, client_id: str) -> bool:
        """A client id this session issued. A session restored from the journal
        adopts the ids its clients bring back (they were issued before the restart)."""
        if client_id in self.clients:
            return True
        return self.restored and self.adopt_client(client_id)

    def adopt_client(self, client_id: str) -> bool:
        """Take a ``client_…`` id issued for this session elsewhere (before a restart,
        or by another instance answering ``/load`` from the journal: issue #24)."""
        if not (isinstance(client_id, str) and client_id.startswith("client_")):
            return False
        self.clients[client_id] = time.time()
        if len(self.clients) > MAX_TRACKED_CLIENTS:
            del self.clients[next(iter(self.clients))]
        return True

    def register_client(self) -> str:
        client_id = f"client_{uuid4_str()}"
        self.clients[client_id] = time.time()
        if len(self.clients) > MAX_TRACKED_CLIENTS:
            del self.clients[next(iter(self.clients))]
        return client_id

    def info(self, attached: bool, history: SessionHistory | None = None) -> SessionInfo:
        """What a create, attach, load, resume or branch answers (``session_views``)."""
        return session_info(self, attached, history)

    def status(self, pending_permissions: int,
               asked: tuple[AskedPermission, ...] = ()) -> SessionStatus:
        return session_status(self, pending_permissions, asked)

    @property
    def pending_count(self) -> int:
        """Queued plus running prompts: the slots taken."""
        return len(self.pending)

    @property
    def queued_count(self) -> int:
        return sum(1 for p in self.pending.values() if p.state == QUEUED)

    # -- admission -------------------------------------------------------------------
    def admit(self, prompt: list[Any], prompt_id: str | None, deadline_ms: int | None,
              client_id: str | None, cancel: CancelToken | None = None) -> PromptTicket:
        """Check the limit, take a slot, enqueue; the ticket. Raises
        ``PromptCancelledError`` (``cancel`` already cancelled) or
        ``PromptQueueFullError``, with no slot taken."""
        if cancel is not None and cancel.cancelled:
            raise PromptCancelledError("Prompt request was cancelled before admission",
                                       reason=cancel.reason)
        if self.not_restorable is not None and self.agent_side is None:   # for good
            raise SessionNotRestorableError(self.session_id, self.not_restorable)
        if self.journal_stopped:   # never acknowledged unjournaled (it would be lost)
            raise JournalUnavailableError(STOPPING)
        limit = self.limit
        if limit is not None and len(self.pending) >= limit:
            self.observer.prompt_rejected()
            raise PromptQueueFullError(self.session_id, limit, len(self.pending))
        self._running()   # started (see start)
        if prompt_id is None:
            prompt_id = new_prompt_id()
        elif prompt_id in self.pending:   # one slot, one settle per id
            raise PromptIdInUseError(self.session_id, prompt_id)
        else:
            self.prompt_terminals.forget_refused(prompt_id)   # a new prompt now
        ticket = PromptTicket(prompt_id, self.session_id, self.bus.last_event_id, self.bus.epoch,
                              lambda reason, pid=prompt_id: self.cancel_prompt(pid, reason))
        was_queued = self.active is not None or bool(self._work)
        pending = PendingPrompt(prompt_id, prompt, ticket, deadline_ms, was_queued, client_id)
        self.pending[prompt_id] = pending
        self.touch()
        if self.journal.durable:   # recorded before anything it causes (its events)
            pending.commit_seq = self.journal.append(PromptAccepted(
                session_id=self.session_id, prompt_id=prompt_id, prompt=prompt,
                queued_at_ms=pending.queued_at_ms, seq=time.time_ns(),
                deadline_ms=deadline_ms, was_queued=was_queued,
                last_event_id=ticket.last_event_id, epoch=ticket.epoch))
        if self.display_name is None:
            named(self, prompt)
        if pending.commit_seq or self.agent_side is not None:
            ticket._commit = lambda: self._admitted(pending)
        if was_queued:
            self.bus.publish(ev.PENDING_PROMPT_ADDED, ev.PendingPromptAdded(
                session_id=self.session_id, prompt_id=prompt_id, text=pending.text,
                queued_at=pending.queued_at_ms), prompt_id=prompt_id,
                originator_client_id=client_id)
        if deadline_ms is not None:
            self._start_side(self._deadline_timer, pending)
        if cancel is not None:
            pending.unhook_cancel = cancel.add_callback(ticket.cancel)
        self._enqueue(pending)
        self.observer.prompt_admitted()
        return ticket

    async def _admitted(self, pending: PendingPrompt) -> None:
        """Wait for the prompt's PromptAccepted, then for the session's agent side (a
        restored session's first use). A failed commit (``JournalUnavailableError``) or
        an agent side that cannot be restored (``SessionNotRestorableError``) settles
        the prompt (once) and raises."""
        try:
            if pending.commit_seq:
                await self.journal.wait(pending.commit_seq)
            if self.agent_side is not None:
                await self.agent_side()
            if self.not_restorable is not None:
                raise SessionNotRestorableError(self.session_id, self.not_restorable)
        except (JournalUnavailableError, SessionNotRestorableError, SessionClosedError) as exc:
            if pending.state == QUEUED:
                self._drop_queued(pending)
            self._settle(pending, exc)
            raise

    def readmit(self, record: PromptAccepted) -> PendingPrompt:
        """A journaled prompt that never settled, taken back at restore: its slot is
        re-taken (even past the limit) and it is queued in order. Nothing is
        published (its events are in the journal)."""
        self._running()   # started (see start)
        pid = record.prompt_id
        last = self.bus.last_event_id   # its admission's cursor, while the epoch holds
        if record.epoch == self.bus.epoch and record.last_event_id is not None:
            last = min(record.last_event_id, last)
        ticket = PromptTicket(pid, self.session_id, last, self.bus.epoch,
                              lambda reason, pid=pid: self.cancel_prompt(pid, reason))
        pending = PendingPrompt(pid, record.prompt, ticket, record.deadline_ms,
                                record.was_queued, None)
        pending.queued_at_ms = record.queued_at_ms
        self.pending[pid] = pending
        if record.deadline_ms is not None:
            self._start_side(self._deadline_timer, pending)
        self._enqueue(pending)
        return pending

    def fail_restored(self, pending: PendingPrompt, error: PromptResult | BaseException) -> None:
        """Settle a readmitted prompt at once (the running one under ``fail``, one whose
        cancel the journal holds)."""
        self._drop_queued(pending)
        self._settle(pending, error)

    def _running(self) -> anyio.abc.TaskGroup:
        if self._task_group is None:
            raise RuntimeError(f"session {self.session_id} is not running (start() first)")
        return self._task_group

    def enqueue_work(self, item: WorkItem) -> None:
        self._enqueue(item)

    def _enqueue(self, item: PendingPrompt | WorkItem) -> None:
        self._work.append(item)
        self._work_added.set()

    # -- the FIFO worker ---------------------------------------------------------------
    async def _worker(self) -> None:
        while True:
            while not self._work:
                if self._stopped:
                    return
                await self._work_added.wait()
            if self._stopped:
                return
            item = self._work.popleft()
            if isinstance(item, WorkItem):
                await self._run_work(item)
            elif item.state == QUEUED:
                await run_turn(self, item)

    async def _run_work(self, item: WorkItem) -> None:
        try:
            item.outcome = await item.job()
        except Exception as exc:  # delivered to the waiter; the FIFO goes on
            item.outcome = exc
        except BaseException:   # the worker stopped (close, agent death): it failed
            item.outcome = self._ended or self.close_error("closed")
            raise
        finally:
            item.done.set()

    # -- settlement --------------------------------------------------------------------
    def _settle(self, pending: PendingPrompt, outcome: PromptResult | BaseException) -> None:
        if not pending.ticket._settle(outcome):
            return
        pending.state = DONE
        if self.pending.get(pending.prompt_id) is pending:
            del self.pending[pending.prompt_id]   # the one release of this slot
        self.touch()
        if pending.timer_scope is not None:
            pending.timer_scope.cancel()
        if pending.unhook_cancel is not None:
            pending.unhook_cancel()
        sid, pid = self.session_id, pending.prompt_id
        origin = pending.client_id   # the prompt's X-Qwen-Client-Id: its events carry it
        at = ev.now_ms()   # its terminal's time
        ended, failure = self.turn_ended_at, self.turn_failure   # before it (status)
        if pending.started_at is not None:
            previous = self.created_at if self.turn_ended_at is None else self.turn_ended_at
            self.turn_ended_at = max(at / 1000, previous + 0.001)   # strictly increasing
            self.on_turn_end(self, pid)
            self.observer.turn_settled(
                outcome.stop_reason if isinstance(outcome, PromptResult) else "error",
                time.monotonic() - pending.started_at)
        if isinstance(outcome, PromptResult):
            self.bus.publish(ev.TURN_COMPLETE, ev.TurnComplete(
                session_id=sid, stop_reason=outcome.stop_reason, prompt_id=pid), prompt_id=pid,
                originator_client_id=origin)
            state = "cancelled" if outcome.stop_reason == "cancelled" else "completed"
            terminal = PromptTerminal(prompt_id=pid, terminal=state,
                                      stop_reason=outcome.stop_reason, at=at)
        else:
            code, kind = _error_code(outcome), _error_kind(outcome)
            self.bus.publish(ev.TURN_ERROR, ev.TurnError(
                session_id=sid, message=str(outcome), code=code, prompt_id=pid,
                error_kind=kind), prompt_id=pid, originator_client_id=origin)
            if pending.started_at is not None:   # a turn that ran: until the next runs
                self.turn_failure = TurnFailure(str(outcome), code, kind)
            state = "failed"
            terminal = PromptTerminal(prompt_id=pid, terminal=state, error_code=code, at=at)
        self.prompt_terminals.keep(terminal)
        if self.journal.durable:
            self.journal.append(PromptSettled(
                session_id=sid, prompt_id=pid, terminal=terminal.terminal, at=terminal.at,
                stop_reason=terminal.stop_reason, error_code=terminal.error_code))
        if pending.was_queued:
            # qwen serve's two states (its SDK drops any other as malformed): "removed"
            # for a queued prompt dropped by its removal, "completed" for every other
            # end (the terminal above says how it ended)
            self.bus.publish(ev.PENDING_PROMPT_COMPLETED, ev.PendingPromptCompleted(
                session_id=sid, prompt_id=pid,
                state="removed" if pending.removed else "completed"), prompt_id=pid,
                originator_client_id=origin)
        if pending.started_at is not None and self.bus.released_id < self.bus.last_event_id:
            hold_turn(self, pending, ended, failure)   # held: status says running

    # -- cancellation ----------------------------------------------------------------
    def cancel_prompt(self, prompt_id: str, reason: str | None = None) -> bool:
        """Queued: drop it and settle as cancelled. Running: forward ``session/cancel``.
        ``False`` when the prompt is not pending."""
        pending = self.pending.get(prompt_id)
        if pending is None:
            return False
        if pending.state == QUEUED:
            self._drop_queued(pending)
            pending.removed = reason == "removed"
            self.bus.publish(ev.PROMPT_CANCELLED, ev.PromptCancelled(
                session_id=self.session_id, reason=reason or "cancelled"), prompt_id=prompt_id)
            self._settle(pending, PromptResult("cancelled", {"stopReason": "cancelled"}))
        else:
            self._cancel_running(pending, reason)
        return True

    def cancel_active(self, reason: str | None = None, *,
                      permission_reason: str = "cancelled") -> bool:
        """Cancel the running prompt (if any) and the session's pending permission
        requests. ``True`` if a prompt was running."""
        active = self.active
        running = active is not None and active.state == RUNNING
        if active is None or not running or active.cancel_requested:
            self.on_cancel(self, permission_reason)
            return running
        self._cancel_running(active, reason, permission_reason)
        return True

    def _cancel_running(self, pending: PendingPrompt, reason: str | None,
                        permission_reason: str = "cancelled") -> None:
        """The one cancel of a running prompt: its permissions, then
        ``prompt_cancelled``, then ACP ``session/cancel``."""
        if pending.cancel_requested:
            return
        pending.cancel_requested = True
        self.on_cancel(self, permission_reason)
        self.bus.publish(ev.PROMPT_CANCELLED, ev.PromptCancelled(
            session_id=self.session_id, reason=reason or "cancelled"), prompt_id=pending.prompt_id)
        forward_cancel(self, pending)

    def _drop_queued(self, pending: PendingPrompt) -> None:
        try:
            self._work.remove(pending)
        except ValueError:
            pass

    async def _deadline_timer(self, pending: PendingPrompt) -> None:
        assert pending.deadline_ms is not None
        with anyio.CancelScope() as scope:
            pending.timer_scope = scope
            if pending.state == DONE:
                return
            await anyio.sleep(max(0.0, pending.admitted_at + pending.deadline_ms / 1000
                                  - time.monotonic()))
            if pending.state == DONE:
                return
            if pending.state == QUEUED:
                self._drop_queued(pending)
            else:
                pending.cancel_requested = True
                self.on_cancel(self, "cancelled")
                forward_cancel(self, pending)
            self._settle(pending, PromptDeadlineExceededError(pending.deadline_ms))

    def fail_all(self, error: BaseException) -> None:
        """Settle every pending prompt with ``error`` (close, agent death); the jobs
        on the FIFO fail with it when the worker stops."""
        self._ended = self._ended or error
        for pending in list(self.pending.values()):
            if pending.state == QUEUED:
                self._drop_queued(pending)
            elif pending.run_scope is not None:
                pending.run_scope.cancel()
            self._settle(pending, error)

    def close_error(self, reason: str) -> SessionClosedError:
        return SessionClosedError(self.session_id, reason)


def _error_kind(error: BaseException) -> str | None:
    """An agent error's kind (``bridge.wire.agent_error_data``), if it names one."""
    return agent_error_kind(error.data) if isinstance(error, AgentError) else None


def _error_code(error: BaseException) -> str:
    if isinstance(error, AgentError):
        return str(error.rpc_code)
    code = getattr(error, "code", None)
    return code if isinstance(code, str) else "internal_error"
