"""Making a session on its agent: the slot, the agent's answer, the registration.

    session = await spawn(bridge, "session/new", agent_name, requested_id=sid, owner="alice")
    session = await spawn(bridge, "session/load", agent_name, restore_id=sid)   # a cold load
    forked = await spawn(bridge, "session/fork", agent_name, fork_of=parent_id)

The one way a ``Bridge`` makes a session on an agent: ``create_session`` and
``attach_session`` (``bridge.bridge``), a branch (``bridge.branching``), a cold load,
resume or reseed (``bridge.restore``). Contracts:

* The session's slot (``bridge.capacity``) is taken first, with no await before, and
  goes to the session once it is registered; a spawn that fails, times out or whose
  caller gives up releases it.
* The agent's answer is checked before anything is registered: it names a session
  id, one a store can hold (``bridge.journal.storable``), the requested one (else
  ``SessionIdNotHonoredError``), never a live session's (``AgentProtocolError``: the
  live session untouched, agent isolation).
* An agent that died as it was asked ``session/new`` (or as it loaded) is started anew
  and asked once more: nothing was made on the dead one.
* A load (``restore_id``) registers the session before its agent answers
  (``load_on``: its replay is the session's events); until the answer a prompt or
  another load waits for it, and an answer that fails drops the session again.
* A registered session has started (``new_session``: its worker in the bridge's task
  group), holds its slot, and is journaled unless its origin is unjournaled; its
  record is committed before the spawn returns (``Bridge._record_session``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from bridge import events as ev
from bridge.errors import (
    AgentDiedError,
    AgentProtocolError,
    SessionClosedError,
    SessionIdNotHonoredError,
)
from bridge.events import Event
from bridge.journal import storable
from bridge.session import Session
from bridge.transcript import TRANSCRIPT_META, after_seed, seed_of, transcript

if TYPE_CHECKING:
    from bridge.agents.base import AgentConnection
    from bridge.bridge import Bridge

log = logging.getLogger("bridge")

REQUESTED_SESSION_ID_META = "acp-server/requestedSessionId"


async def spawn(bridge: Bridge, method: str, agent_name: str, *,
                requested_id: str | None = None, restore_id: str | None = None,
                fork_of: str | None = None, origin: str | None = None,
                scope: str = "thread", owner: str | None = None,
                seeded: list[Event] | None = None, seed: str | None = None,
                forked_from: str | None = None, display_name: str | None = None) -> Session:
    """Make a session on the agent (the module's contracts). ``seeded``: a closed
    session's journaled events (``restore.reseed_closed``): the new session gets their
    transcript after its ``seed`` (a branch's: the conversation it was made from, kept
    by its record), and their conversation as its first events. ``forked_from`` (and
    ``seed``): what the id's record says it was forked from, which a new life of a
    branch (a cold load, a reseed) keeps in its own record (``fork_of`` makes one);
    ``display_name`` too (a branch takes its parent's: its conversation starts there)."""
    bridge.capacity.take(agent_name)
    bridge._in_flight_spawns += 1
    registered = False
    try:
        agent = await bridge._ensure_agent(agent_name)
        params: dict[str, Any] = {"cwd": bridge.workspace_cwd, "mcpServers": []}
        if restore_id is not None or fork_of is not None:
            params["sessionId"] = restore_id or fork_of
        if requested_id is not None:
            params["_meta"] = {REQUESTED_SESSION_ID_META: requested_id}
            if seeded is not None:
                params["_meta"][TRANSCRIPT_META] = after_seed(seed, transcript(seeded))
        if restore_id is not None:
            session = await new_session(bridge, restore_id, agent, agent_name,
                                        origin=origin, owner=owner)
            session.forked_from, session.seed = forked_from, seed
            session.display_name = display_name
            registered = True   # the session holds the slot: dropped, it frees it
            try:
                await load_on(bridge, session, agent, method, params)
            except AgentDiedError:
                if not agent.closed:
                    raise
                # it died as it loaded (maybe dying already): its replay went with
                # the session dropped; a fresh one is asked, once
                log.warning("agent %s died at %s; asking it again, started anew",
                            agent_name, method)
                bridge.capacity.take(agent_name)
                registered = False
                agent = await bridge._ensure_agent(agent_name)
                session = await new_session(bridge, restore_id, agent, agent_name,
                                            origin=origin, owner=owner)
                session.forked_from, session.seed = forked_from, seed
                session.display_name = display_name
                registered = True
                await load_on(bridge, session, agent, method, params)
            await bridge._record_session(session, scope, loaded=True)
            return session
        try:
            result = await bridge._agent_request(agent, method, params)
        except AgentDiedError:
            if method != "session/new" or not agent.closed:
                raise
            # it died as it was asked (it may have been dying already: a crash a
            # moment before): nothing was made on it, so a fresh one is asked, once
            log.warning("agent %s died at %s; asking it again, started anew",
                        agent_name, method)
            agent = await bridge._ensure_agent(agent_name)
            result = await bridge._agent_request(agent, method, params)
        sid = result.get("sessionId") if isinstance(result, dict) else None
        if not isinstance(sid, str) or not sid:
            raise AgentProtocolError(f"Agent answered {method} without a sessionId",
                                     agent_name)
        if not storable(sid):
            raise AgentProtocolError(f"Agent answered {method} with a session id "
                                     f"no store can hold (a NUL, or over 1 KiB)",
                                     agent_name)
        if requested_id is not None and sid.lower() != requested_id.lower():
            raise SessionIdNotHonoredError(requested_id, sid)
        if sid in bridge._sessions:   # never replace a live session (agent isolation)
            log.warning("agent %s answered %s with the id of live session %s: refused",
                        agent_name, method, sid)
            raise AgentProtocolError(f"Agent answered {method} with the id of a live "
                                     f"session", agent_name)
        session = await new_session(bridge, sid, agent, agent_name, origin=origin,
                                    owner=owner)
        registered = True
        session.forked_from = fork_of or forked_from   # a reseeded branch: its origin
        session.seed = seed   # a reseeded branch's record keeps what it was made from
        parent = bridge._sessions.get(fork_of) if fork_of is not None else None
        session.display_name = parent.display_name if parent is not None else display_name
        if parent is not None and bridge.journal.durable:   # what its agent side has:
            # the parent's turns not committed yet too (its record commits after them)
            session.seed = seed_of(parent.seed, parent.bus.ring_events(held=True))
        session.agent_result = result
        if seeded is not None:
            replay_closed(session, seeded)
        await bridge._record_session(session, scope, loaded=seeded is not None)
        return session
    finally:
        bridge._in_flight_spawns -= 1
        if not registered:
            bridge.capacity.release(agent_name)


async def new_session(bridge: Bridge, session_id: str, agent: AgentConnection,
                      agent_name: str, *, origin: str | None = None,
                      owner: str | None = None) -> Session:
    """A started session, then registered: a registered session always runs and
    holds the slot its spawn took."""
    session = Session(session_id, bridge.workspace_cwd, agent, bridge.options,
                      bridge.queue_wait, observer=bridge.observer)
    session.agent_name = agent_name
    session.origin = origin
    session.owner = bridge._closed_owners.get(session_id) or owner
    session.on_cancel = bridge._cancel_questions
    session.on_turn_end = bridge._end_turn_questions
    session.on_abandoned = bridge._agent_abandoned
    session.start(bridge._tasks())
    terminals = bridge._closed_terminals.pop(session_id, None)
    if terminals is not None:
        session.prompt_terminals.keep_all(terminals)
    bridge._sessions[session_id] = session
    session.holds_slot = True
    if origin not in bridge.unjournaled_origins:
        bridge._journal_new(session)
    return session


async def load_on(bridge: Bridge, session: Session, agent: AgentConnection, method: str,
                  params: dict[str, Any]) -> None:
    """``session``, registered (the load replays its history as ``session/update``),
    loaded (or resumed) on ``agent``; dropped again when the agent fails it."""
    # Reachable now, but nothing reaches the agent for it before its answer: a prompt
    # admitted meanwhile, or another load attaching, waits for it.
    answered = anyio.Event()
    session.agent_side = _load_answered(bridge, session, answered)
    try:
        result = await bridge._agent_request(agent, method, params)
    except BaseException:
        bridge._drop_session(session)
        raise
    finally:
        answered.set()
        session.agent_side = None
    session.agent_result = result if isinstance(result, dict) else {}


def _load_answered(bridge: Bridge, session: Session,
                   answered: anyio.Event) -> Callable[[], Awaitable[None]]:
    """What waits on a session whose ``session/load`` (or resume) the agent has not
    answered yet: its answer; ``SessionClosedError`` when the load failed (the session
    was dropped)."""
    async def wait() -> None:
        await answered.wait()
        if bridge._sessions.get(session.session_id) is not session:
            raise SessionClosedError(session.session_id, "closed")
    return wait


def replay_closed(session: Session, events: list[Event]) -> None:
    """The closed life's conversation (its ``session_update`` events, in order) as the
    new life's first events (``restore.reseed_closed``)."""
    for event in events:
        if event.type == ev.SESSION_UPDATE:
            session.bus.publish(ev.SESSION_UPDATE, event.data, prompt_id=event.prompt_id,
                                originator_client_id=event.originator_client_id)
