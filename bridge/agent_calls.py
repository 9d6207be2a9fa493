"""The agents half of the ``Bridge`` API: requests to a session's agent with their
deadline, requests the bridge has no rule for, what the agents report, and the agents
offered while the bridge runs.

    answer = await bridge.forward(session_id, "session/set_mode", {"modeId": "plan"})
    info = await bridge.start_agent()   # the default agent, started: its initialize answer
    await bridge.forward_notification(session_id, "session/cancel", {"sessionId": sid})
    bridge.agent_capability("qwen", "sessionCapabilities", "fork")   # None: not offered
    state = await bridge.agent_state(session_id)   # {"modes": {...}, "models": ..., ...}
    previous = await bridge.set_mode(session_id, "plan")   # "default"
    answer, change = await bridge.set_setting(session_id, "session/set_model", params)
    [a.name for a in bridge.list_agents()]                            # the default first
    bridge.agent_finder = catalog       # lists agents again (bridge.agents.catalog)
    bridge.add_agents({"llama3:8b": factory})                         # offered from now on
    name = await bridge.resolve_agent("llama3:8b")   # unknown: the finder is asked first

``Bridge`` inherits these. Contracts: ``_agent_request`` gives up after
``agent_request_timeout_ms`` (``AgentRequestTimeoutError``; a late answer is ignored);
``forward`` and ``forward_notification`` pass the agent's answer through unchanged,
after restoring the agent side of a session restored from the journal
(``SessionNotRestorableError`` when it cannot be); an unknown agent name is
``AgentNotFoundError``. ``agent_state`` is the session's state as the agent answered
it (its ``session/new``, ``load`` or ``resume`` answer less the id: ``modes``,
``models``, ``configOptions``), with the changes the setters made (``SETTING_METHODS``,
any door: a success is recorded there, the current mode, the current model, the options
the agent answered;
one setter at a time per session: ``set_mode`` answers the mode it replaced,
``set_setting`` what changed); and what the agent reports on its own
(``current_mode_update``, ``config_option_update``: ``bridge.agent_state``). Every
setter, whichever door, goes through ``_set``, which publishes qwen's events for it
(``bridge.setting_changes``).

Agents offered while the bridge runs: ``add_agents`` adds them (pool, client, a share
of the session cap) in one step with no await, so every caller sees an agent whole or
not at all; agents are never removed. ``agent_finder`` (``None``: the agents are fixed)
is asked to look for more (``refresh``: rate-limited and single-flight, it calls
``add_agents`` itself) when ``resolve_agent`` meets an unknown name, when a restored
session's agent is missing (``bridge.restore``), and, bounded by ``wait_s``, before a
listing (``refresh_agents``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import anyio
import anyio.abc

from bridge.agent_client import AgentSide
from bridge.agent_state import record
from bridge.agents.base import AgentConnection, AgentFactory
from bridge.errors import (
    AgentNotFoundError,
    AgentRequestTimeoutError,
    BridgeError,
    SessionNotRestorableError,
)
from bridge.journaling import session_record
from bridge.setting_changes import (
    SettingChange,
    announce,
    announce_failure,
    change_of,
)
from bridge.settings import SETTING_METHODS, keep
from bridge.status import AgentStatus

if TYPE_CHECKING:
    from bridge.agent_pool import AgentPool
    from bridge.capacity import SessionCapacity
    from bridge.observer import BridgeObserver
    from bridge.options import BridgeOptions
    from bridge.session import Session


LISTING_WAIT_S = 2.0   # a listing of the agents waits at most this long for the finder


class SetResult(NamedTuple):
    """``set_setting``'s: the agent's answer and what it changed."""

    answer: Any
    change: SettingChange | None


class AgentFinder(Protocol):
    """Looks for more agents (``bridge.agents.catalog.ModelCatalog``)."""

    async def refresh(self, *, wait_s: float | None = None) -> None: ...


class AgentCallsAPI:
    options: BridgeOptions
    agents: AgentPool
    capacity: SessionCapacity
    agent_finder: AgentFinder | None = None
    observer: BridgeObserver
    _clients: dict[str, AgentSide]
    _sessions: dict[str, Session]
    _foreign_dropped: int

    def _tasks(self) -> anyio.abc.TaskGroup:
        raise NotImplementedError   # Bridge's

    def get_session(self, session_id: str) -> Session:
        raise NotImplementedError   # Bridge's

    def add_agents(self, factories: Mapping[str, AgentFactory]) -> list[str]:
        """Offer these agents from now on (see the module docstring); the names added
        (a name already offered keeps its agent)."""
        added = []
        for name, factory in factories.items():
            if self.agents.add(name, factory):
                self._clients[name] = AgentSide(self, name)  # type: ignore[arg-type]
                self.capacity.add(name)
                added.append(name)
        return added

    async def resolve_agent(self, name: str | None) -> str:
        """``agents.resolve``, the finder asked first when ``name`` is unknown (it may
        be a model listed since): ``AgentNotFoundError`` when it still is. A known name
        returns without yielding to the loop."""
        try:
            return self.agents.resolve(name)
        except AgentNotFoundError:
            if self.agent_finder is None:
                raise
        await self.agent_finder.refresh()
        return self.agents.resolve(name)

    async def refresh_agents(self, *, wait_s: float | None = None) -> None:
        """Let the finder look for more agents (when due), waiting at most ``wait_s``."""
        if self.agent_finder is not None:
            await self.agent_finder.refresh(wait_s=wait_s)

    async def _ensure_agent(self, name: str) -> AgentConnection:
        return await self.agents.ensure(name, self._clients[name], self._tasks())

    async def start_agent(self, name: str | None = None) -> dict[str, Any]:
        """Agent ``name`` (default: the default agent) started if it is not running,
        and its ``initialize`` answer (``agent_info``). At once when it runs; else
        within the ``initialize`` timeout, or the start's error (``AgentStartError``,
        ``AgentTimeoutError``, ``AgentUnavailableError``). The start is the agent's,
        not the caller's: a caller that gives up does not cut it short (others may
        share it)."""
        name = self.agents.resolve(name)
        if self.agents.state(name) == "running":
            return self.agents.info(name)
        done = anyio.Event()
        failure: list[BaseException] = []

        async def start() -> None:
            try:
                await self._ensure_agent(name)
            except Exception as exc:
                failure.append(exc)
            finally:
                done.set()

        self._tasks().start_soon(start)
        await done.wait()
        if failure:
            raise failure[0]
        return self.agents.info(name)

    async def _agent_request(self, agent: AgentConnection, method: str, params: Any) -> Any:
        """``agent.request`` within ``agent_request_timeout_ms``, else
        ``AgentRequestTimeoutError`` (a late answer is ignored)."""
        timeout_ms = self.options.agent_request_timeout_ms
        with anyio.move_on_after(timeout_ms / 1000):
            return await agent.request(method, params)
        raise AgentRequestTimeoutError(method, timeout_ms)

    async def forward(self, session_id: str, method: str, params: Any, *,
                      bounded: bool = False) -> Any:
        """Send an ACP request the bridge has no rule for (``session/set_mode``, ...)
        to the session's agent, unchanged; its answer, unchanged. A setter (``SETTING_METHODS``,
        any door) is ``set_setting``'s, within ``agent_request_timeout_ms``
        (``AgentRequestTimeoutError``); any other request too when ``bounded``."""
        if method not in SETTING_METHODS or not isinstance(params, dict):
            agent = await self._agent_of(self.get_session(session_id))
            if bounded:
                return await self._agent_request(agent, method, params)
            return await agent.request(method, params)
        return (await self.set_setting(session_id, method, params)).answer

    async def set_setting(self, session_id: str, method: str, params: dict[str, Any], *,
                          client_id: str | None = None) -> SetResult:
        """A setter (``SETTING_METHODS``) forwarded under the session's setter lock (``_set``):
        the agent's answer, unchanged, and what it changed (``change``: the setting,
        its value before as last known and after; ``None`` for params naming none).
        ``client_id``: the caller's, its events' ``originatorClientId`` when the
        session issued it."""
        session = self.get_session(session_id)
        async with session.setting:
            return await self._set(session, method, params, client_id)

    async def set_mode(self, session_id: str, mode_id: str, *,
                       client_id: str | None = None) -> Any:
        """``session/set_mode`` forwarded; the mode before it as last known (``None``
        when the agent reported none), read and changed under the session's setter
        lock, so two at once each get the one the other left."""
        result = await self.set_setting(session_id, "session/set_mode",
                                        {"sessionId": session_id, "modeId": mode_id},
                                        client_id=client_id)
        return result.change.old if result.change is not None else None

    async def _set(self, session: Session, method: str, params: dict[str, Any],
                   client_id: str | None) -> SetResult:
        """A setter asked of the agent. Once it accepted: recorded in the session's state
        (``agent_state``), announced on its bus (``bridge.setting_changes``: qwen's
        ``approval_mode_changed``, ``model_switched``; a model refused or not answered:
        ``model_switch_failed``) and kept in its journal record (``bridge.settings``),
        committed (the event with it, appended first) before the answer is returned
        (``JournalUnavailableError`` when that fails: nothing acknowledged); not kept for
        a session closed or deleted meanwhile. A refusal (the agent's JSON-RPC error) is
        raised as its connection made it, bounded (``bridge.wire.agent_error``). Within ``agent_request_timeout_ms``
        (``AgentRequestTimeoutError``): an agent that never answers one holds neither its
        caller nor the session's setter lock for ever."""
        change = change_of(session.agent_result, method, params)
        agent = await self._agent_of(session)
        try:
            answer = await self._agent_request(agent, method, params)
        except BridgeError as exc:   # a refusal: bounded (``bridge.wire.agent_error``)
            if change is not None:
                announce_failure(session, change, exc, client_id)
            raise
        record(session.agent_result, method, params, answer)
        if change is not None:
            announce(session, change, client_id)
        if change is not None and session.journal.durable \
                and self._sessions.get(session.session_id) is session and not session.closing:
            if keep(session.settings, change.setting, method, params, session.session_id):
                await session.journal.wait(session.journal.append(session_record(session)))
                return SetResult(answer, change)
        if change is not None and session.journal.durable:   # its event, committed first
            await session.journal.wait(session.journal.appended)
        return SetResult(answer, change)

    async def agent_state(self, session_id: str) -> dict[str, Any]:
        """The session's state as its agent answered it (the module docstring), the
        agent side restored first."""
        session = self.get_session(session_id)
        await self._agent_of(session)
        return {k: v for k, v in session.agent_result.items() if k != "sessionId"}

    async def forward_notification(self, session_id: str, method: str, params: Any) -> None:
        """The same for an ACP notification."""
        session = self.get_session(session_id)
        await (await self._agent_of(session)).notify(method, params)

    async def _agent_of(self, session: Session) -> AgentConnection:
        """The session's agent, its agent side restored first (a session restored from
        the journal, ``bridge.restore``); ``SessionNotRestorableError`` when it cannot be."""
        if session.agent_side is not None:
            await session.agent_side()
        if session.not_restorable is not None or session.agent is None:
            raise SessionNotRestorableError(session.session_id,
                                            session.not_restorable or "no agent")
        return session.agent

    def agent_info(self, name: str | None = None) -> dict[str, Any]:
        """The ``initialize`` answer of agent ``name`` (default: the default agent);
        empty before its first start. ``AgentNotFoundError`` for an unknown name."""
        return self.agents.info(self.agents.resolve(name))

    def agent_capability(self, name: str | None, *path: str) -> Any:
        """One of agent ``name``'s ``agentCapabilities`` (``None`` when not offered),
        e.g. ``agent_capability("qwen", "sessionCapabilities", "fork")``."""
        return self.agents.capability(self.agents.resolve(name), *path)

    def list_agents(self) -> list[AgentStatus]:
        """Every configured agent, in configuration order (the default first)."""
        counts: dict[str, int] = {}
        for session in self._sessions.values():
            counts[session.agent_name] = counts.get(session.agent_name, 0) + 1
        return [AgentStatus(name=name, default=name == self.agents.default,
                            state=self.agents.state(name), sessions=counts.get(name, 0),
                            info=self.agents.info(name)) for name in self.agents.names]

    def _foreign_message(self, agent: str, method: str) -> None:   # bridge.agent_client
        self._foreign_dropped += 1
        self.observer.foreign_message_dropped(agent, method)

