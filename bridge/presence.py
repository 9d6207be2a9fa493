"""The readers and clients half of the ``Bridge`` API: subscriptions, client ids,
heartbeats, and the reaper of sessions nobody uses.

    subscription = bridge.subscribe(session_id, last_event_id=7, epoch=epoch)
    bridge.check_client(session_id, client_id)     # or InvalidClientIdError
    bridge.heartbeat(session_id, client_id)        # the time it was seen (epoch s)
    closed = await bridge.reap_idle_sessions()     # what the reaper does every interval

``Bridge`` inherits these. Contracts: a subscription or a heartbeat counts as use
(``Session.touch``); a session is idle, and closed with ``idle_timeout``, only when
unused for ``session_idle_timeout_ms`` with no reader, no pending prompt and no
pending permission request; every lookup of an unknown or closed session raises
``SessionNotFoundError``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from bridge.errors import InvalidClientIdError

if TYPE_CHECKING:
    from bridge.options import BridgeOptions
    from bridge.permissions import PermissionMediator
    from bridge.session import Session
    from bridge.subscription import Subscription
    from bridge.wakeup import Wakeup


class PresenceAPI:
    options: BridgeOptions
    permissions: PermissionMediator
    _sessions: dict[str, Session]

    def get_session(self, session_id: str) -> Session:
        raise NotImplementedError   # Bridge's

    async def _close_if_live(self, session_id: str, reason: str = "shutdown") -> None:
        raise NotImplementedError   # Bridge's

    # -- readers and clients --------------------------------------------------------------
    def subscribe(self, session_id: str, *, last_event_id: int | None = None,
                  epoch: str | None = None, max_queued: int | None = None,
                  wakeup: Wakeup | None = None) -> Subscription:
        """The session's events from now on (or replayed after ``last_event_id`` of
        ``epoch``, ``bridge.bus``); ``subscription.epoch`` is the bus epoch its ids
        belong to. ``wakeup`` is set whenever a frame arrives or the subscription
        ends (for a reader of several sources)."""
        session = self.get_session(session_id)
        session.touch()
        return session.bus.subscribe(last_event_id=last_event_id, epoch=epoch,
                                     max_queued=max_queued, wakeup=wakeup)

    def check_client(self, session_id: str, client_id: str) -> None:
        if not self.get_session(session_id).knows_client(client_id):
            raise InvalidClientIdError(session_id, client_id)

    def heartbeat(self, session_id: str, client_id: str | None = None) -> float:
        session = self.get_session(session_id)
        if client_id is not None:
            self.check_client(session_id, client_id)
            session.clients[client_id] = time.time()
        session.touch()
        return time.time()

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
                if now - s.last_seen >= threshold
                and s.bus.subscriber_count == 0 and s.pending_count == 0
                and not self.permissions.count(s)]
        for session_id in idle:
            if session_id in self._sessions:
                await self._close_if_live(session_id, "idle_timeout")
        return idle
