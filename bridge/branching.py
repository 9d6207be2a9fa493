"""The branch half of the ``Bridge`` API: a session forked behind its own FIFO.

    info = await bridge.branch_session(session_id, owner="alice")   # the fork's SessionInfo

``Bridge`` inherits it. Contracts: the fork waits its turn in the session's queue (a
``WorkItem``) and takes no prompt slot; it fails fast while prompts are pending
(``BranchWhilePromptActiveError``, as the peer does), with ``NotSupportedError`` when
the agent offers no ``session/fork``, and with ``SessionNotRestorableError`` while a
restored session's agent is not listed. A fork made after its caller gave up is
closed (``branch_abandoned``), its slot given back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge.errors import BranchWhilePromptActiveError, NotSupportedError, SessionClosedError
from bridge.session import Session, WorkItem
from bridge.spawning import spawn

if TYPE_CHECKING:
    from bridge.agent_pool import AgentPool
    from bridge.agents.base import AgentConnection
    from bridge.capacity import SessionCapacity
    from bridge.status import SessionInfo


class BranchingAPI:
    agents: AgentPool
    capacity: SessionCapacity
    _sessions: dict[str, Session]

    def get_session(self, session_id: str) -> Session:
        raise NotImplementedError   # Bridge's

    async def _agent_of(self, session: Session) -> AgentConnection:
        raise NotImplementedError   # AgentCallsAPI's

    def _info(self, session: Session, *, attached: bool) -> SessionInfo:
        raise NotImplementedError   # Bridge's

    def close_session_soon(self, session_id: str, *, reason: str = "client_close") -> None:
        raise NotImplementedError   # Bridge's

    async def branch_session(self, session_id: str, *, owner: str | None = None) -> SessionInfo:
        """Fork behind the session's FIFO; takes no prompt slot. Fails fast while prompts
        are pending, as the peer does. The fork's ``owner``: the principal asking."""
        session = self.get_session(session_id)
        if session.pending_count > 0:
            raise BranchWhilePromptActiveError(session_id)
        if session.agent_name not in self.agents:   # restored, its agent not listed (yet)
            await self._agent_of(session)           # SessionNotRestorableError while so
        self.capacity.check(session.agent_name)
        if self.agents.capability(session.agent_name, "sessionCapabilities", "fork") is None:
            raise NotSupportedError("The agent does not support session/fork")

        waiting = True   # its caller (a client gone, say): a fork made after is dropped

        async def fork() -> Session:
            if not waiting:
                raise SessionClosedError(session_id, "branch_abandoned")
            await self._agent_of(session)   # a restored session: the agent knows it first
            forked = await spawn(self, "session/fork",  # type: ignore[arg-type]
                                 session.agent_name, fork_of=session_id, owner=owner)
            if not waiting:
                self._drop_fork(forked)
            return forked

        item = WorkItem(fork)
        session.enqueue_work(item)
        try:
            made: Session = await item.wait()
        except BaseException:
            waiting = False
            if item.done.is_set() and isinstance(item.outcome, Session):
                self._drop_fork(item.outcome)   # made as its caller left
            raise
        return self._info(made, attached=False)

    def _drop_fork(self, forked: Session) -> None:
        """A fork nobody waits for any more: closed, its slot given back."""
        if self._sessions.get(forked.session_id) is forked:
            self.close_session_soon(forked.session_id, reason="branch_abandoned")

