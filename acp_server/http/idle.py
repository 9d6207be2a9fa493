"""Close the connections that hold no request and started none within the header timeout,
and cut every connection when the server stops: what granian (and TLS before its
handshake) does not time out by itself.

    activity = Activity()
    app = Tracked(app, activity)                  # counts the requests in flight per peer
    sweep = IdleConnections(port=4170, timeout_s=10.0, activity=activity, stats=stats)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sweep.run)                  # until cancelled
        ...
        await sweep.cut(everything=False)         # on stop: the idle ones at once
        await sweep.cut(everything=True)          # past the graceful wait: all of them

Why: hyper closes an HTTP/1.1 connection whose next head does not come within its
``header_read_timeout``, but nothing closes an HTTP/2 connection that opens no stream
(it answers the keep-alive PINGs and waits for ever), a TLS connection that finished
its handshake and said nothing (the server already sent bytes, so ``silence`` does
not see it), a TLS handshake left half done (granian: 10 s fixed; uvicorn: 60 s,
before its guard sees the connection), or a connection whose reader stopped reading
after its stream ended (its queued bytes keep it). And granian's own stop waits for
every open connection to finish, with no bound. The app runs in this process, so it
knows which peer has a request in flight (``Tracked``: the TCP peer's address in the
ASGI scope, read before the front layer replaces it with a forwarded one), and the
kernel knows each connection's peer and send queue (``TCP_INFO`` on the process's own
descriptors, as ``silence`` reads them).

Contracts:

* Every ``interval_s`` (a quarter of the timeout, 0.25 s to 2 s) the connections on the
  port are listed. One is **idle** when no request of its peer is in flight, none
  ended (and the connection was not first seen) within ``timeout_s``, and its send
  queue is empty or has not moved (no byte acknowledged) for ``timeout_s``. One idle at
  two sweeps in a row with no request of its peer started between them is shut down
  (``SO_LINGER`` 0, then ``shutdown(SHUT_RDWR)`` on a duplicate: granian's reads and
  writes fail, it closes its side, the peer sees a reset), and counted in
  ``stats["header_timeouts"]``. So such a connection is closed between ``timeout_s``
  and ``timeout_s + 2 * interval_s`` after its last request ended (or it appeared).
  A request that arrives in the instant of the shut-down is lost, as with any idle
  timeout (an HTTP/1.1 keep-alive one too); one whose head reached the kernel but not
  the app for a whole ``interval_s`` (an event loop stalled that long) could be too.
* ``cut(everything=False)`` shuts down at once the connections with no request in
  flight and nothing queued to send (the server is stopping: they have nothing to
  finish); ``cut(everything=True)`` every connection on the port.
* A request in flight is never cut by the sweep: a stream that never ends, a reader
  that is slow, a WebSocket, are the app's to bound (SSE eviction, the request cap).
* Linux only (``TCP_INFO``, ``/proc``): elsewhere ``run`` returns at once and ``cut``
  does nothing. Nothing here raises out of ``run``: a failed sweep is logged.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import math
import os
import socket
import struct
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
import anyio.to_thread

from acp_server.http.silence import (
    _FD_DIR, SilentConnections, _connection_on, _descriptors, _release, sweep_every)

log = logging.getLogger("acp_server.http")

_UNACKED = struct.Struct("=I")        # struct tcp_info: tcpi_unacked at 24
_BYTES_ACKED = struct.Struct("=Q")    # tcpi_bytes_acked at 120 (Linux >= 4.1)
_NOTSENT = struct.Struct("=I")        # tcpi_notsent_bytes at 144 (Linux >= 4.6)
_INFO_BYTES = 148
_LINGER_0 = struct.pack("ii", 1, 0)
_NO_LINGER = struct.pack("ii", 0, 0)
_NEVER = -math.inf
CUT_SETTLE_S = 1.0   # a stop's cut spares a connection whose request ended this recently


def peer_key(client: Any) -> tuple[str, int] | None:
    """``(host, port)`` of an ASGI ``client`` (or a ``getpeername()``), an IPv4 address
    mapped in IPv6 written as IPv4, so that both sides name a peer alike."""
    if not client or len(client) < 2:
        return None
    host, port = client[0], client[1]
    if type(host) is str and type(port) is int and host[:1].isdigit() and ":" not in host:
        return (host, port)   # dotted IPv4 as servers write it: no parse per request
    written = _host_written(str(host))
    return None if written is None else (written, int(port))


@functools.lru_cache(maxsize=1024)
def _host_written(host: str) -> str | None:
    """``host`` as ``peer_key`` writes it (IPv6 compressed, a mapped IPv4 as IPv4), or
    ``None`` when it is no address; cached: a client's host is parsed once."""
    try:
        address = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


class Activity:
    """Requests in flight per peer, when the last one ended, how many started."""

    __slots__ = ("active", "ended", "started")

    def __init__(self) -> None:
        self.active: dict[tuple[str, int], int] = {}
        self.ended: dict[tuple[str, int], float] = {}
        self.started: dict[tuple[str, int], int] = {}

    def enter(self, peer: tuple[str, int]) -> None:
        self.active[peer] = self.active.get(peer, 0) + 1
        self.started[peer] = self.started.get(peer, 0) + 1

    def leave(self, peer: tuple[str, int]) -> None:
        left = self.active.get(peer, 1) - 1
        if left > 0:
            self.active[peer] = left
        else:
            self.active.pop(peer, None)
            self.ended[peer] = time.monotonic()

    def forget(self, keep: set[tuple[str, int]], before: float) -> None:
        """Drops the peers with no connection in ``keep``, nothing in flight and no
        request ended after ``before``."""
        for peer in [p for p, ended in self.ended.items()
                     if p not in keep and p not in self.active and ended < before]:
            del self.ended[peer]
            self.started.pop(peer, None)
        for peer in [p for p in self.started
                     if p not in keep and p not in self.active and p not in self.ended]:
            del self.started[peer]


class Tracked:
    """The ASGI ``app``, counting its HTTP requests and WebSockets in ``activity``."""

    __slots__ = ("activity", "app")

    def __init__(self, app: Any, activity: Activity) -> None:
        self.app = app
        self.activity = activity

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        peer = peer_key(scope.get("client")) if scope["type"] != "lifespan" else None
        if peer is None:
            await self.app(scope, receive, send)
            return
        activity = self.activity
        activity.enter(peer)
        try:
            await self.app(scope, receive, send)
        finally:
            activity.leave(peer)


@dataclass(slots=True)
class Seen:
    """One connection as a sweep found it."""

    fd: int
    inode: str
    peer: tuple[str, int]
    acked: int
    pending: bool


@dataclass(slots=True)
class _State:
    first: float
    acked: int
    moved: float
    candidate: int | None = None
    reset: bool = False


def survey(port: int) -> list[Seen]:
    """This process's established connections on ``port`` (blocking: a worker thread)."""
    found: list[Seen] = []
    for fd in _descriptors():
        try:
            inode = os.readlink(f"{_FD_DIR}/{fd}")
        except OSError:
            continue
        connection = _connection_on(fd, port)
        if connection is None:
            continue
        sock, owned = connection
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_BYTES)
            peer = peer_key(sock.getpeername())
            if peer is None or len(info) < 128 or info[0] != 1:   # TCP_ESTABLISHED
                continue
            pending = _UNACKED.unpack_from(info, 24)[0] != 0 or (
                len(info) >= _INFO_BYTES and _NOTSENT.unpack_from(info, 144)[0] != 0)
            found.append(Seen(fd, inode, peer, _BYTES_ACKED.unpack_from(info, 120)[0],
                              pending))
        except OSError:
            continue
        finally:
            _release(sock, owned)
    return found


def shut(port: int, victims: list[Seen], *, linger: bytes | None = None) -> int:
    """Shuts down each of ``victims`` still open as the same connection, its close to
    reset it (``SO_LINGER`` 0); or, given ``linger``, only sets that. How many."""
    closed = 0
    for victim in victims:
        try:
            if os.readlink(f"{_FD_DIR}/{victim.fd}") != victim.inode:
                continue   # closed, its number reused
        except OSError:
            continue
        connection = _connection_on(victim.fd, port)
        if connection is None:
            continue
        sock, owned = connection
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger or _LINGER_0)
            if linger is None:
                sock.shutdown(socket.SHUT_RDWR)
            closed += 1
        except OSError:
            pass
        finally:
            _release(sock, owned)
    return closed


class IdleConnections:
    """See the module docstring."""

    def __init__(self, *, port: int, timeout_s: float, activity: Activity,
                 stats: MutableMapping[str, int] | None = None,
                 interval_s: float | None = None) -> None:
        self.port = port
        self.timeout_s = timeout_s
        self.interval_s = interval_s if interval_s is not None \
            else min(2.0, max(0.25, timeout_s / 4))
        self.activity = activity
        self.stats = stats
        self._states: dict[str, _State] = {}

    supported = staticmethod(SilentConnections.supported)

    async def run(self) -> None:
        """Sweep every ``interval_s`` until cancelled."""
        if self.supported():
            await sweep_every(self.interval_s, self.sweep, self.stats,
                              f"idle for {self.timeout_s:.1f} s")

    async def sweep(self) -> int:
        seen = await anyio.to_thread.run_sync(survey, self.port)
        victims, stalled, moving = self._judge(seen, time.monotonic())
        if stalled:
            await anyio.to_thread.run_sync(partial(shut, self.port, stalled, linger=_LINGER_0))
        if moving:
            await anyio.to_thread.run_sync(partial(shut, self.port, moving, linger=_NO_LINGER))
        return await anyio.to_thread.run_sync(shut, self.port, victims) if victims else 0

    def _judge(self, seen: list[Seen], now: float
               ) -> tuple[list[Seen], list[Seen], list[Seen]]:
        """The connections to shut down; those whose send queue has not moved for the
        timeout (their close will reset them: the kernel keeps no orphan with their
        queue); those of these that moved again (closed gracefully again)."""
        activity, timeout = self.activity, self.timeout_s
        states, victims, stalled, moving = self._states, [], [], []
        self._states = {}
        for connection in seen:
            state = states.get(connection.inode) or _State(now, connection.acked, now)
            self._states[connection.inode] = state
            if connection.acked != state.acked or not connection.pending:
                state.acked, state.moved = connection.acked, now
                if state.reset:   # its reader took bytes again: closed gracefully again
                    state.reset = False
                    moving.append(connection)
            elif now - state.moved >= timeout and not state.reset:
                state.reset = True   # whoever closes it (hyper's PING too): a reset
                stalled.append(connection)
            peer = connection.peer
            quiet_since = max(state.first, activity.ended.get(peer, _NEVER))
            idle = (peer not in activity.active and now - quiet_since >= timeout
                    and (not connection.pending or now - state.moved >= timeout))
            started = activity.started.get(peer, 0)
            if not idle:
                state.candidate = None
            elif state.candidate == started:   # idle last time too, nothing started since
                victims.append(connection)
            else:
                state.candidate = started
        activity.forget({connection.peer for connection in seen}, now - timeout)
        return victims, stalled, moving

    async def cut(self, *, everything: bool) -> int:
        """Shuts down the connections with nothing in flight or queued, none ended within
        ``CUT_SETTLE_S`` (an answer the app just gave may not be on the wire yet), or
        all of them; how many."""
        if not self.supported():
            return 0
        seen = await anyio.to_thread.run_sync(survey, self.port)
        activity, settled = self.activity, time.monotonic() - CUT_SETTLE_S
        victims = [c for c in seen if everything or (
            c.peer not in activity.active and not c.pending
            and activity.ended.get(c.peer, _NEVER) < settled)]
        return await anyio.to_thread.run_sync(shut, self.port, victims) if victims else 0


__all__ = ["Activity", "IdleConnections", "Tracked", "peer_key", "shut", "survey"]
