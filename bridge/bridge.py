"""The bridge: sessions, prompt admission, cancel, branch, permissions, events.

    async with Bridge(ReferenceAgentFactory(), workspace_cwd="/ws") as bridge:
        info = await bridge.create_session()
        ticket = bridge.send_prompt(info.session_id, [{"type": "text", "text": "hi"}])
        async for event in bridge.subscribe(info.session_id, last_event_id=ticket.last_event_id):
            ...
        result = await ticket

``Bridge`` knows nothing of HTTP. Every front door drives it through these methods
and maps its errors (``bridge.errors``) to wire answers; what it reports is typed
(``bridge.status``), its events are ``bridge.events``. All traffic to one agent goes
through one shared ``AgentConnection`` (started on first use, restarted after death).

Contracts:

* Every request the bridge awaits from an agent has a deadline: ``initialize``
  ``initialize_timeout_ms`` (``AgentTimeoutError``); ``session/new``, ``load``,
  ``resume``, ``fork`` and ``close`` ``agent_request_timeout_ms``
  (``AgentRequestTimeoutError``). A caller that gives up (is cancelled) releases
  what it held at once.
* The session cap: a session takes a slot from the moment it starts being made
  until it is gone, and each agent gets a share of the cap (``bridge.capacity``), so
  an agent that hangs or fails never takes another agent's reserve.
* Agents are isolated: an agent acts only on its own sessions
  (``bridge.agent_client``), and a ``session/new`` answer naming a live session is
  refused (``AgentProtocolError``), the live session untouched (``bridge.spawning``
  makes every session).
* A session id no store can hold (a NUL, over 1 KiB: ``bridge.journal.storable``)
  names no session: a load or resume of one is ``SessionNotFoundError`` before the
  agent or the journal is asked, ``recall_owner`` of one is ``None`` without a read,
  and an agent's answer naming one is refused (``AgentProtocolError``). So the
  journal never gets a record it cannot commit (on PostgreSQL one failed the commit
  it shared, or every one after it).
* ``aclose`` (and leaving ``async with``) closes every live session, whoever else
  is closing sessions at the same time, then stops the agents.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import anyio
import anyio.abc

from bridge import events as ev
from bridge.abandoning import give_up
from bridge.agent_calls import AgentCallsAPI
from bridge.agent_client import AgentSide
from bridge.agent_pool import AgentPool
from bridge.agents.base import AgentFactory
from bridge.branching import BranchingAPI
from bridge.bus import EventBus
from bridge.capacity import SessionCapacity
from bridge.elicitation import ElicitationMediator
from bridge.errors import (
    AgentDiedError,
    JournalUnavailableError,
    SessionClosedError,
    SessionNotFoundError,
    SessionNotRestorableError,
    WorkspaceMismatchError,
)
from bridge.history import session_history
from bridge.journal import MemoryJournal, SessionJournal, storable
from bridge.observer import NO_OBSERVER, BridgeObserver
from bridge.options import BridgeOptions
from bridge.permissions import PermissionMediator
from bridge.journaling import Journaling
from bridge.listing import ListingAPI
from bridge.presence import PresenceAPI
from bridge.prompts import PromptsAPI
from bridge.restore import journaled_agent, restore_cold, restore_sessions
from bridge.session import QueueWaitStats, Session
from bridge.spawning import spawn
from bridge.status import SessionInfo

log = logging.getLogger("bridge")

MAX_CLOSED_SESSION_HISTORIES = 1024
DELETIONS = frozenset({"client_close", "deleted"})   # close reasons that remove the journal
MAX_CLOSED_SESSION_OWNERS = 50_000


class Bridge(Journaling, ListingAPI, PromptsAPI, PresenceAPI, AgentCallsAPI,
             BranchingAPI):
    def __init__(self, agent_factory: AgentFactory, *, workspace_cwd: str,
                 options: BridgeOptions | None = None,
                 agents: Mapping[str, AgentFactory] | None = None,
                 journal: SessionJournal | None = None,
                 unjournaled_origins: frozenset[str] = frozenset({"lmsp"}),
                 journal_clock: Callable[[], float] = time.time) -> None:
        """``agent_factory`` is the default agent, named by its ``name``; ``agents`` adds
        more by name (a session picks one with ``agent=``). ``journal``
        (``bridge.journal``; default ``MemoryJournal``) makes sessions durable, except
        those made with an ``origin`` in ``unjournaled_origins`` (LMSP's sessions:
        its tasks are durable on their own); ``journal_clock`` dates the closes it
        records (the retention's clock)."""
        self.options = options or BridgeOptions()
        self.workspace_cwd = os.path.realpath(workspace_cwd)
        default = getattr(agent_factory, "name", None) or "default"
        self.agents = AgentPool({default: agent_factory, **(agents or {})}, default=default,
                                initialize_timeout_ms=self.options.initialize_timeout_ms)
        self._clients = {name: AgentSide(self, name) for name in self.agents.names}   # isolated
        self.permissions = PermissionMediator(self.options.permission_response_timeout_ms)
        self.elicitations = ElicitationMediator(self.options.permission_response_timeout_ms)
        self.queue_wait = QueueWaitStats()
        self.observer: BridgeObserver = NO_OBSERVER
        self.started_at = time.time()
        self._sessions: dict[str, Session] = {}
        self.capacity = SessionCapacity(self.options.session_limit, self.agents.names)
        self._in_flight_spawns = 0
        self._foreign_dropped = 0
        self._default_session_ids: dict[str, str] = {}   # agent name → its default session
        self._default_spawns: dict[str, anyio.Event] = {}
        self._restoring: dict[str, anyio.Event] = {}   # cold loads in flight, by id
        # Prompt terminals of closed sessions, for a later cold load (bounded, oldest out).
        self._closed_terminals: dict[str, Any] = {}
        # The principals that made closed sessions (journaled or seen here; bounded,
        # oldest out): a cold load keeps its maker as owner.
        self._closed_owners: dict[str, str] = {}
        self.journal: SessionJournal = journal or MemoryJournal()
        self.journal_clock = journal_clock
        self.unjournaled_origins = unjournaled_origins
        self._held: dict[str, EventBus] = {}   # journaled buses, until fully released
        self.journal.bind(self._events_committed)
        self.restored: list[str] = []   # the sessions the journal brought back at start
        self.unrestored: set[str] = set()   # their restore failed (``bridge.restore``)
        self.sessions_elsewhere = None   # the others' sessions (``ListingAPI``)
        self._task_group: anyio.abc.TaskGroup | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._closed = False
        # Called before a session that is not live here is loaded or resumed through
        # the agent: the composition's sessions across instances (acp_server.fleet)
        # adopt it here when its owner's lease expired, or raise a BridgeError when
        # another instance runs it.
        self.before_restore: Callable[[str], Awaitable[None]] | None = None

    # -- lifecycle ---------------------------------------------------------------------
    async def __aenter__(self) -> Bridge:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self._running())
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        stack, self._stack = self._stack, None
        assert stack is not None, "the bridge is not running"
        await stack.aclose()   # the body's own exception propagates unwrapped

    @contextlib.asynccontextmanager
    async def _running(self) -> AsyncIterator[None]:
        """The bridge's task group: sessions, agents and the reaper live in it."""
        async with anyio.create_task_group() as tg:
            self._task_group = tg
            if self.options.session_reap_interval_ms and self.options.session_idle_timeout_ms:
                await tg.start(self._reaper)
            if self.journal.durable:
                self.restored = await restore_sessions(self, await self.journal.restore())
            try:
                yield
            finally:
                with anyio.CancelScope(shield=True):
                    await self.aclose()
                tg.cancel_scope.cancel()

    async def aclose(self) -> None:
        """Cancel every prompt, close every session (concurrently: one hung agent costs
        one ``agent_request_timeout_ms``), stop the agents. A session closed meanwhile
        by someone else (a door, the LMSP runner) is simply skipped."""
        if self._closed:
            return
        self._closed = True
        await self._stop_journaling()
        async with anyio.create_task_group() as tg:
            for session_id in list(self._sessions):
                tg.start_soon(self._close_if_live, session_id)
        await self.agents.aclose()

    async def _close_if_live(self, session_id: str, reason: str = "shutdown") -> None:
        try:
            await self.close_session(session_id, reason=reason)
        except SessionNotFoundError:
            pass   # closed meanwhile (e.g. an LMSP task ending during the drain)

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

    # -- sessions ------------------------------------------------------------------------
    def get_session(self, session_id: str) -> Session:
        """The live ``Session`` (the bridge's own object: for the bridge and its tests;
        doors use ``session_status`` / ``list_sessions``)."""
        session = self._sessions.get(session_id)
        if session is None or session.closing:
            raise SessionNotFoundError(session_id)
        return session

    def has_session(self, session_id: str) -> bool:   # a live session
        return session_id in self._sessions

    def history_bytes(self, session_id: str) -> int:
        """The bytes of the live session's replayable events (its ring's envelopes),
        what its history weighs; 0 for a session that is not live."""
        session = self._sessions.get(session_id)
        return session.bus.ring_size_bytes if session is not None else 0

    def session_owner(self, session_id: str) -> str | None:
        """The principal that made the session (the ``owner=`` of its creation, kept
        in the journal across restarts), for a live or a closed session; ``None``
        when unknown. The bridge only keeps the label; the doors decide who sees what."""
        session = self._sessions.get(session_id)
        if session is not None:
            return session.owner
        return self._closed_owners.get(session_id)

    async def recall_owner(self, session_id: str) -> str | None:
        """``session_owner``, else the maker journaled with the session's record (a
        closed session forgotten past ``MAX_CLOSED_SESSION_OWNERS``), remembered: what a
        door asks before it lets a caller restore a session by id. The record is read
        for every storable id, the maker known or not: a door's 404 for another
        principal's session then costs the store read an unknown id's costs (its
        existence does not show in the work done). Raises ``JournalUnavailableError``
        when the journal cannot answer and nothing is known of the session here."""
        known = self.session_owner(session_id)
        if not storable(session_id):
            return known
        try:
            record = await self.journal.record_of(session_id)
        except JournalUnavailableError:
            if known is not None or session_id in self._sessions:
                return self.session_owner(session_id)   # what this instance knows holds
            raise
        live = self._sessions.get(session_id)
        if live is not None:   # live (or made live while the record was read)
            return live.owner
        known = self.session_owner(session_id)
        if known is None and record is not None:
            known = record.owner
            self.remember_owner(session_id, known)
        return known

    def remember_owner(self, session_id: str, owner: str | None) -> None:
        """Keep the maker of a closed session (restore at start, closes)."""
        if owner is None:
            return
        self._closed_owners[session_id] = owner
        if len(self._closed_owners) > MAX_CLOSED_SESSION_OWNERS:
            del self._closed_owners[next(iter(self._closed_owners))]

    def sessions(self) -> list[Session]:
        """The live ``Session`` objects (see ``get_session``)."""
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

    async def wait_for_session_slot(self, agent: str | None = None) -> None:
        """Return once a session on ``agent`` would not be refused for want of a slot
        (``SessionLimitExceededError``): for work that queues for a slot rather than
        failing. Another caller may take the slot first: retry in a loop."""
        name = await self.resolve_agent(agent)
        while not self.capacity.available(name):
            await self.capacity.changed.wait()

    async def create_session(self, *, cwd: str | None = None, session_id: str | None = None,
                             agent: str | None = None, origin: str | None = None,
                             owner: str | None = None) -> SessionInfo:
        """A fresh session (``thread`` scope) on ``agent`` (default: the default agent).
        A requested id that is live attaches. ``origin`` labels who made it for the
        listings (``"lmsp"``, ``"conformance"``; ``None``: a person's client); ``owner``
        is the principal that made it (journaled with the session: ``session_owner``).
        The bridge only keeps both."""
        self.check_workspace(cwd)
        name = await self.resolve_agent(agent)
        if session_id is not None and session_id in self._sessions:
            return self._info(self.get_session(session_id), attached=True)
        session = await spawn(self, "session/new", name, requested_id=session_id,
                                    origin=origin, owner=owner)
        return self._info(session, attached=False)

    async def attach_session(self, *, cwd: str | None = None, agent: str | None = None,
                             owner: str | None = None) -> SessionInfo:
        """The workspace's default session of ``agent`` (``single`` scope), created on
        first use; concurrent first attaches share one spawn. A default restored after a
        restart has its agent side restored first; one its agent cannot restore keeps
        its history (a ``thread`` session to load or read) and a new default is made,
        so that attaching never hands out a session every prompt to is refused."""
        self.check_workspace(cwd)
        name = await self.resolve_agent(agent)
        while True:
            sid = self._default_session_ids.get(name)
            if sid is not None and sid in self._sessions:
                live = self._sessions[sid]
                if live.agent_side is not None:   # restored, not yet used: restore it
                    await live.agent_side()
                    continue                      # (anything may have changed meanwhile)
                if live.not_restorable is None:
                    return self._info(live, attached=True)
                log.warning("session %s: its agent cannot restore it; a new default "
                            "session of %r is made", sid, name)
                del self._default_session_ids[name]
            spawning = self._default_spawns.get(name)
            if spawning is None:
                break
            await spawning.wait()
        spawning = self._default_spawns[name] = anyio.Event()
        try:
            session = await spawn(self, "session/new", name, scope="single", owner=owner)
            self._default_session_ids[name] = session.session_id
        finally:
            del self._default_spawns[name]
            spawning.set()
        return self._info(session, attached=False)

    async def load_session(self, session_id: str, *, cwd: str | None = None,
                           agent: str | None = None, owner: str | None = None) -> SessionInfo:
        """Attach a live session, or restore it through ACP ``session/load`` (a session
        with a known maker keeps it as owner; else ``owner`` becomes it). Concurrent
        loads of one id make one session: the others attach to it."""
        return await self._restore("session/load", session_id, cwd, agent, ("loadSession",),
                                   owner)

    async def resume_session(self, session_id: str, *, cwd: str | None = None,
                             agent: str | None = None, owner: str | None = None) -> SessionInfo:
        """Attach a live session, or restore it through ACP ``session/resume`` (no replay)."""
        return await self._restore("session/resume", session_id, cwd, agent,
                                   ("sessionCapabilities", "resume"), owner)

    async def _restore(self, method: str, session_id: str, cwd: str | None, agent: str | None,
                       capability: tuple[str, ...], owner: str | None) -> SessionInfo:
        self.check_workspace(cwd)
        name = await self.resolve_agent(agent)
        if session_id not in self._sessions and not storable(session_id):
            raise SessionNotFoundError(session_id)   # see the module contracts
        with_history = method == "session/load"
        if session_id not in self._sessions and self.before_restore is not None:
            await self.before_restore(session_id)   # adopted here, or refused
        if session_id not in self._sessions and session_id in self.unrestored:
            raise SessionNotRestorableError(session_id, "its restore at this start failed; "
                                            "the next start tries again")   # never anew
        if session_id in self._sessions:
            live = self._sessions[session_id]
            if live.agent_side is not None:   # restored, or loading: the agent's answer
                try:                          # (not restorable: the history still is)
                    await live.agent_side()
                except SessionClosedError:    # that load failed: so does this one,
                    restoring = self._restoring.get(session_id)
                    if restoring is None:     # unless it goes on (reseeded): attach then
                        raise SessionNotFoundError(session_id) from None
                    await restoring.wait()
                    return await self._restore(method, session_id, cwd, agent, capability,
                                               owner)
            return self._info(live, attached=True, with_history=with_history)
        await self.recall_owner(session_id)   # its maker, even forgotten past the bound
        if agent is None:   # the journal's agent of it, when it is configured here
            name = await journaled_agent(self, session_id, name)
        if session_id in self._sessions:     # restored by another call meanwhile
            return await self._restore(method, session_id, cwd, agent, capability, owner)
        await self._ensure_agent(name)
        if session_id in self._sessions:   # restored by another call while the agent started
            return await self._restore(method, session_id, cwd, agent, capability, owner)
        offered = self.agents.capability(name, *capability)
        restoring = self._restoring.get(session_id)
        if restoring is not None:   # another call restores it: attach to what it made
            await restoring.wait()
            return await self._restore(method, session_id, cwd, agent, capability, owner)
        self._restoring[session_id] = done = anyio.Event()
        try:
            session = await restore_cold(self, method, name, session_id, owner,
                                         offered not in (None, False))
        finally:
            del self._restoring[session_id]
            done.set()
        if session is None:   # restored by another call meanwhile
            return await self._restore(method, session_id, cwd, agent, capability, owner)
        return self._info(session, attached=False, with_history=with_history)

    def _cancel_questions(self, session: Session, reason: str,
                          prompt_id: str | None = None) -> None:
        """The session's pending permission requests and elicitations (with
        ``prompt_id``: those asked during its turn), cancelled."""
        self.permissions.cancel_session(session, reason, prompt_id)
        self.elicitations.cancel_session(session, reason, prompt_id)

    def _agent_abandoned(self, session: Session, prompt_id: str | None, done: anyio.Event,
                         asking: anyio.CancelScope, waited_ms: int) -> None:
        """A turn its agent never ended: give up on the agent for ``session``
        (``bridge.abandoning``), in the bridge's task group."""
        self._tasks().start_soon(give_up, self, session, prompt_id, done, asking, waited_ms)

    def _end_turn_questions(self, session: Session, prompt_id: str) -> None:
        """The questions asked during a turn that has ended, still open: cancelled."""
        self._cancel_questions(session, "turn_ended", prompt_id)

    def _forget(self, session: Session, *, made: bool = True) -> None:
        """Take a closing or dead session out of the registry (and the defaults); its
        slot is released. ``made=False`` (a session undone before it was made): its
        would-be owner is not remembered as the maker of that id."""
        session.closing = True
        if self._sessions.get(session.session_id) is session:
            del self._sessions[session.session_id]
            # its pending prompts are settled after this (``fail_all``): their
            # terminals go to the same deque, kept here for a later cold load
            if session.prompt_terminals or session.pending:
                self._closed_terminals[session.session_id] = session.prompt_terminals
                if len(self._closed_terminals) > MAX_CLOSED_SESSION_HISTORIES:
                    del self._closed_terminals[next(iter(self._closed_terminals))]
            if made:
                self.remember_owner(session.session_id, session.owner)
        if session.holds_slot:
            session.holds_slot = False
            self.capacity.release(session.agent_name)
        if self._default_session_ids.get(session.agent_name) == session.session_id:
            del self._default_session_ids[session.agent_name]

    def _drop_session(self, session: Session) -> None:
        """Undo a session being made (its load or its record failed): a prompt admitted
        meanwhile fails (``SessionClosedError``), never left waiting; its events reset."""
        self._forget(session, made=False)
        session.fail_all(session.close_error("closed"))
        session.bus.close()
        self._reset_events(session)   # what of it the journal has is not kept
        self._unhold(session)
        session.stop()

    def _info(self, session: Session, *, attached: bool,
              with_history: bool = False) -> SessionInfo:
        return session.info(attached, session_history(session) if with_history else None)

    async def close_session(self, session_id: str, *, reason: str = "client_close",
                            closed_by: str | None = None) -> None:
        """Close a live session (``SessionNotFoundError`` otherwise): its prompts fail,
        its permission requests are cancelled, ``session_closed`` is published and its
        bus closed, at once; then the agent gets ``session/cancel`` (a turn was running)
        and ``session/close`` (when offered), awaited at most
        ``agent_request_timeout_ms``. A deletion (``DELETIONS``: REST ``DELETE`` and
        ``/acp`` ``session/close``, ``client_close``; ``/acp`` ``session/delete``,
        ``deleted``) removes the session's journal, and returns once that is
        committed; ``JournalUnavailableError`` while the store is down (the session is
        closed here all the same, its removal committed once the store is back)."""
        session = self.get_session(session_id)
        running, ended = self._close_here(session, reason, closed_by)
        await self._close_at_agent(session, running)
        if reason in DELETIONS:
            await self._end_committed(session, ended)

    def close_session_soon(self, session_id: str, *, reason: str = "client_close",
                           closed_by: str | None = None) -> None:
        """``close_session`` without waiting for the agent: the session is closed on
        the bridge when this returns; the agent is told in the background."""
        session = self.get_session(session_id)
        running, _ = self._close_here(session, reason, closed_by)
        self._tasks().start_soon(self._close_at_agent, session, running)

    def _close_here(self, session: Session, reason: str,
                    closed_by: str | None) -> tuple[bool, int]:
        """The bridge side of a close (synchronous); whether a turn was running, and the
        journal sequence number of the session's end (0: not journaled)."""
        self._forget(session)
        running = session.active is not None
        session.fail_all(session.close_error(reason))
        self._cancel_questions(session, "session_closed")
        session.bus.publish(ev.SESSION_CLOSED, ev.SessionClosed(   # the closer, as the peer
            session_id=session.session_id, reason=reason, closed_by=closed_by),
            originator_client_id=closed_by)
        ended = self._record_end(session, deleted=reason in DELETIONS)   # after its
        session.bus.close()                                                   # last event
        session.stop()
        return running, ended

    async def _close_at_agent(self, session: Session, running: bool) -> None:
        agent, sid = session.agent, session.session_id
        if agent is None or agent.closed:
            return
        try:
            if running:
                await agent.notify("session/cancel", {"sessionId": sid})
            if self.agents.capability(session.agent_name, "sessionCapabilities", "close") is not None:
                await self._agent_request(agent, "session/close", {"sessionId": sid})
        except Exception as exc:   # the agent's business now: the session is gone here
            log.debug("closing agent session %s: %s", sid, exc)

    def _on_agent_lost(self, error: AgentDiedError) -> None:
        """The agent died: every session on it dies, every pending prompt fails. As on a
        close, the prompts' ``turn_error``s come before ``session_died``: a reader's
        stream ends with the session, and it must have seen its turn's end by then.
        A session whose agent side is being loaded or restored on it (``agent_side``)
        is not: that request fails with the death, and its owner asks a fresh agent."""
        for session in [s for s in self._sessions.values()
                        if s.agent is not None and s.agent.closed and s.agent_side is None]:
            self._forget(session)
            session.fail_all(error)
            self._cancel_questions(session, "session_died")
            session.bus.publish(ev.SESSION_DIED, ev.SessionDied(
                session_id=session.session_id, reason="agent_exited", message=str(error),
                exit_code=error.exit_code))
            self._record_end(session, deleted=False)
            session.bus.close()
            session.stop()
