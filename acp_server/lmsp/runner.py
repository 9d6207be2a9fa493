"""The runner: claims queued tasks in creation order and runs them through the bridge.

    runner = Runner(store, {"reference": (bridge, "reference")}, max_running=4)
    tg.start_soon(runner.run)        # until cancelled
    runner.wake()                    # after a create: look for queued work
    runner.cancel(task_id)           # after the store moved it to ``cancelling``
    await runner.forget(response_id) # a deleted response: close its live session

Contracts:

* At most ``max_running`` agent turns run at once in this process (``0`` = never
  start tasks: they stay queued; used by benchmarks and restart tests). A task's slot
  frees when its turn is over, so its final commit and the next claim share a batch.
* ``loading`` = the agent session is being created (a cancel ends the wait);
  ``running`` = the prompt is in flight, committed with ``response.in_progress`` at
  the first flush (``FLUSH_S`` after the prompt went out); a turn that ends sooner
  (with fewer than ``FLUSH_EVENTS`` events) goes ``loading`` → final in one commit
  and runs no writer task (``Runner._pump``). Every transition is conditional: losing
  one to a cancel moves the task ``cancelling`` → ``cancelled`` instead.
* Store outages: claims are retried with a capped backoff; a task's own writes (its
  events, its outcome) wait for the store (``persist``) and never fail the task.
  A write the store refuses for its own fault (a constraint, a trigger, a bug: not
  retried) fails the task (``server_error``); when even that is refused the task is
  left as the store has it (logged; restart recovery applies its policy): a task
  never ends the runner, nor the process.
* At the bridge's session limit the task goes back to ``queued`` (``unclaim``: its
  attempt not counted) and claims pause until a task of ours ends or a backoff passes.
* Text deltas are buffered and written in one transaction at most every
  ``FLUSH_S`` or ``FLUSH_EVENTS`` events (``acp_server.lmsp.deltas.DeltaWriter``);
  state events are written at once. Those
  still buffered when the turn ends go in the final transition's transaction (before
  its events), or on their own if that transition is lost to a cancel.
* A task whose lease another instance recovered (``taken_over``, from the service's
  lease loop) is stopped here as for a cancel; the store refuses its writes (they are
  conditional on its state and on this instance's ownership).
* Being cancelled from outside (shutdown) writes nothing: the task stays
  ``loading``/``running`` in the store and restart recovery applies its policy.
* ``previous_response_id`` (``acp_server.lmsp.conversation``): the prompt goes to the
  previous response's live session when this process kept it, else to a fresh
  session with the history before the new text (at most ``history_chars`` of it, the
  most recent). A stored response that completed
  (not cut at ``max_output_tokens``) keeps its session; any other is closed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import msgspec

from acp_server.lmsp.conversation import (
    MAX_HISTORY_CHARS,
    LiveSessions,
    history,
    history_prompt,
    may_keep,
    transcript,
)
from acp_server.lmsp.deltas import FLUSH_EVENTS, FLUSH_S, DeltaWriter
from acp_server.lmsp.models import refresh_models
from acp_server.lmsp.permissions import decide, decision_label
from acp_server.lmsp.responses import Attempt, count_tokens, in_progress_event
from acp_server.store.errors import Backoff, StoreUnavailableError, first_line, persist
from acp_server.store.tasks import Finish, TaskRecord, TaskStore, restart_target
from acp_server.lmsp.requests import decode_stored
from acp_server.lmsp.wire import AnyEvent, PermissionDecidedEvent
from bridge import Bridge
from bridge import events as ev
from bridge.errors import (
    AgentDiedError,
    AgentError,
    AgentUnavailableError,
    BridgeError,
    SessionLimitExceededError,
)
from bridge.ticket import PromptResult, PromptTicket
from bridge.wire import CONTEXT_LENGTH_EXCEEDED, agent_error_kind

log = logging.getLogger("acp_server.lmsp")

SUBSCRIPTION_QUEUE = 2048
IDLE_CLAIM_S = 2.0   # an idle runner claims again this often, woken or not


class OutputLost(Exception):
    """Events of the turn were lost before they were read (see ``Runner._read``)."""


@dataclasses.dataclass(eq=False)
class _Handle:
    cancel_requested: bool = False
    # covers the agent session's creation (``loading``): a cancel ends the wait
    loading: anyio.CancelScope = dataclasses.field(default_factory=anyio.CancelScope)
    stopping: bool = False      # the runner itself cancelled the prompt
    ticket: PromptTicket | None = None
    subscription: Any = None    # the turn's events (another after an eviction)
    last_read: int | None = None   # the id of the last of them read


class Runner:
    def __init__(self, store: TaskStore, models: Mapping[str, tuple[Bridge, str | None]], *,
                 max_running: int = 4, max_attempts: int = 3, live_sessions: int = 8,
                 permission_policy: str = "reject", history_chars: int = MAX_HISTORY_CHARS,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.history_chars = history_chars   # a continuation's history, at most
        self.clock = clock   # wall-clock seconds for the store's updated/finished times
        self.models = models
        self.max_running = max_running
        self.max_attempts = max_attempts
        self.sessions = LiveSessions(live_sessions)
        self.permission_policy = permission_policy
        self.permission_decisions = {"reject": 0, "allow": 0, "cancelled": 0}
        self._running: dict[str, _Handle] = {}
        # Tasks holding one of the ``max_running`` slots: from the claim until the agent's
        # turn is over (the final commit is then in flight, sharing the next claim's).
        self._slots: set[_Handle] = set()
        self._wakeup = anyio.Event()
        # At the bridge's session limit: claims pause (``_slot_backoff``) until a task of
        # ours ends (``_slot_freed``) or the backoff delay passes.
        self._slot_backoff = Backoff(0.05, 2.0)
        self._slot_wait = 0.0
        self._slot_freed: anyio.Event | None = None   # made by the one waiting for it

    @property
    def running(self) -> int:
        return len(self._running)

    def running_ids(self) -> list[str]:
        return list(self._running)

    def wake(self) -> None:
        self._wakeup.set()

    def cancel(self, task_id: str) -> None:
        """Ask the backend to stop (idempotent); the run records ``cancelled``."""
        handle = self._running.get(task_id)
        if handle is None:
            return
        handle.cancel_requested = True
        if handle.ticket is not None:
            handle.ticket.cancel("lmsp_cancel")
        else:   # loading: stop waiting for the agent's session
            handle.loading.cancel()

    def handles(self) -> dict[str, object]:
        """The tasks running here, each with its run (``taken_over`` judges that run,
        not a later claim of the same task)."""
        return dict(self._running)

    def taken_over(self, task_id: str, run: object) -> None:
        """Another instance may run this task now (its lease expired and was recovered
        there): its turn here stops, as for a cancel; the store refuses what it writes."""
        if self._running.get(task_id) is not run or run not in self._slots:
            return   # a later claim's, or its turn is over (its own final commit)
        log.warning("lmsp task %s: its lease was lost (recovered by another instance); "
                    "its turn here is stopped", task_id)
        self.cancel(task_id)

    async def forget(self, response_id: str) -> None:
        """Close the live session kept for ``response_id`` (if any)."""
        live = self.sessions.drop(response_id)
        if live is not None:
            await _close(live.bridge, live.session_id)

    async def run(self) -> None:
        """Claims and starts work until cancelled. A store that cannot serve (or any
        other failure to claim) is retried with a capped backoff, wake-ups or not:
        queued work starts by itself once the store is back."""
        backoff = Backoff(0.05, 5.0)
        async with anyio.create_task_group() as tg:
            while True:
                try:
                    await self._wait_for_slots()
                    while (free := self.max_running - len(self._slots)) > 0:
                        # one write claims them all (one statement, one commit)
                        records = await self.store.claim(self.clock(), free)
                        for record in records:
                            handle = self._running[record.id] = _Handle()   # see cancel()
                            self._slots.add(handle)
                            tg.start_soon(self._run, record, handle)
                        if len(records) < free:   # the queue is empty
                            break
                except Exception as exc:   # noqa: BLE001 - the loop outlives any fault
                    delay = backoff.next()
                    if isinstance(exc, StoreUnavailableError):
                        log.warning("lmsp: cannot claim tasks (%s); again in %.2f s",
                                    exc.reason, delay)
                    else:
                        log.exception("lmsp: claiming tasks failed; again in %.2f s", delay)
                    await anyio.sleep(delay)
                    continue
                backoff.reset()
                # woken by a create, a finish, a notice; and looks again every
                # IDLE_CLAIM_S anyway: a create that answered 409 (its commit outlived
                # the idempotency wait) lands unannounced
                with anyio.move_on_after(IDLE_CLAIM_S):
                    await self._wakeup.wait()
                self._wakeup = anyio.Event()

    async def _wait_for_slots(self) -> None:
        """After a task met the bridge's session limit: wait until one of ours ends or
        the backoff passes (doubling while the limit holds, up to 2 s)."""
        if self._slot_wait > 0:
            freed = self._slot_freed = anyio.Event()
            with anyio.move_on_after(self._slot_wait):
                await freed.wait()
            self._slot_freed = None
            self._slot_wait = 0.0

    async def _run(self, record: TaskRecord, handle: _Handle) -> None:
        try:
            await self._execute(record, handle)
        except Exception as exc:   # noqa: BLE001 - a bug must still end the task
            log.exception("lmsp task %s crashed", record.id)
            try:
                await self._end_failed(record, Attempt(record, ""), "server_error",
                                       "Internal error.")
            except Exception as error:   # noqa: BLE001 - the process outlives any task
                log.error("lmsp task %s: its failure could not be written either (%s); "
                          "it stays unfinished in the store until a restart's recovery",
                          record.id, first_line(error, 200))
        finally:
            if self._running.get(record.id) is handle:   # (not a later claim's)
                del self._running[record.id]
            self._release(handle)

    def _release(self, handle: _Handle) -> None:
        """The task's runner slot is free (idempotent): the next task may be claimed."""
        if handle in self._slots:
            self._slots.discard(handle)
            if self._slot_freed is not None:   # (no event made a task when none waits)
                self._slot_freed.set()
                self._slot_freed = None
            self.wake()

    async def _execute(self, record: TaskRecord, handle: _Handle) -> None:
        request = decode_stored(record.request)   # the one decode of the stored request
        prompt = request.prompt_text
        attempt = Attempt(record, prompt, request.max_output_tokens)
        target = self.models.get(record.model)
        if target is None:   # a model listed since (a restart before its server was up)?
            await refresh_models(self.models)
            target = self.models.get(record.model)
        if target is None:
            await self._end_failed(record, attempt, "model_not_found",
                                   f"The model {record.model!r} is not served any more.")
            return
        bridge, agent = target
        previous = request.previous_response_id
        session_id = None
        if isinstance(previous, str):
            session_id = self.sessions.take(previous, record.model)
        continued = session_id is not None   # the session already holds the history
        blocks: list[dict[str, Any]] = [{"type": "text", "text": prompt}]
        if session_id is None:
            try:
                with handle.loading:
                    session_id = await self._new_session(bridge, agent)
            except SessionLimitExceededError:
                await self._requeue_at_limit(record)
                return
            except AgentUnavailableError as exc:   # the agent's process did not start
                if exc.transient:   # short of descriptors or processes: as at the limit
                    await self._requeue_at_limit(record, why=str(exc))
                else:
                    await self._end_failed(record, attempt, exc.code, str(exc))
                return
            except Exception as exc:   # noqa: BLE001 - any bridge failure fails the task
                await self._end_agent_error(record, attempt, exc)
                return
            if session_id is None:   # cancelled while loading (the agent never answered)
                await self._end_cancelled(record, attempt)
                return
            self._slot_backoff.reset()
        keep = False
        try:
            if isinstance(previous, str) and not continued:
                messages = await persist(lambda: history(self.store, previous,
                                                         max_chars=self.history_chars),
                                         what=f"lmsp task {record.id}: its history")
                embedded = bridge.agents.capability(bridge.agents.resolve(agent),
                                                    "promptCapabilities", "embeddedContext")
                blocks = history_prompt(previous, messages, prompt, embedded=bool(embedded))
                attempt.input_tokens += count_tokens(transcript(messages))
            if handle.cancel_requested:   # cancelled while loading
                await self._end_cancelled(record, attempt)
                return
            ticket = bridge.send_prompt(session_id, blocks)
            handle.ticket = ticket
            if handle.cancel_requested:
                ticket.cancel("lmsp_cancel")
            handle.subscription = bridge.subscribe(session_id,
                                                   last_event_id=ticket.last_event_id,
                                                   max_queued=SUBSCRIPTION_QUEUE)
            handle.last_read = ticket.last_event_id
            writer = DeltaWriter(self.store, record.id,
                                 in_progress_event(record, attempt.echo), self.clock)
            try:
                await self._pump(attempt, ticket, handle, bridge, writer)
            except OutputLost as exc:
                ticket.cancel("output_lost")
                await writer.write(writer.tail)
                await self._end_failed(record, attempt, "output_lost", str(exc))
                return
            finally:
                handle.subscription.close()   # the session may outlive this task
            try:
                result: PromptResult = await ticket
            except Exception as exc:   # noqa: BLE001 - AgentError, AgentDiedError, ...
                await writer.write(writer.tail)
                await self._end_agent_error(record, attempt, exc)
                return
            status, finish = attempt.finish(result.stop_reason, self.clock())
            if status == "cancelled":
                await writer.write(writer.tail)
                await self._end_cancelled(record, attempt)
                return
            # the last deltas ride in the final transition's commit, before its events
            # (and ``response.in_progress`` first when the turn ended before it was due)
            opening = [] if writer.opened else [writer.opening]
            final = dataclasses.replace(finish, events=[*opening, *writer.tail,
                                                        *finish.events])
            state = ("running",) if writer.opened else ("loading",)
            self._release(handle)   # the turn is over: what is left is writing
            won = await persist(lambda: self.store.transition(
                record.id, state, status, final, now=self.clock()),
                what=f"lmsp task {record.id} → {status}")
            if won is None:   # a cancel committed first
                await writer.write(writer.tail)
                await self._end_cancelled(record, attempt)
                return
            keep = (status == "succeeded" and not attempt.truncated and may_keep(bridge)
                    and request.store is not False)
        finally:
            with anyio.CancelScope(shield=True):
                closing = [(bridge, session_id)]
                if keep:
                    closing = [(live.bridge, live.session_id) for live in self.sessions.keep(
                        record.response_id, record.model, bridge, session_id)]
                for owner, sid in closing:
                    await _close(owner, sid)

    async def _new_session(self, bridge: Bridge, agent: str | None) -> str:
        """A fresh session; at the bridge's session limit, kept sessions make room."""
        while True:
            try:
                return (await bridge.create_session(agent=agent, origin="lmsp")).session_id
            except SessionLimitExceededError:
                live = self.sessions.evict_oldest(bridge)
                if live is None:
                    raise
                await _close(live.bridge, live.session_id)

    async def _requeue_at_limit(self, record: TaskRecord, why: str | None = None) -> None:
        """The bridge is at its session limit (or, ``why``, its agent's process could
        not start for want of descriptors or processes): the task goes back to
        ``queued`` (its attempt not counted, its place in the queue kept) and claims
        pause until a slot frees or the backoff passes. A cancel that came meanwhile
        ends it instead."""
        if self._slot_wait == 0:
            self._slot_wait = self._slot_backoff.next()
        if await persist(lambda: self.store.unclaim(record.id, now=self.clock()),
                         what=f"lmsp task {record.id} → queued"):
            if why is None:
                log.info("lmsp task %s waits for a session slot (the bridge is at its "
                         "limit)", record.id)
            else:
                log.warning("lmsp task %s queued again: %s", record.id, why)
            return
        await self._end_cancelled(record, Attempt(record, ""))

    async def _pump(self, attempt: Attempt, ticket: PromptTicket, handle: _Handle,
                    bridge: Bridge, writer: DeltaWriter) -> None:
        """Session updates → events, until the prompt's turn ends. Reading never waits
        for the store (so the bridge's subscription queue does not back up); ``writer``
        commits what accumulated. When the turn ended, the events not yet written are
        left in ``writer.tail`` (the caller writes them), else written here.

        A turn that ends within ``FLUSH_S`` with fewer than ``FLUSH_EVENTS`` events (the
        common case) runs no writer task at all: nothing was due to be written before
        its final commit. Past either, ``writer.run`` starts with the opening due."""
        with anyio.move_on_after(FLUSH_S):
            ended = await self._read(attempt, ticket, handle, bridge, writer,
                                     fast=True)
            if ended:
                writer.tail, writer.pending = writer.pending, []
                return
        lost: OutputLost | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.run, True)
            try:
                await self._read(attempt, ticket, handle, bridge, writer,
                                 fast=False)
            except OutputLost as exc:
                lost = exc   # raised as itself, not in the task group's exception group
            finally:
                writer.close()
        if lost is not None:
            raise lost

    async def _read(self, attempt: Attempt, ticket: PromptTicket, handle: _Handle,
                    bridge: Bridge, writer: DeltaWriter, *, fast: bool) -> bool:
        """Reads ``handle.subscription`` into ``writer`` until the turn ends (``True``,
        with ``writer.hold_tail`` set) or the subscription does (``False``); ``fast``: also
        stops (``False``) once ``FLUSH_EVENTS`` are pending (the writer is due).

        A subscription the bus evicted (the store was slow: ``writer.add`` waited and
        the queue filled) is followed by another from the last event read, which the
        session's ring replays; when the ring no longer has them, ``OutputLost``: the
        task fails rather than end with part of its output missing."""
        while True:
            subscription = handle.subscription
            ended = await self._read_one(attempt, ticket, subscription, handle, bridge,
                                         writer, fast=fast)
            if ended or subscription.evicted_reason is None or fast and len(
                    writer.pending) >= FLUSH_EVENTS:
                return ended
            log.info("lmsp task %s: its reader fell behind a slow store; it reads on from "
                     "event %s", attempt.record.id, handle.last_read)
            subscription.close()
            handle.subscription = bridge.subscribe(
                ticket.session_id, last_event_id=handle.last_read, epoch=subscription.epoch,
                max_queued=SUBSCRIPTION_QUEUE)

    async def _read_one(self, attempt: Attempt, ticket: PromptTicket, subscription: Any,
                        handle: _Handle, bridge: Bridge, writer: DeltaWriter, *,
                        fast: bool) -> bool:
        async for event in subscription:
            if event.id is not None:
                handle.last_read = event.id
            elif event.type == ev.STATE_RESYNC_REQUIRED:
                raise OutputLost("the session's events went past its ring while the store "
                                 "was too slow to keep up: part of the output is lost")
            if event.prompt_id != ticket.prompt_id:
                continue
            if event.type in ("turn_complete", "turn_error"):
                writer.hold_tail = True
                return True
            if event.type == ev.PERMISSION_REQUEST:
                decided = self._answer_permission(bridge, event.data)
                if decided is not None:
                    await writer.add([decided])
            elif event.type == "session_update":
                drafts = _map_update(attempt, event.data)
                if drafts:
                    await writer.add(drafts)
                if attempt.truncated and not handle.stopping:
                    handle.stopping = True   # max_output_tokens: stop the agent
                    ticket.cancel("max_output_tokens")
            if fast and len(writer.pending) >= FLUSH_EVENTS:
                return False
        return False

    def _answer_permission(self, bridge: Bridge, data: Any) -> PermissionDecidedEvent | None:
        """Nobody can vote over LMSP: the policy answers at once (first responder).
        ``data``: a ``bridge.events.PermissionRequest`` (the agent's ACP params)."""
        if not isinstance(data, ev.PermissionRequest):
            return None
        outcome, kind = decide(self.permission_policy, data.params.get("options"))
        try:
            bridge.respond_to_permission(data.request_id, outcome, session_id=data.session_id,
                                         voter_client_id="lmsp-policy")
        except BridgeError:   # already resolved (a timeout, a cancel)
            return None
        self.permission_decisions[decision_label(outcome, kind)] += 1
        return PermissionDecidedEvent(request_id=data.request_id, policy=self.permission_policy,
                                      outcome=outcome, option_kind=kind,
                                      tool_call=data.params.get("toolCall"))

    async def _transition(self, record: TaskRecord, from_states: tuple[str, ...], to: str,
                          finish: Finish | None = None) -> bool:
        """One transition, retried while the store is unavailable (each try is shielded
        by the store; a shutdown may cut the retries: restart recovery then applies
        ``on_restart``). Whether it won."""
        return await persist(lambda: self.store.transition(
            record.id, from_states, to, finish, now=self.clock()),
            what=f"lmsp task {record.id} → {to}") is not None

    async def _end_cancelled(self, record: TaskRecord, attempt: Attempt) -> None:
        """→ ``cancelled``, through ``cancelling`` when the backend stopped on its own
        (e.g. a bridge deadline) without an LMSP cancel."""
        if await self._transition(record, ("cancelling",), "cancelled", attempt.cancelled()):
            return
        if await self._transition(record, ("loading", "running"), "cancelling"):
            await self._transition(record, ("cancelling",), "cancelled", attempt.cancelled())

    async def _end_agent_error(self, record: TaskRecord, attempt: Attempt,
                               error: Exception) -> None:
        """A dead agent is what a restart is to the service: an ``on_restart: retry``
        task with attempts left goes back to ``queued`` (the bridge restarts the agent
        for its next attempt; numbering continues). Anything else fails the task."""
        if isinstance(error, AgentDiedError) and restart_target(
                "running", record.on_restart, record.attempt, self.max_attempts) == "queued":
            if await self._transition(record, ("loading", "running"), "queued"):
                log.warning("lmsp task %s: the agent died (%s); attempt %d of %d queued again",
                            record.id, error, record.attempt + 1, self.max_attempts)
                return
        code = "agent_error"   # over the model's context: a code of its own, as OpenAI's
        if isinstance(error, AgentError) and agent_error_kind(error.data) == CONTEXT_LENGTH_EXCEEDED:
            code = CONTEXT_LENGTH_EXCEEDED
        await self._end_failed(record, attempt, code, str(error))

    async def _end_failed(self, record: TaskRecord, attempt: Attempt, code: str,
                          message: str) -> None:
        """→ ``failed``; never raises for the store (it waits for it to come back)."""
        if not await self._transition(record, ("loading", "running"), "failed",
                                      attempt.failed(code, message)):
            await self._end_cancelled(record, attempt)


async def _close(bridge: Bridge, session_id: str) -> None:
    try:
        await bridge.close_session(session_id, reason="lmsp_task_done")
    except Exception:   # noqa: BLE001 - the session may already be gone
        pass


_update_decoder = msgspec.json.Decoder()


def _map_update(attempt: Attempt, data: Any) -> list[AnyEvent]:
    params = _update_decoder.decode(data) if isinstance(data, msgspec.Raw) else data
    if not isinstance(params, dict):
        return []
    update = params.get("update")
    if not isinstance(update, dict):
        return []
    kind = update.get("sessionUpdate")
    if kind == "agent_message_chunk":
        content = update.get("content")
        text = content.get("text") if isinstance(content, dict) else None
        if isinstance(text, str) and text:
            return attempt.text(text)
    elif kind == "agent_thought_chunk":
        content = update.get("content")
        text = content.get("text") if isinstance(content, dict) else None
        if isinstance(text, str) and text:
            return attempt.thought(text)
    elif kind == "usage_update":
        attempt.usage_update(update)
    return []
