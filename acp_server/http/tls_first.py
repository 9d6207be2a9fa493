"""uvicorn with TLS: a connection counts against the cap from its accept, not from the
end of its handshake.

    handshakes = Handshakes(max_connections=2560, timeout_s=10.0, stats=stats)
    # in uvicorn.Server.startup, the config loaded:
    handshakes.take_over(config)     # config.ssl moved here; plain TCP for uvicorn
    ...
    handshakes.abort_pending()       # at shutdown, before uvicorn's own

Why: asyncio (and uvloop) hand a TLS connection to uvicorn's protocol, where the
connection guard counts it (``guard.guarded_protocol``), only once its handshake is
done. Connections that never send a ClientHello were bounded in time (the idle sweep
closed them after the header timeout) but not in number: 3,000 of them took a server
from 65 MB to 223 MB of RSS, which it kept after they were gone.

Contracts:

* uvicorn is served plain TCP; each accepted connection gets a ``TlsFirst``, which
  refuses it at once (closed unread: a TLS client cannot read a 503 before its
  handshake; counted in ``stats["connections"]``) when the live connections plus the
  handshakes in progress reach ``max_connections``, else begins ``loop.start_tls``
  at once (asyncio and uvloop alike then keep what arrives before the handshake
  starts), with the header timeout as its deadline.
* A handshake that fails, times out or loses its connection closes the connection;
  nothing reaches uvicorn. One that succeeds gives uvicorn's protocol (the guard) the
  TLS transport as asyncio would have (``connection_made``, then what arrived
  meanwhile, then an end of stream); from then on the guard and the cap apply as on
  any connection.
* ``abort_pending`` closes the handshakes in progress (uvicorn's shutdown sees only
  finished connections).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from acp_server.http.guard import GuardStats

log = logging.getLogger("acp_server.http")


class Handshakes:
    """The handshakes in progress on one server, and the factory of ``TlsFirst``."""

    def __init__(self, *, max_connections: int, timeout_s: float,
                 stats: GuardStats | None = None, alpn: tuple[str, ...] = ()) -> None:
        self.max_connections = max_connections
        self.alpn = alpn   # offered in the handshake: ("h2", "http/1.1") with HTTP/2
        self.timeout_s = timeout_s
        self.stats = stats if stats is not None else GuardStats()
        self.context: ssl.SSLContext | None = None
        self.pending: set[TlsFirst] = set()

    def take_over(self, config: Any) -> None:
        """Move a loaded uvicorn config's TLS here: uvicorn then listens on plain TCP
        and each connection is made by ``TlsFirst``."""
        if config.ssl is None or self.context is not None:
            return
        self.context, config.ssl = config.ssl, None
        if self.alpn:
            self.context.set_alpn_protocols(list(self.alpn))
        inner = config.http_protocol_class

        def make(**kwargs: Any) -> TlsFirst:
            return TlsFirst(self, inner, kwargs)

        config.http_protocol_class = make

    def abort_pending(self) -> None:
        for handshake in list(self.pending):
            handshake.abort()


class TlsFirst(asyncio.Protocol):
    """One accepted connection until its handshake is done (see the module)."""

    def __init__(self, owner: Handshakes, inner: Any, kwargs: dict[str, Any]) -> None:
        self.owner = owner
        self.inner_class = inner
        self.kwargs = kwargs
        self.transport: Any = None
        self.handshake: Any = None     # ``loop.start_tls``'s coroutine, while it runs
        self.early: list[bytes] = []   # decrypted before uvicorn's protocol was made
        self.ended = False             # an end of stream came meanwhile
        self.lost = False

    def connection_made(self, transport: Any) -> None:   # type: ignore[override]
        owner = self.owner
        live = len(self.kwargs["server_state"].connections)
        if live + len(owner.pending) >= owner.max_connections:
            owner.stats["connections"] += 1
            transport.abort()
            return
        self.transport = transport
        owner.pending.add(self)
        # ``start_tls`` is begun here, not in a task: by the time the loop reads the
        # ClientHello its TLS protocol is the transport's (uvloop starts reading as
        # soon as this returns, and a ``pause_reading`` here would be ignored)
        self.handshake = asyncio.get_running_loop().start_tls(
            transport, self, owner.context, server_side=True,   # type: ignore[arg-type]
            ssl_handshake_timeout=owner.timeout_s)
        self._step()

    def _step(self, _: Any = None) -> None:
        """Run the handshake's coroutine to its next wait (one future: the handshake's
        end), then on from there when it is done."""
        handshake = self.handshake
        if handshake is None:
            return
        try:
            waited = handshake.send(None)
        except StopIteration as done:
            self._made(done.value)
        except (Exception, asyncio.CancelledError) as exc:   # noqa: BLE001 - the client's
            self._failed(exc)
        else:   # a future (a bare yield, should a loop's coroutine make one: next turn)
            if waited is None:
                asyncio.get_running_loop().call_soon(self._step)
            else:
                waited.add_done_callback(self._step)

    def _failed(self, exc: BaseException) -> None:
        log.debug("TLS handshake failed: %s", exc)
        self.handshake = None
        self.owner.pending.discard(self)
        self.transport.abort()

    def _made(self, tls: Any) -> None:
        self.handshake = None
        self.owner.pending.discard(self)
        if self.lost or tls.is_closing():
            tls.abort()
            return
        protocol = self.inner_class(**self.kwargs)
        tls.set_protocol(protocol)
        protocol.connection_made(tls)
        for data in self.early:   # to the protocol in force (the guard's HTTP/2, by ALPN)
            tls.get_protocol().data_received(data)
        self.early.clear()
        if self.ended:
            tls.get_protocol().eof_received()

    def abort(self) -> None:
        handshake, self.handshake = self.handshake, None
        if handshake is not None:
            handshake.close()
        self.owner.pending.discard(self)
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        self.early.append(data)

    def eof_received(self) -> bool | None:
        self.ended = True
        return True   # keep the transport open: uvicorn's protocol decides

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.owner.pending.discard(self)


__all__ = ["Handshakes", "TlsFirst"]
