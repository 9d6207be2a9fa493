"""Connection guard below ASGI: a header timeout and a connection cap for uvicorn.

    stats = GuardStats()                 # handed to whoever reports it (/daemon/status)
    protocol = guarded_protocol(header_timeout_s=10.0, max_connections=2560, stats=stats)
    uvicorn.Config(app, http=protocol, ...)
    raise_fd_limit()                   # soft RLIMIT_NOFILE -> hard, at start-up

Why here: uvicorn closes an idle keep-alive connection ``timeout_keep_alive`` after a
response, but a fresh connection (or one that sent half a request head) waits
forever, and its ``limit_concurrency`` answers 503 to *requests* (``/health``
included) while the idle sockets keep their file descriptors. Both happen before
the application (and its authentication) sees anything, so the guard is a subclass
of uvicorn's own HTTP protocol.

Contracts:

* A connection that has not sent a complete request head within
  ``header_timeout_s`` of being accepted, or of its previous response, once it
  starts a new one, is closed. The timer ends when the head is complete (the
  request then runs without a timeout of ours) or the connection is upgraded to a
  WebSocket. Between requests uvicorn's keep-alive timeout still applies.
* Past ``max_connections`` live connections (HTTP and WebSocket, SSE streams
  included), a new connection is answered at once with ``503`` (``Retry-After: 5``,
  ``Connection: close``) without reading it, and closed; it is counted in
  ``stats.connections_refused`` (a header timeout in ``stats.header_timeouts``).
* ``raise_fd_limit`` raises the soft file-descriptor limit to the hard one and
  returns it; ``connection_cap`` keeps the cap ``FD_RESERVE`` below that limit.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import resource
from typing import Any

log = logging.getLogger("acp_server.http")

FD_RESERVE = 256   # descriptors left for the store, agents, logs and the listening socket
_REFUSAL_BODY = b'{"error":"Too many connections","code":"connection_limit"}'
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"retry-after: 5\r\nconnection: close\r\ncontent-length: "
            + str(len(_REFUSAL_BODY)).encode() + b"\r\n\r\n" + _REFUSAL_BODY)


@dataclasses.dataclass(slots=True)
class GuardStats:
    """The guard's counters, one object per server (created by the composition)."""

    connections_refused: int = 0
    header_timeouts: int = 0


def raise_fd_limit() -> int:
    """Soft ``RLIMIT_NOFILE`` raised to the hard limit; the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:   # some sandboxes refuse it
            log.warning("cannot raise the file-descriptor limit to %s: %s", target, exc)
    return int(soft) if soft != resource.RLIM_INFINITY else 1 << 20


def connection_cap(requested: int, fd_limit: int) -> int:
    """The cap in force: ``requested``, kept ``FD_RESERVE`` below the descriptor limit."""
    cap = min(requested, max(1, fd_limit - FD_RESERVE))
    if cap < requested:
        log.warning("--max-connections %s lowered to %s (file-descriptor limit %s)",
                    requested, cap, fd_limit)
    return cap


def _base_protocol() -> type:
    """uvicorn's ``http="auto"`` choice: httptools when installed, else h11."""
    if importlib.util.find_spec("httptools") is not None:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        return HttpToolsProtocol
    from uvicorn.protocols.http.h11_impl import H11Protocol
    return H11Protocol


def guarded_protocol(*, header_timeout_s: float, max_connections: int, stats: GuardStats,
                     base: type | None = None) -> type:
    """An HTTP protocol class for ``uvicorn.Config(http=...)`` with both guards,
    counting in ``stats``."""
    parent: Any = base or _base_protocol()

    class GuardedProtocol(parent):  # type: ignore[misc, valid-type]
        _refused = False
        _head_timer: Any = None
        _waiting_for: Any = None   # the cycle in force when the timer was armed

        def connection_made(self, transport: Any) -> None:
            if len(self.connections) >= max_connections:
                self._refused = True
                stats.connections_refused += 1
                transport.write(_REFUSAL)
                transport.close()
                return
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused:
                return
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            if self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()   # a new request starts after a response: its head is timed
            super().data_received(data)
            if self._head_timer is not None and (
                    self.cycle is not self._waiting_for
                    or self.transport.get_protocol() is not self):
                self._disarm()   # the head is complete, or the connection was upgraded

        def _arm(self) -> None:
            self._waiting_for = self.cycle
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or self.transport.get_protocol() is not self:
                return
            stats.header_timeouts += 1
            self.transport.close()

    GuardedProtocol.__name__ = f"Guarded{parent.__name__}"
    return GuardedProtocol


__all__ = ["FD_RESERVE", "GuardStats", "connection_cap", "guarded_protocol", "raise_fd_limit"]
