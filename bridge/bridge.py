"""The bridge: sessions, prompt admission, cancel, branch, permissions, events.

    async with Bridge(ReferenceAgentFactory(), workspace_cwd="/ws") as bridge:
        info = await bridge.create_session()
        ticket = bridge.send_prompt(info.session_id, [{"type": "text", "text": "hi"}])
        async for event in bridge.subscribe(info.session_id, last_event_id=ticket.last_event_id):
            ...
        result = await ticket

``Bridge`` knows nothing of HTTP. Every front door drives it through these methods
and maps its errors (``bridge.errors``) to wire answers. All agent traffic goes
through one shared ``AgentConnection`` (started on first use, restarted after death).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
import anyio.abc
import msgspec

from bridge import events as ev
from bridge import fs
from bridge.agent_pool import AgentPool
from bridge.agents.base import AgentConnection, AgentFactory
from bridge.bus import Subscription
from bridge.cancel import CancelToken
from bridge.elicitation import ElicitationMediator
from bridge.errors import (
    AgentDiedError,
    AgentError,
    BranchWhilePromptActiveError,
    InvalidClientIdError,
    InvalidDeadlineError,
    InvalidPromptError,
    NotSupportedError,
    PromptNotFoundError,
    SessionIdNotHonoredError,
    SessionLimitExceededError,
    SessionNotFoundError,
    TooManyContentBlocksError,
    WorkspaceMismatchError,
)
from bridge.history import session_history
from bridge.jsonrpc import RESOURCE_NOT_FOUND
from bridge.observer import NO_OBSERVER, BridgeObserver
from bridge.options import BridgeOptions
from bridge.permissions import PermissionMediator
from bridge.session import QUEUED, QueueWaitStats, Session, WorkItem
from bridge.status import BridgeStats, PendingPromptInfo, SessionInfo, SessionStatus
from bridge.ticket import PromptTicket

log = logging.getLogger("bridge")

REQUESTED_SESSION_ID_META = "acp-server/requestedSessionId"
CLOSE_AGENT_SESSION_TIMEOUT_S = 2.0
MAX_CLOSED_SESSION_HISTORIES = 1024


class Bridge:
    def __init__(self, agent_factory: AgentFactory, *, workspace_cwd: str,
                 options: BridgeOptions | None = None,
                 agents: Mapping[str, AgentFactory] | None = None) -> None:
        """``agent_factory`` is the default agent, named by its ``name``; ``agents`` adds
        more by name (a session picks one with ``agent=``)."""
        self.options = options or BridgeOptions()
        self.workspace_cwd = os.path.realpath(workspace_cwd)
        default = getattr(agent_factory, "name", None) or "default"
        self.agents = AgentPool({default: agent_factory, **(agents or {})}, default=default,
                                initialize_timeout_ms=self.options.initialize_timeout_ms)
        self._client = _AgentClientAdapter(self)
        self.permissions = PermissionMediator(self.options.permission_response_timeout_ms)
        self.elicitations = ElicitationMediator(self.options.permission_response_timeout_ms)
        self.queue_wait = QueueWaitStats()
        self.observer: BridgeObserver = NO_OBSERVER
        self.started_at = time.time()
        self._sessions: dict[str, Session] = {}
        self._in_flight_spawns = 0
        self._default_session_ids: dict[str, str] = {}   # agent name → its default session
        self._default_spawns: dict[str, anyio.Event] = {}
        # Prompt terminals of closed sessions, for a later cold load (bounded, oldest out).
        self._closed_terminals: dict[str, Any] = {}
        self._task_group: anyio.abc.TaskGroup | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------
    async def __aenter__(self) -> Bridge:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self._running())
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        stack, self._stack = self._stack, None
        assert stack is not None, "the bridge is not running"
        # The body's own exception propagates unwrapped; only background-task
        # failures surface from the task group.
        await stack.aclose()

    @contextlib.asynccontextmanager
    async def _running(self) -> AsyncIterator[None]:
        """The bridge's task group: sessions, agents and the reaper live in it."""
        async with anyio.create_task_group() as tg:
            self._task_group = tg
            if self.options.session_reap_interval_ms and self.options.session_idle_timeout_ms:
                await tg.start(self._reaper)
            try:
                yield
            finally:
                with anyio.CancelScope(shield=True):
                    await self.aclose()
                tg.cancel_scope.cancel()

    async def aclose(self) -> None:
        """Cancel every prompt, close every session, stop the agent."""
        if self._closed:
            return
        self._closed = True
        for session_id in list(self._sessions):
            await self.close_session(session_id, reason="shutdown")
        await self.agents.aclose()

    def observe(self, observer: BridgeObserver) -> None:
        """Report to ``observer`` (``bridge.observer``) from now on; sessions opened
        before keep the observer they had."""
        self.observer = observer
        self.agents.observer = observer

    # -- agents -----------------------------------------------------------------------
    def _tasks(self) -> anyio.abc.TaskGroup:
        if self._task_group is None:
            raise RuntimeError("the bridge is not running (use `async with Bridge(...)`)")
        return self._task_group

    async def _ensure_agent(self, name: str) -> AgentConnection:
        return await self.agents.ensure(name, self._client, self._tasks())

    async def forward(self, session_id: str, method: str, params: Any) -> Any:
        """Send an ACP request the bridge has no rule for (``session/set_mode``, ...)
        to the session's agent, unchanged; its answer, unchanged."""
        return await self.get_session(session_id).agent.request(method, params)

    @property
    def agent_info(self) -> dict[str, Any]:
        """The default agent's ``initialize`` result."""
        return self.agents.info(self.agents.default)

    # -- sessions ------------------------------------------------------------------------
    def get_session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None or session.closing:
            raise SessionNotFoundError(session_id)
        return session

    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    def check_workspace(self, cwd: str | None) -> str:
        if cwd is None:
            return self.workspace_cwd
        if not isinstance(cwd, str) or "\x00" in cwd:   # no such path can be the workspace
            raise WorkspaceMismatchError(self.workspace_cwd, repr(cwd))
        requested = os.path.realpath(cwd) if isinstance(cwd, str) and os.path.isabs(cwd) else str(cwd)
        if requested != self.workspace_cwd:
            raise WorkspaceMismatchError(self.workspace_cwd, str(cwd))
        return requested

    def _check_session_capacity(self) -> None:
        limit = self.options.session_limit
        if limit is not None and len(self._sessions) + self._in_flight_spawns >= limit:
            raise SessionLimitExceededError(limit)

    async def create_session(self, *, cwd: str | None = None, session_id: str | None = None,
                             agent: str | None = None, origin: str | None = None) -> SessionInfo:
        """A fresh session (``thread`` scope) on ``agent`` (default: the default agent).
        A requested id that is live attaches. ``origin`` labels who made it for the
        listings (``"lmsp"``, ``"conformance"``; ``None``: a person's client); the bridge
        only keeps it."""
        self.check_workspace(cwd)
        name = self.agents.resolve(agent)
        if session_id is not None and session_id in self._sessions:
            return self._info(self.get_session(session_id), attached=True)
        session = await self._spawn("session/new", name, requested_id=session_id)
        session.origin = origin
        return self._info(session, attached=False)

    async def attach_session(self, *, cwd: str | None = None, agent: str | None = None) -> SessionInfo:
        """The workspace's default session of ``agent`` (``single`` scope), created on
        first use; concurrent first attaches share one spawn."""
        self.check_workspace(cwd)
        name = self.agents.resolve(agent)
        while True:
            sid = self._default_session_ids.get(name)
            if sid is not None and sid in self._sessions and not self._sessions[sid].closing:
                return self._info(self._sessions[sid], attached=True)
            spawning = self._default_spawns.get(name)
            if spawning is None:
                break
            await spawning.wait()
        spawning = self._default_spawns[name] = anyio.Event()
        try:
            session = await self._spawn("session/new", name)
            self._default_session_ids[name] = session.session_id
        finally:
            del self._default_spawns[name]
            spawning.set()
        return self._info(session, attached=False)

    async def load_session(self, session_id: str, *, cwd: str | None = None,
                           agent: str | None = None) -> SessionInfo:
        """Attach a live session, or restore it through ACP ``session/load``."""
        return await self._restore("session/load", session_id, cwd, agent, ("loadSession",))

    async def resume_session(self, session_id: str, *, cwd: str | None = None,
                             agent: str | None = None) -> SessionInfo:
        """Attach a live session, or restore it through ACP ``session/resume`` (no replay)."""
        return await self._restore("session/resume", session_id, cwd, agent,
                                   ("sessionCapabilities", "resume"))

    async def _restore(self, method: str, session_id: str, cwd: str | None, agent: str | None,
                       capability: tuple[str, ...]) -> SessionInfo:
        self.check_workspace(cwd)
        name = self.agents.resolve(agent)
        with_history = method == "session/load"
        if session_id in self._sessions and not self._sessions[session_id].closing:
            return self._info(self._sessions[session_id], attached=True,
                              with_history=with_history)
        await self._ensure_agent(name)
        offered = self.agents.capability(name, *capability)
        if offered is None or offered is False:
            raise NotSupportedError(f"The agent does not support {method}")
        try:
            session = await self._spawn(method, name, restore_id=session_id)
        except AgentError as exc:   # the agent does not know it: the caller's 404
            if exc.rpc_code == RESOURCE_NOT_FOUND:
                raise SessionNotFoundError(session_id) from None
            raise
        return self._info(session, attached=False, with_history=with_history)

    async def _spawn(self, method: str, agent_name: str, *, requested_id: str | None = None,
                     restore_id: str | None = None, fork_of: str | None = None) -> Session:
        self._check_session_capacity()   # synchronous with the in-flight increment
        self._in_flight_spawns += 1
        try:
            agent = await self._ensure_agent(agent_name)
            params: dict[str, Any] = {"cwd": self.workspace_cwd, "mcpServers": []}
            if restore_id is not None or fork_of is not None:
                params["sessionId"] = restore_id or fork_of
            if requested_id is not None:
                params["_meta"] = {REQUESTED_SESSION_ID_META: requested_id}
            if restore_id is not None:
                # Register first: session/load replays history as session/update.
                session = await self._new_session(restore_id, agent, agent_name)
                try:
                    result = await agent.request(method, params)
                except BaseException:
                    self._drop_session(session)
                    raise
                session.agent_result = result if isinstance(result, dict) else {}
                return session
            result = await agent.request(method, params)
            sid = result.get("sessionId") if isinstance(result, dict) else None
            if not isinstance(sid, str) or not sid:
                raise AgentDiedError(f"Agent answered {method} without a sessionId")
            if requested_id is not None and sid.lower() != requested_id.lower():
                raise SessionIdNotHonoredError(requested_id, sid)
            session = await self._new_session(sid, agent, agent_name)
            session.forked_from = fork_of
            session.agent_result = result
            return session
        finally:
            self._in_flight_spawns -= 1

    async def _new_session(self, session_id: str, agent: AgentConnection,
                           agent_name: str) -> Session:
        """A started session, then registered: a registered session always runs."""
        session = Session(session_id, self.workspace_cwd, agent, self.options, self.queue_wait,
                          observer=self.observer)
        session.agent_name = agent_name
        session.on_cancel = self._cancel_questions
        await self._tasks().start(session.run)
        terminals = self._closed_terminals.pop(session_id, None)
        if terminals is not None:
            session.prompt_terminals.extend(terminals)
        self._sessions[session_id] = session
        return session

    def _cancel_questions(self, session: Session, reason: str) -> None:
        """The session's pending permission requests and elicitations, cancelled."""
        self.permissions.cancel_session(session, reason)
        self.elicitations.cancel_session(session, reason)

    def _forget(self, session: Session) -> None:
        """Take a closing or dead session out of the registry (and the defaults)."""
        session.closing = True
        if self._sessions.get(session.session_id) is session:
            del self._sessions[session.session_id]
            if session.prompt_terminals:
                self._closed_terminals[session.session_id] = session.prompt_terminals
                if len(self._closed_terminals) > MAX_CLOSED_SESSION_HISTORIES:
                    del self._closed_terminals[next(iter(self._closed_terminals))]
        if self._default_session_ids.get(session.agent_name) == session.session_id:
            del self._default_session_ids[session.agent_name]

    def _drop_session(self, session: Session) -> None:
        self._forget(session)
        session.bus.close()
        session.stop()

    def _info(self, session: Session, *, attached: bool,
              with_history: bool = False) -> SessionInfo:
        session.touch()
        history = session_history(session) if with_history else None
        return SessionInfo(
            session_id=session.session_id, workspace_cwd=session.workspace_cwd,
            attached=attached, client_id=session.register_client(),
            created_at=session.created_at, event_epoch=session.bus.epoch,
            last_event_id=session.bus.last_event_id if history is None else history.last_event_id,
            has_active_prompt=session.pending_count > 0, forked_from=session.forked_from,
            agent=session.agent_name, agent_result=session.agent_result, history=history)

    async def close_session(self, session_id: str, *, reason: str = "client_close",
                            closed_by: str | None = None) -> None:
        session = self.get_session(session_id)
        self._forget(session)
        running = session.active is not None
        session.fail_all(session.close_error(reason))
        self._cancel_questions(session, "session_closed")
        session.bus.publish(ev.SESSION_CLOSED, ev.SessionClosed(
            sessionId=session_id, reason=reason, closedBy=closed_by))
        session.bus.close()
        session.stop()
        agent = session.agent
        if agent.closed:
            return
        with anyio.move_on_after(CLOSE_AGENT_SESSION_TIMEOUT_S):
            try:
                if running:
                    await agent.notify("session/cancel", {"sessionId": session_id})
                if self.agents.capability(session.agent_name, "sessionCapabilities", "close") is not None:
                    await agent.request("session/close", {"sessionId": session_id})
            except Exception as exc:
                log.debug("closing agent session %s: %s", session_id, exc)

    def _on_agent_lost(self, error: AgentDiedError) -> None:
        """The agent died: every session on it dies, every pending prompt fails."""
        for session in [s for s in self._sessions.values() if s.agent.closed]:
            self._forget(session)
            session.bus.publish(ev.SESSION_DIED, ev.SessionDied(
                sessionId=session.session_id, reason="agent_exited", message=str(error),
                exitCode=error.exit_code))
            session.fail_all(error)
            self._cancel_questions(session, "session_died")
            session.bus.close()
            session.stop()

    # -- prompts -------------------------------------------------------------------------
    def send_prompt(self, session_id: str, prompt: list[Any], *, prompt_id: str | None = None,
                    deadline_ms: int | None = None, cancel: CancelToken | None = None,
                    client_id: str | None = None) -> PromptTicket:
        """Admit a prompt or raise, synchronously (see the module contract). Checked in
        this order: the prompt (``InvalidPromptError``, ``TooManyContentBlocksError``),
        the deadline (``InvalidDeadlineError``), the session, the client id
        (``InvalidClientIdError``), then ``Session.admit``."""
        if not isinstance(prompt, list) or not prompt \
                or not all(isinstance(block, dict) for block in prompt):
            raise InvalidPromptError()
        if len(prompt) > self.options.max_prompt_blocks:
            raise TooManyContentBlocksError(len(prompt), self.options.max_prompt_blocks)
        if deadline_ms is not None and not _positive_ms(deadline_ms):
            raise InvalidDeadlineError(deadline_ms)
        session = self.get_session(session_id)
        if client_id is not None and client_id not in session.clients:
            raise InvalidClientIdError(session_id, client_id)
        return session.admit(prompt, prompt_id, self._effective_deadline(deadline_ms), client_id,
                             cancel)

    def _effective_deadline(self, requested_ms: int | None) -> int | None:
        server_ms = self.options.prompt_deadline_ms
        if server_ms is None:
            return None
        return min(server_ms, requested_ms) if requested_ms is not None else server_ms

    async def cancel_session(self, session_id: str, *, reason: str = "client_cancel") -> bool:
        """Cancel the active prompt only (queued prompts still run) and the session's
        pending permission requests; forwards ACP ``session/cancel``. ``True`` if a
        prompt was running."""
        return self.get_session(session_id).cancel_active(reason,
                                                          permission_reason="prompt_cancelled")

    def pending_prompts(self, session_id: str) -> list[PendingPromptInfo]:
        return [p.info() for p in self.get_session(session_id).pending.values()]

    def remove_pending_prompt(self, session_id: str, prompt_id: str) -> str:
        """Drop a queued prompt (slot freed) or cancel the running one. Returns the
        state it was in (``queued`` or ``running``)."""
        session = self.get_session(session_id)
        pending = session.pending.get(prompt_id)
        if pending is None:
            raise PromptNotFoundError(session_id, prompt_id)
        state = pending.state
        session.cancel_prompt(prompt_id, "removed" if state == QUEUED else "client_cancel")
        return state

    # -- branch --------------------------------------------------------------------------
    async def branch_session(self, session_id: str) -> SessionInfo:
        """Fork behind the session's FIFO; takes no prompt slot. Fails fast while prompts
        are pending, as the peer does."""
        session = self.get_session(session_id)
        if session.pending_count > 0:
            raise BranchWhilePromptActiveError(session_id)
        self._check_session_capacity()
        if self.agents.capability(session.agent_name, "sessionCapabilities", "fork") is None:
            raise NotSupportedError("The agent does not support session/fork")

        async def fork() -> Session:
            return await self._spawn("session/fork", session.agent_name, fork_of=session_id)

        item = WorkItem(fork)
        session.enqueue_work(item)
        forked: Session = await item.wait()
        return self._info(forked, attached=False)

    # -- permissions ---------------------------------------------------------------------
    def respond_to_permission(self, request_id: str, outcome: dict[str, Any], *,
                              session_id: str | None = None,
                              voter_client_id: str | None = None) -> None:
        if session_id is not None:
            self.get_session(session_id)
        self.permissions.vote(request_id, outcome, session_id=session_id,
                              voter_client_id=voter_client_id)

    def respond_to_elicitation(self, request_id: str, answer: dict[str, Any], *,
                               session_id: str | None = None) -> None:
        """First responder wins (``bridge.elicitation``)."""
        if session_id is not None:
            self.get_session(session_id)
        self.elicitations.respond(request_id, answer, session_id=session_id)

    # -- events and clients --------------------------------------------------------------
    def subscribe(self, session_id: str, *, last_event_id: int | None = None,
                  epoch: str | None = None, max_queued: int | None = None) -> Subscription:
        session = self.get_session(session_id)
        session.touch()
        return session.bus.subscribe(last_event_id=last_event_id, epoch=epoch,
                                     max_queued=max_queued)

    def check_client(self, session_id: str, client_id: str) -> None:
        if client_id not in self.get_session(session_id).clients:
            raise InvalidClientIdError(session_id, client_id)

    def heartbeat(self, session_id: str, client_id: str | None = None) -> float:
        session = self.get_session(session_id)
        if client_id is not None:
            self.check_client(session_id, client_id)
            session.clients[client_id] = time.time()
        session.touch()
        return time.time()

    def session_status(self, session_id: str) -> SessionStatus:
        session = self.get_session(session_id)
        return SessionStatus(
            session_id=session.session_id, workspace_cwd=session.workspace_cwd,
            created_at=session.created_at, client_count=len(session.clients),
            active_prompt_id=session.active.prompt_id if session.active else None,
            pending_prompts=session.pending_count, queued_prompts=session.queued_count,
            pending_permissions=self.permissions.count(session),
            subscribers=session.bus.subscriber_count, last_event_id=session.bus.last_event_id,
            event_epoch=session.bus.epoch, agent=session.agent_name,
            max_pending_prompts=session.limit,
            active_prompt_text=session.active.text if session.active else None,
            updated_at=time.time() - max(0.0, time.monotonic() - session.last_seen),
            origin=session.origin)

    def stats(self) -> BridgeStats:
        sessions = list(self._sessions.values())
        pending = sum(s.pending_count for s in sessions)
        active = sum(1 for s in sessions if s.active is not None)
        return BridgeStats(
            sessions=len(sessions), admission_in_flight=self._in_flight_spawns,
            pending_prompts=pending, queued_prompts=pending - active, active_prompts=active,
            pending_permissions=self.permissions.pending_count,
            subscribers=sum(s.bus.subscriber_count for s in sessions),
            prompt_queue_wait=self.queue_wait.snapshot())

    # -- the idle reaper -----------------------------------------------------------------
    async def _reaper(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                      ) -> None:
        task_status.started()
        while True:
            await anyio.sleep(self.options.session_reap_interval_ms / 1000)
            await self.reap_idle_sessions()

    async def reap_idle_sessions(self) -> list[str]:
        threshold = self.options.session_idle_timeout_ms / 1000
        now = time.monotonic()
        idle = [s.session_id for s in self._sessions.values()
                if not s.closing and now - s.last_seen >= threshold
                and s.bus.subscriber_count == 0 and s.pending_count == 0
                and not self.permissions.count(s)]
        for session_id in idle:
            if session_id in self._sessions:
                await self.close_session(session_id, reason="idle_timeout")
        return idle


class _AgentClientAdapter:
    """The ACP client side the bridge offers its agent."""

    def __init__(self, bridge: Bridge) -> None:
        self._bridge = bridge

    def session_update(self, session_id: str, params: msgspec.Raw | dict[str, Any]) -> None:
        session = self._bridge._sessions.get(session_id)
        if session is None or session.closing:
            log.debug("dropping session/update for unknown session %s", session_id)
            return
        prompt_id = session.active.prompt_id if session.active is not None else None
        session.bus.publish(ev.SESSION_UPDATE, params, prompt_id=prompt_id)

    async def wait_for_readers(self, session_id: str) -> None:
        """Flow control for an agent that can wait (the in-process one): see ``bus``."""
        session = self._bridge._sessions.get(session_id)
        if session is not None:
            await session.bus.wait_for_readers()

    async def request_permission(self, session_id: str, params: dict[str, Any]) -> dict[str, Any]:
        session = self._bridge._sessions.get(session_id)
        if session is None or session.closing:
            return {"outcome": {"outcome": "cancelled"}}
        return await self._bridge.permissions.request(session, params)

    async def create_elicitation(self, session_id: str, params: dict[str, Any]) -> dict[str, Any]:
        session = self._bridge._sessions.get(session_id)
        if session is None or session.closing:
            return {"action": "cancel"}
        return await self._bridge.elicitations.request(session, params)

    def complete_elicitation(self, session_id: str | None, params: Any) -> None:
        """``elicitation/complete``: its session by ``sessionId`` or by the URL
        elicitation it completes; otherwise dropped."""
        mediator = self._bridge.elicitations
        session = self._bridge._sessions.get(session_id) if session_id is not None \
            else mediator.session_of(params.get("elicitationId") if isinstance(params, dict)
                                     else None)
        if session is not None and not session.closing and isinstance(params, dict):
            mediator.complete(session, params)

    async def read_text_file(self, session_id: str, params: dict[str, Any]) -> dict[str, Any]:
        return await anyio.to_thread.run_sync(fs.read_text_file, self._workspace(session_id), params)

    async def write_text_file(self, session_id: str, params: dict[str, Any]) -> dict[str, Any]:
        return await anyio.to_thread.run_sync(fs.write_text_file, self._workspace(session_id), params)

    def _workspace(self, session_id: str) -> str:
        session = self._bridge._sessions.get(session_id)
        return session.workspace_cwd if session is not None else self._bridge.workspace_cwd

    def connection_lost(self, error: AgentDiedError) -> None:
        self._bridge._on_agent_lost(error)


def _positive_ms(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 2**31 - 1
