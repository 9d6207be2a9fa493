"""The read side of the ``Bridge`` API: a session's status, the listings, the counts.

    bridge.session_status(session_id)         # SessionStatus, or SessionNotFoundError
    bridge.published_event_id(session_id)     # its last event id, committed or not
    bridge.settled_pending(session_id)        # its ended turns the status counts until committed
    bridge.list_sessions()                    # this bridge's live sessions, creation order
    await bridge.list_all_sessions()          # and, with several instances, the others'
    bridge.stats()                            # BridgeStats: what /daemon/status counts

``Bridge`` inherits these; they use what every ``Bridge`` has (``_sessions``,
``permissions``, ``queue_wait``, ``get_session``). Contracts: ``list_all_sessions`` adds
what ``sessions_elsewhere`` gives (the composition sets it when several instances share
one store: ``acp_server.fleet.replica``), never a session live here twice; when that
cannot be read (the store down) it is this bridge's own, logged, never an error: a
listing shows what it can. A status's ``last_event_id`` is the last event readers may
see (on a durable journal, the last committed), never one a store outage holds.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from bridge.errors import JournalUnavailableError
from bridge.session_views import held_turns
from bridge.status import BridgeStats, SessionStatus

if TYPE_CHECKING:
    from bridge.pending import QueueWaitStats
    from bridge.permissions import PermissionMediator
    from bridge.session import Session

log = logging.getLogger("bridge")


class ListingAPI:
    _sessions: dict[str, Session]
    _in_flight_spawns: int
    _foreign_dropped: int
    permissions: PermissionMediator
    queue_wait: QueueWaitStats
    # the sessions other instances run, for the listings (set by the composition)
    sessions_elsewhere: Callable[[], Awaitable[list[SessionStatus]]] | None = None

    def get_session(self, session_id: str) -> Session:
        raise NotImplementedError   # Bridge's

    def list_sessions(self) -> list[SessionStatus]:
        """Every live session's status, in creation order."""
        return [self._status(session) for session in self._sessions.values()]

    async def list_all_sessions(self) -> list[SessionStatus]:
        """What the listings show: ``list_sessions``, and with several instances on one
        store (``sessions_elsewhere``, set by the composition) the sessions the others
        run. The store down: this instance's own, logged."""
        here = self.list_sessions()
        if self.sessions_elsewhere is None:
            return here
        try:
            others = await self.sessions_elsewhere()
        except JournalUnavailableError as exc:
            log.warning("listing this instance's sessions only: the journal cannot say "
                        "which others run (%s)", exc)
            return here
        return here + [s for s in others if s.session_id not in self._sessions]

    def session_status(self, session_id: str) -> SessionStatus:
        return self._status(self.get_session(session_id))

    def settled_pending(self, session_id: str) -> int:
        """The session's prompts that ended whose ends are not committed yet: counted
        pending by ``session_status`` (as its readers see them) until they are."""
        held = held_turns(self.get_session(session_id))
        return len(held) if held is not None else 0

    def published_event_id(self, session_id: str) -> int:
        """The session's last event id published, committed or not (``session_status``
        says the last committed): what a door waits for its stream to pass."""
        return self.get_session(session_id).bus.last_event_id

    def _status(self, session: Session) -> SessionStatus:
        """The session's status (its ``last_event_id``: ``Session.status``)."""
        return session.status(self.permissions.count(session), self.permissions.asked(session))

    def stats(self) -> BridgeStats:
        sessions = list(self._sessions.values())
        pending = sum(s.pending_count for s in sessions)
        active = sum(1 for s in sessions if s.active is not None)
        return BridgeStats(
            sessions=len(sessions), admission_in_flight=self._in_flight_spawns,
            pending_prompts=pending, queued_prompts=pending - active, active_prompts=active,
            pending_permissions=self.permissions.pending_count,
            subscribers=sum(s.bus.subscriber_count for s in sessions),
            prompt_queue_wait=self.queue_wait.snapshot(),
            foreign_messages_dropped=self._foreign_dropped)
