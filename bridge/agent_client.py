"""The ACP client side the bridge offers each agent, confined to that agent's sessions.

    client = AgentSide(bridge, "qwen")             # one per configured agent
    connection = await factory.connect(client, task_group)

Contracts (agent isolation):

* An agent's ``session/update``, ``session/request_permission``, ``elicitation/*`` and
  ``fs/*`` act only on sessions that agent owns (sessions it made, or restored,
  through this bridge).
* A message naming another agent's live session is dropped, logged (a warning naming
  both agents) and counted (``Bridge.stats().foreign_messages_dropped`` and the
  observer's ``foreign_message_dropped``). To the agent it looks exactly like a
  message for an unknown session, so it learns nothing about the others: an update
  or an ``elicitation/complete`` is dropped, a permission request is answered
  ``cancelled``, an elicitation ``{"action": "cancel"}``, an ``fs/*`` request gets
  -32002 "Session not found".
* Messages for unknown (e.g. just closed) sessions are dropped quietly (debug log).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from bridge import events as ev
from bridge import fs
from bridge.agent_state import reported
from bridge.agents.base import RESOURCE_NOT_FOUND, RequestError
from bridge.errors import AgentDiedError
from bridge.loggable import loggable

if TYPE_CHECKING:
    from bridge.bridge import Bridge
    from bridge.session import Session

log = logging.getLogger("bridge")

CANCELLED = {"outcome": {"outcome": "cancelled"}}


class AgentSide:
    """``bridge.agents.base.AgentClient`` for the agent ``agent_name``."""

    def __init__(self, bridge: Bridge, agent_name: str) -> None:
        self._bridge = bridge
        self.agent_name = agent_name

    def _own(self, session_id: str, method: str) -> Session | None:
        """The session if this agent owns it (see the module contracts), else ``None``."""
        session = self._bridge._sessions.get(session_id)
        if session is None or session.closing:
            log.debug("agent %s: %s for unknown session %s dropped", self.agent_name,
                      loggable(method, 128), loggable(session_id, 128))
            return None
        if session.agent_name != self.agent_name:
            log.warning("agent %s: %s for session %s of agent %s dropped (not its session)",
                        self.agent_name, loggable(method, 128), loggable(session_id, 128),
                        session.agent_name)
            self._bridge._foreign_message(self.agent_name, method)
            return None
        return session

    def session_update(self, session_id: str, params: msgspec.Raw | dict[str, Any]) -> None:
        session = self._own(session_id, "session/update")
        if session is None or session.replaying:   # a restore's replay: journaled already
            return
        reported(session.agent_result, params)   # its mode, its options (agent_state)
        if session.straggler is not None:   # of a turn given up on (``bridge.turn``)
            return
        prompt_id = session.active.prompt_id if session.active is not None else None
        session.bus.publish(ev.SESSION_UPDATE, params, prompt_id=prompt_id)

    async def wait_for_readers(self, session_id: str) -> None:
        """Flow control for an agent that can wait (the in-process one; a stdio agent's
        reader after each update): see ``bus``. Nothing is logged or counted here (the
        update itself was)."""
        session = self._bridge._sessions.get(session_id)
        if session is not None and session.agent_name == self.agent_name \
                and not session.closing and session.straggler is None:
            await session.bus.wait_for_readers()

    async def request_permission(self, session_id: str, params: dict[str, Any]) -> dict[str, Any]:
        session = self._own(session_id, "session/request_permission")
        if session is None or session.straggler is not None:   # (a turn given up on)
            return {"outcome": dict(CANCELLED["outcome"])}
        return await self._bridge.permissions.request(session, params)

    async def create_elicitation(self, session_id: str, params: dict[str, Any]) -> dict[str, Any]:
        session = self._own(session_id, "elicitation/create")
        if session is None or session.straggler is not None:   # (a turn given up on)
            return {"action": "cancel"}
        return await self._bridge.elicitations.request(session, params)

    def complete_elicitation(self, session_id: str | None, params: Any) -> None:
        """``elicitation/complete``: its session by ``sessionId`` or by the URL
        elicitation it completes (which must be this agent's); otherwise dropped."""
        if not isinstance(params, dict):
            return
        if session_id is None:
            session_id = self._bridge.elicitations.session_of(params.get("elicitationId"))
        session = self._own(session_id, "elicitation/complete") if session_id else None
        if session is not None:
            self._bridge.elicitations.complete(session, params)

    async def read_text_file(self, session_id: str, params: dict[str, Any]) -> dict[str, Any]:
        workspace = self._workspace(session_id, "fs/read_text_file")
        return await anyio.to_thread.run_sync(fs.read_text_file, workspace, params)

    async def write_text_file(self, session_id: str, params: dict[str, Any]) -> dict[str, Any]:
        workspace = self._workspace(session_id, "fs/write_text_file")
        return await anyio.to_thread.run_sync(fs.write_text_file, workspace, params)

    def _workspace(self, session_id: str, method: str) -> str:
        session = self._own(session_id, method)
        if session is None:
            raise RequestError(RESOURCE_NOT_FOUND, "Session not found")
        return session.workspace_cwd

    def connection_lost(self, error: AgentDiedError) -> None:
        self._bridge._on_agent_lost(error)


__all__ = ["AgentSide"]
