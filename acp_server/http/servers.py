"""The HTTP servers we ship, behind one small interface: granian (default) and uvicorn.

    server = http_server(app, options, sock, limits=Limits(...))   # sock: bound, listening
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, lambda url: print("listening on", url))
        ...
        server.stop()            # stop listening; open responses finish (graceful_s)

Both servers run inside the caller's asyncio event loop (uvloop when installed), so
the app, the bridge and the agents share one loop, and the caller drains the doors,
sessions and agents before it calls ``stop`` (``acp_server.serve_cli``).

What each gives (``docs/benchmarks.md`` has the measurements behind the choice):

==========================  ====================================  ==============================
                            granian (embedded, Rust/hyper)        uvicorn (httptools)
==========================  ====================================  ==============================
HTTP/1.1, h2c, WebSocket    one port; h2c by prior knowledge      one port; h2c by prior
                                                                  knowledge (``http2``, in
                                                                  the event loop)
TLS (``--tls-cert/-key``)   rustls, ALPN ``h2`` and ``http/1.1``  ``ssl``, ALPN ``h2`` and
                                                                  ``http/1.1``
mutual TLS                  ``--tls-client-ca``                   ``--tls-client-ca``
header timeout              hyper ``header_read_timeout`` (h1);   ``guard.guarded_protocol``;
                            no request in flight (h2 with no      with TLS, ``idle`` too
                            stream, TLS, silence): ``idle``       (asyncio's handshake)
connection cap, 503         the front layer's request cap (503)   ``guard.guarded_protocol``
                            and an accept cap above it (queued)   (answered before reading);
                                                                  TLS handshakes counted
                                                                  from the accept
                                                                  (``tls_first``)
head caps 414 / 431         hyper's head buffer (431), then the   ``guard.guarded_protocol``
                            front layer's exact checks            (before parsing), then the
                                                                  front layer's
HTTP/2 abuse                hyper/h2: stream cap, header list     python-hyper's h2 and
                            cap, flow-control windows, reset and  ``http2``: the same caps
                            CONTINUATION floods; a PING after the and floods, the same PING;
                            header timeout's quiet, unanswered    no stream for the header
                            for as long again: closed             timeout: closed
==========================  ====================================  ==============================

granian calls the app through its ASGI interface, or with ``--granian-interface rsgi``
through its own (``acp_server.http.rsgi``: less CPU per request, no back-pressure on
streams; off by default, ``docs/benchmarks.md``).

Contracts: ``serve(started)`` calls ``started(url)`` once the socket accepts
connections (the real port when ``port=0``; ``https://`` with TLS) and returns after
``stop()``. ``stop(force=True)`` (a second signal) skips the wait for open responses
but ``FORCED_FLUSH_S`` of it (the streams the drain ended send their last event; on
granian, what is still open then is cut).
granian's own stop waits for every open connection with no bound (a reader that stopped
reading holds it for ever; an idle HTTP/2 connection until its PING goes unanswered):
``GranianServer`` shuts down, from its stop on, the connections with nothing in flight
and nothing left to send, and every connection once ``graceful_s`` has passed or at a
second ``stop(force=True)`` (after ``FORCED_FLUSH_S``, so that the streams the drain
ended write their last event; ``idle.IdleConnections.cut``; logged as a warning).
granian binds its own listener: from the caller's socket's close until granian listens,
the port is held by a bound socket that does not listen (``SO_REUSEPORT``, which
granian's listener sets too: ``reserve_port``), so no other socket takes it meanwhile
(a client's ephemeral port, say: a port chosen with ``port=0`` is one of those).
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import uvicorn

from acp_server.http.guard import GuardStats, guarded_protocol
from acp_server.http.h2_machine import Http2Limits
from acp_server.http.tls_first import Handshakes
from acp_server.http.idle import Activity, IdleConnections, Tracked
from acp_server.http.options import HttpOptions
from acp_server.http.silence import SilentConnections

log = logging.getLogger("acp_server.http")

GRACEFUL_SHUTDOWN_S = 5
FORCED_FLUSH_S = 1.0                # a second signal: what is left is cut after this
BACKLOG = 2048
H2_MAX_CONCURRENT_STREAMS = 100     # per connection; more is refused by the peer's SETTINGS
HEAD_SLACK = 1024                   # the request line and framing around the header fields


@dataclass(frozen=True, slots=True)
class Limits:
    """The connection-level limits every server enforces (see the table above)."""

    header_timeout_s: float
    max_connections: int
    max_header_bytes: int
    max_headers: int
    max_request_line: int
    ws_max_bytes: int
    graceful_s: float = GRACEFUL_SHUTDOWN_S


class HttpServer(Protocol):
    async def serve(self, started: Callable[[str], None]) -> None: ...

    def stop(self, force: bool = False) -> None: ...


def url_of(host: str, port: int, tls: bool) -> str:
    scheme = "https" if tls else "http"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def accept_cap(max_connections: int) -> int:
    """granian's accept cap (its ``backpressure``) above the front layer's request cap,
    so that the request past the cap is answered 503 rather than left in the backlog."""
    return max_connections + 64


def http_server(app: Any, options: HttpOptions, sock: socket.socket, *,
                limits: Limits, stats: GuardStats | None = None) -> HttpServer:
    """The server of ``options.server`` on ``sock`` (bound and listening: a port in use
    was found before anything started). uvicorn serves that socket; granian binds its
    own listener, so the socket is closed and granian takes its address."""
    if options.server == "uvicorn":   # ``stats``: where uvicorn's guard counts
        return UvicornServer(app, options, sock, limits=limits, stats=stats)
    host, port = sock.getsockname()[:2]
    reserved = reserve_port(sock)
    try:
        return GranianServer(app, options, host=host, port=port, limits=limits, stats=stats,
                             reserved=reserved)
    except BaseException:   # (a certificate granian cannot load): nothing holds the port
        if reserved is not None:
            reserved.close()
        raise


def reserve_port(sock: socket.socket) -> socket.socket | None:
    """Closes ``sock`` and binds its address again on a socket that does not listen,
    with ``SO_REUSEPORT`` (Linux): granian's listeners can bind beside it, and no other
    socket can take the port until it is closed. ``None`` where that is not possible
    (another OS, or the port taken in the instant between: granian's bind says so)."""
    address, family = sock.getsockname(), sock.family
    v6only = (sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)
              if family == socket.AF_INET6 else None)
    sock.close()
    if not sys.platform.startswith("linux") or not hasattr(socket, "SO_REUSEPORT"):
        return None
    try:
        reserved = socket.socket(family, socket.SOCK_STREAM)
    except OSError:   # out of descriptors: granian's own bind says what it can
        return None
    try:
        reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)   # not REUSEADDR:
        # with it, any socket that sets it too could bind beside one that does not listen
        if v6only is not None:
            reserved.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
        reserved.bind(address)
    except OSError:
        reserved.close()
        return None
    return reserved


def h2_keep_alive_ms(header_timeout_s: float) -> int:
    """How long an HTTP/2 connection may be quiet before granian PINGs it (ms): the
    header timeout. With ``h2_keep_alive_timeout_s`` this closes an HTTP/2 connection
    that stopped answering (a preface then silence, a flood that stopped reading)."""
    return max(1000, int(header_timeout_s * 1000))


def h2_keep_alive_timeout_s(header_timeout_s: float) -> int:
    """How long granian waits for that PING's acknowledgement before it closes the
    connection (whole seconds, granian's unit): the header timeout, 1 s at least."""
    return max(1, math.ceil(header_timeout_s))


# -- granian ------------------------------------------------------------------------
class GranianServer:
    """granian's embedded server (``granian.server.embed``) in this event loop."""

    def __init__(self, app: Any, options: HttpOptions, *, host: str, port: int,
                 limits: Limits, stats: GuardStats | None = None,
                 reserved: socket.socket | None = None) -> None:
        from granian.constants import HTTPModes, Interfaces, SSLProtocols
        from granian.http import HTTP1Settings, HTTP2Settings
        from granian.server.embed import Server

        self.options = options
        self.limits = limits
        self.stats = stats
        self._host = host
        self._port = port
        self._reserved = reserved   # holds the port until granian listens (reserve_port)
        owner = self

        class _Embedded(Server):   # type: ignore[misc]
            def startup(self, spawn_target: Any, target_loader: Any) -> None:
                super().startup(spawn_target, target_loader)
                owner._listening(self)

        head = limits.max_header_bytes + limits.max_request_line + HEAD_SLACK
        interface = Interfaces.ASGINL
        # The requests in flight per peer, for the idle sweep (``idle``); an app with its
        # own ``__rsgi__`` is served as is, untracked: the silence sweep only, then (and
        # where the sweep cannot run: not Linux; nothing would prune the counts).
        self._activity: Activity | None = Activity() if IdleConnections.supported() else None
        if options.granian_interface == "rsgi":
            from acp_server.http.rsgi import RsgiEntry

            interface = Interfaces.RSGI
            if hasattr(app, "__rsgi__"):
                self._activity = None
            else:
                app = RsgiEntry(app if self._activity is None else Tracked(app, self._activity))
        elif self._activity is not None:
            app = Tracked(app, self._activity)
        self._server = _Embedded(
            app, address=host, port=port, interface=interface, http=HTTPModes.auto,
            websockets=True, backlog=BACKLOG, backpressure=accept_cap(limits.max_connections),
            http1_settings=HTTP1Settings(
                header_read_timeout=max(1, int(limits.header_timeout_s * 1000)),
                keep_alive=True, max_buffer_size=max(8192, head)),
            http2_settings=HTTP2Settings(
                max_concurrent_streams=H2_MAX_CONCURRENT_STREAMS,
                keep_alive_interval=h2_keep_alive_ms(limits.header_timeout_s),
                keep_alive_timeout=h2_keep_alive_timeout_s(limits.header_timeout_s),
                max_headers_size=limits.max_header_bytes + limits.max_request_line),
            log_enabled=False,
            ssl_cert=_path(options.tls_cert), ssl_key=_path(options.tls_key),
            ssl_ca=_path(options.tls_client_ca),
            ssl_client_verify=options.tls_client_ca is not None,
            ssl_protocol_min=SSLProtocols.tls12)

    def _listening(self, server: Any) -> None:
        # On Linux the spec only resolves the port (``port=0``); the worker's own
        # listener (SO_REUSEPORT) comes a moment later, in granian's runtime thread.
        spec = getattr(server, "_ssp", None)
        self._port = int(spec.__getstate__()[1] if spec is not None else server.bind_port)
        self._bound.set()

    async def serve(self, started: Callable[[str], None]) -> None:
        self._bound = anyio.Event()
        self._stopping, self._forced = anyio.Event(), anyio.Event()
        self._sweep: IdleConnections | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._announce, started)
                tg.start_soon(self._enforce_stop)
                await self._server.serve()
                tg.cancel_scope.cancel()
        finally:
            self._release_port()

    def _release_port(self) -> None:
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None

    async def _announce(self, started: Callable[[str], None]) -> None:
        """``started(url)`` once a connection to the port is accepted; from then on,
        connections with no request in flight are closed after the header timeout
        (granian has no timer for them: ``idle``)."""
        await self._bound.wait()
        probe = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self._host,
                                                                          self._host)
        while True:
            try:
                stream = await anyio.connect_tcp(probe, self._port)
            except OSError:
                await anyio.sleep(0.005)
                continue
            await stream.aclose()
            break
        self._release_port()   # granian listens: the port is its own
        started(url_of(self._host, self._port, self.options.tls))
        if self._activity is None:
            await SilentConnections(port=self._port, timeout_s=self.limits.header_timeout_s,
                                    stats=self.stats).run()
            return
        self._sweep = IdleConnections(port=self._port, timeout_s=self.limits.header_timeout_s,
                                      activity=self._activity, stats=self.stats)
        await self._sweep.run()

    async def _enforce_stop(self) -> None:
        """granian's stop waits for every open connection to end, with no bound (a
        reader that stopped reading holds it for ever): once stopping, the connections
        with nothing in flight are cut at once, and every one past ``graceful_s``, or
        ``FORCED_FLUSH_S`` after a second ``stop(force=True)`` (so that a stream the
        drain ended is not cut before its last bytes), again until granian returns."""
        await self._stopping.wait()
        sweep = self._sweep or IdleConnections(port=self._port, timeout_s=0,
                                               activity=self._activity or Activity())
        with anyio.move_on_after(self.limits.graceful_s) as graceful:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._cut_idle, sweep)
                await self._forced.wait()
                # the responses the drain just ended (``session_closed``) still write
                # their last bytes, and granian closes those connections itself
                graceful.deadline = min(graceful.deadline,
                                        anyio.current_time() + FORCED_FLUSH_S)
                await anyio.sleep_forever()
        reason = "a second signal" if self._forced.is_set() else \
            f"the {self.limits.graceful_s:g} s graceful wait ended"
        while True:
            closed = await self._cut(sweep, everything=True)
            if closed:
                log.warning("stopping: %s; %d open connection(s) cut", reason, closed)
            await anyio.sleep(0.5)

    async def _cut_idle(self, sweep: IdleConnections) -> None:
        """During the graceful wait: the connections with nothing in flight and nothing
        left to send (granian's GOAWAY, once taken), again and again."""
        if self._activity is None:
            return
        while True:
            await self._cut(sweep, everything=False)
            await anyio.sleep(0.1)

    @staticmethod
    async def _cut(sweep: IdleConnections, *, everything: bool) -> int:
        try:
            return await sweep.cut(everything=everything)
        except Exception as exc:   # noqa: BLE001 - the stop goes on regardless
            log.warning("stopping: cutting connections failed: %s", exc)
            return 0

    def stop(self, force: bool = False) -> None:
        self._server.stop()
        stopping = getattr(self, "_stopping", None)
        if stopping is not None:
            stopping.set()
            if force:
                self._forced.set()


def _path(value: str | None) -> Any:
    if value is None:
        return None
    from pathlib import Path

    return Path(value)


# -- uvicorn ------------------------------------------------------------------------
class ClientFaultLines(logging.Filter):
    """uvicorn logs a client's text frame that is not UTF-8 at ERROR with a traceback (a
    remote client could fill the log with them at will): one WARNING line instead."""

    MESSAGES = frozenset({"Invalid UTF-8 sequence received from client."})

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg in self.MESSAGES:   # msg may be any object
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _quiet_client_faults() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, ClientFaultLines) for f in logger.filters):
        logger.addFilter(ClientFaultLines())


class UvicornServer:
    """uvicorn with the connection guard below ASGI (``acp_server.http.guard``)."""

    def __init__(self, app: Any, options: HttpOptions, sock: socket.socket, *,
                 limits: Limits, stats: GuardStats | None = None) -> None:
        host, port = sock.getsockname()[:2]
        self._sock = sock
        counts = stats if stats is not None else GuardStats()
        protocol = guarded_protocol(
            header_timeout_s=limits.header_timeout_s, max_connections=limits.max_connections,
            max_header_bytes=limits.max_header_bytes, max_headers=limits.max_headers,
            max_request_line=limits.max_request_line, stats=counts,
            http2=Http2Limits(idle_s=limits.header_timeout_s,
                              max_header_list=limits.max_header_bytes + limits.max_request_line,
                              max_streams=H2_MAX_CONCURRENT_STREAMS))
        tls: dict[str, Any] = {}
        if options.tls:   # TLS wherever the sweep below can run or not
            tls = {"ssl_certfile": options.tls_cert, "ssl_keyfile": options.tls_key}
            if options.tls_client_ca is not None:
                tls.update(ssl_ca_certs=options.tls_client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
        # With TLS, asyncio runs the handshake before the guard sees the connection (and
        # gives it 60 s): the idle sweep closes those, as on granian (Linux only).
        self._sweep: IdleConnections | None = None
        if options.tls and IdleConnections.supported():
            activity = Activity()
            app = Tracked(app, activity)
            self._sweep = IdleConnections(port=port, timeout_s=limits.header_timeout_s,
                                          activity=activity, stats=stats)
        # ... and before it, asyncio hands the guard a connection only once its handshake
        # is done: ``tls_first`` counts it against the cap from its accept
        handshakes = Handshakes(max_connections=limits.max_connections,
                                timeout_s=limits.header_timeout_s, stats=counts,
                                alpn=("h2", "http/1.1")) \
            if options.tls else None
        config = uvicorn.Config(app, host=host, port=port, http=protocol, backlog=BACKLOG,
                                ws_max_size=limits.ws_max_bytes, lifespan="off",
                                proxy_headers=False,   # acp_server.http.clients decides
                                access_log=False, log_level="warning",
                                timeout_graceful_shutdown=int(limits.graceful_s), **tls)
        self.options = options
        _quiet_client_faults()
        self._server = _Uvicorn(config)
        self._server.handshakes = handshakes

    async def serve(self, started: Callable[[str], None]) -> None:
        self._server.announce = lambda: started(self._url())
        with self._sock:
            async with anyio.create_task_group() as tg:
                if self._sweep is not None:
                    tg.start_soon(self._sweep.run)
                await self._server.serve(sockets=[self._sock])
                tg.cancel_scope.cancel()

    def _url(self) -> str:
        host, port = self._server.servers[0].sockets[0].getsockname()[:2]
        return url_of(host, port, self.options.tls)

    def stop(self, force: bool = False) -> None:
        self._server.should_exit = True
        if force:
            self._server.force_exit = True


class _Uvicorn(uvicorn.Server):
    """No signal handling of its own (the caller drains first); says when it listens.
    ``force_exit`` set (a second signal) holds ``FORCED_FLUSH_S`` later: until then
    uvicorn's stop still waits for the open responses (the streams the drain ended
    send their last event), then it stops waiting, as on granian."""

    announce: Callable[[], None] | None = None
    handshakes: Handshakes | None = None   # TLS: counted from the accept (``tls_first``)
    _force_at: float | None = None

    @property   # type: ignore[override]
    def force_exit(self) -> bool:
        return self._force_at is not None and time.monotonic() >= self._force_at

    @force_exit.setter
    def force_exit(self, value: bool) -> None:
        if not value:
            self._force_at = None
        elif self._force_at is None:
            self._force_at = time.monotonic() + FORCED_FLUSH_S

    def capture_signals(self) -> Any:
        return contextlib.nullcontext()

    async def startup(self, sockets: Any = None) -> None:
        if self.handshakes is not None:
            self.handshakes.take_over(self.config)
        await super().startup(sockets=sockets)
        if self.started and self.announce is not None:
            self.announce()

    async def shutdown(self, sockets: Any = None) -> None:
        if self.handshakes is not None:
            self.handshakes.abort_pending()
        await super().shutdown(sockets=sockets)


__all__ = ["GRACEFUL_SHUTDOWN_S", "GranianServer", "HttpServer", "Limits", "UvicornServer",
           "http_server", "url_of"]
