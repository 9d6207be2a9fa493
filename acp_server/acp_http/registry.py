"""The live ``/acp`` connections of one app: the cap, lookup, DELETE and reaping.

    registry = ConnectionRegistry(bridge, max_connections=64, grace_s=10.0)
    routes = acp_http.routes(registry, config)     # the composition owns the registry
    conn = registry.create()                       # ConnectionCapError past the cap
    registry.get(conn.id)                          # None once closed or reaped
    registry.close(conn)                           # DELETE /acp
    registry.sweep()                               # reap connections without streams

Contracts:

* At most ``max_connections`` connections are live (HTTP and WebSocket together), and
  at most ``principal_share`` of them (three quarters) are one principal's, so one
  token cannot lock every other out; before refusing one, connections past their
  grace period are reaped.
* A connection whose streams have all been gone for ``grace_s`` seconds (or that
  never opened one) is reaped exactly as a DELETE would close it. ``sweep()`` runs
  at the start of every ``/acp`` request, and a stream whose client disconnected
  runs it once more ``grace_s`` later, so reaping does not depend on traffic.
* Closing cancels the permission requests the connection was sent, and closes the
  sessions it made, only on sessions that no other live connection serves
  (``AcpConnection.close``). The connections that still serve a session it made
  inherit it: a session made over ``/acp`` is closed when the last connection that
  made or attached it goes away.
* A ``resumable`` connection that is lost (its socket dropped, or it was reaped), not
  closed by DELETE or shutdown, leaves its permission requests pending and its
  sessions open for ``resume_grace_s`` (default 600 s), so that its client can
  reconnect, attach them and answer them; a sweep after that cancels the requests
  and closes the sessions that no live connection serves by then (those that one
  serves are inherited by it).

One registry per server, built by the composition (``acp_server.server``) from the
``AcpConfig``; ``clock=`` takes any ``Clock`` (``now()`` and ``sleep()``), e.g. one a
test advances.
"""

from __future__ import annotations

import time
from typing import Protocol

import anyio

from acp_server.acp_http.connection import AcpConnection
from acp_server.principals import Caller
from bridge import Bridge
from bridge.errors import BridgeError
from bridge.ids import uuid4_str

DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_GRACE_S = 10.0
DEFAULT_RESUME_GRACE_S = 600.0


class Clock(Protocol):
    """The time grace periods are measured in (seconds, monotonic)."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


MONOTONIC = MonotonicClock()


class ConnectionCapError(Exception):
    def __init__(self, limit: int, mine: bool = False) -> None:
        super().__init__("Too many ACP connections of this principal; retry later" if mine
                         else "Too many ACP connections; retry later")
        self.limit = limit


def principal_share(max_connections: int) -> int:
    """The connections one principal may hold: all but a quarter of the cap."""
    return max(1, max_connections - max_connections // 4)


class ConnectionRegistry:
    def __init__(self, bridge: Bridge, *, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 grace_s: float = DEFAULT_GRACE_S, clock: Clock = MONOTONIC,
                 resume_grace_s: float = DEFAULT_RESUME_GRACE_S) -> None:
        self.bridge = bridge
        self.clock = clock
        self.max_connections = max_connections
        self.grace_s = grace_s
        self.resume_grace_s = resume_grace_s
        # Permission requests of lost resumable connections: (deadline, request, session),
        # and the sessions they made: (deadline, session).
        self.lingering: list[tuple[float, str, str]] = []
        self.lingering_sessions: list[tuple[float, str]] = []
        self.connections: dict[str, AcpConnection] = {}
        self.reaped = 0
        self._shutdown = anyio.Event()

    def create(self, connection_id: str | None = None, *, websocket: bool = False,
               caller: Caller | None = None) -> AcpConnection:
        share = principal_share(self.max_connections)
        if len(self.connections) >= share:
            self.sweep()
        if len(self.connections) >= self.max_connections:
            raise ConnectionCapError(self.max_connections)
        if caller is not None and len(self.connections) >= share and sum(
                1 for c in self.connections.values() if c.caller.name == caller.name) >= share:
            raise ConnectionCapError(share, mine=True)
        conn = AcpConnection(connection_id or uuid4_str(), self.bridge, websocket=websocket,
                             clock=self.clock.now)
        if caller is not None:
            conn.caller = caller
        self.connections[conn.id] = conn
        return conn

    def get(self, connection_id: str) -> AcpConnection | None:
        return self.connections.get(connection_id)

    def close(self, conn: AcpConnection, *, lost: bool = False) -> None:
        """``lost``: the transport went away (not DELETE): a resumable connection's
        permission requests linger (see the module contracts)."""
        if self.connections.get(conn.id) is conn:
            del self.connections[conn.id]
        if lost and conn.resumable and not conn.closed:
            deadline = self.clock.now() + self.resume_grace_s
            self.lingering.extend((deadline, request_id, session_id)
                                  for request_id, session_id in conn.pending_requests.items())
            self.lingering_sessions.extend((deadline, sid) for sid in conn.owned)
            conn.owned.clear()
            conn.close(served_elsewhere=lambda sid: True)   # nothing cancelled, nothing closed
            return
        for session_id in conn.owned:   # the connections still serving it inherit it
            self._inherit(session_id, conn)
        conn.close(served_elsewhere=lambda sid: self.served_elsewhere(sid, conn))

    def _inherit(self, session_id: str, conn: AcpConnection | None = None) -> bool:
        """Every other live connection serving ``session_id`` owns it now; ``False``
        when there is none."""
        heirs = [other for other in self.connections.values()
                 if other is not conn and _serves(other, session_id)]
        for heir in heirs:
            heir.own(session_id)
        return bool(heirs)

    def served_elsewhere(self, session_id: str, conn: AcpConnection) -> bool:
        return any(other is not conn and _serves(other, session_id)
                   for other in self.connections.values())

    def shutdown(self) -> None:
        """Close every connection (their streams end) and end pending grace waits.
        Call it before stopping the server so shutdown does not wait for them."""
        self._shutdown.set()
        for conn in list(self.connections.values()):
            conn.owned.clear()   # the bridge's drain closes every session (reason shutdown)
            self.close(conn)
        self.lingering.clear()   # the sessions close next, and their permissions with them
        self.lingering_sessions.clear()

    async def sweep_after_grace(self) -> None:
        """Wait out the grace period (or shutdown), then sweep; then, while permission
        requests linger, sweep again at the earliest of their deadlines."""
        delay = self.grace_s
        while not self._shutdown.is_set():
            async with anyio.create_task_group() as tg:
                async def end_on_shutdown() -> None:
                    await self._shutdown.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(end_on_shutdown)
                await self.clock.sleep(delay)
                tg.cancel_scope.cancel()
            self.sweep()
            deadlines = [d for d, _r, _s in self.lingering] + [d for d, _s in self.lingering_sessions]
            if not deadlines:
                return
            delay = max(0.0, min(deadlines) - self.clock.now())

    def sweep(self) -> list[str]:
        """Reap every connection whose streams have been gone for the grace period;
        cancel the lingering permission requests past their deadline."""
        now = self.clock.now()
        expired = [c for c in self.connections.values()
                   if c.streams_gone_at is not None and now - c.streams_gone_at >= self.grace_s]
        for conn in expired:
            self.close(conn, lost=True)
        self.reaped += len(expired)
        if self.lingering:
            self._cancel_lingering(now)
        if self.lingering_sessions:
            self._close_lingering(now)
        return [c.id for c in expired]

    def _close_lingering(self, now: float) -> None:
        due = [sid for deadline, sid in self.lingering_sessions if deadline <= now]
        self.lingering_sessions = [e for e in self.lingering_sessions if e[0] > now]
        for session_id in due:
            if self._inherit(session_id):
                continue   # a live connection serves it again: it owns it now
            try:
                self.bridge.close_session_soon(session_id, reason="connection_closed")
            except BridgeError:
                pass   # closed meanwhile

    def _cancel_lingering(self, now: float) -> None:
        due = [entry for entry in self.lingering if entry[0] <= now]
        self.lingering = [entry for entry in self.lingering if entry[0] > now]
        for _deadline, request_id, session_id in due:
            if any(_serves(c, session_id) for c in self.connections.values()):
                continue   # a live connection serves the session: it was re-sent there
            try:
                self.bridge.respond_to_permission(request_id, {"outcome": "cancelled"},
                                                  session_id=session_id)
            except BridgeError:
                pass   # answered meanwhile, or the session is gone


def _serves(conn: AcpConnection, session_id: str) -> bool:
    """``conn`` has a channel of ``session_id`` and its principal sees the session (a
    stream another principal opened for it serves nothing: ``AcpConnection.channel``)."""
    return session_id in conn.channels and conn.caller.sees_session(session_id)
