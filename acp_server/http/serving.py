"""The HTTP server in front of the composed app: bind, serve, drain on a signal.

    sock = listen(settings)                       # ListenError: "cannot listen on …"
    async with open_server(settings) as server:
        await run_http(server, settings, sock)     # until SIGTERM / SIGINT, then drained

Contracts:

* ``listen`` binds the address before anything else starts (``acp-server serve``
  calls it before opening the store), so a port in use is one ``ListenError`` line
  naming the address, not a traceback and not a store that was opened for nothing.
* ``run_http`` runs the HTTP server of ``--http-server`` (``acp_server.http.servers``:
  granian, HTTP/1.1 and HTTP/2 on one port, TLS with ALPN; or uvicorn with the
  connection guard below ASGI) with the header timeout, the connection cap, the head
  caps and WebSocket frames capped at the body cap; no lifespan, no access log of its
  own (``acp_server.ops.request_log`` logs every request). It prints the listening line
  to stdout (flushed) once the socket accepts connections, with the real port
  (``https://`` with TLS), and the state folder on the next line. A stdout whose
  reader is gone (the parent closed its end of the pipe: EPIPE) does not end the
  server: one warning, and stdout is ``/dev/null`` from then on (``announce``).
* Signals (``STOP_SIGNALS``: SIGTERM, SIGINT, SIGHUP) are handled from before the
  listening line on, on ``signals`` when given (the one receiver ``acp-server serve``
  opens before the store: asyncio keeps one handler a signal, and a second receiver
  would uninstall the first's when it closes). The first runs ``server.drain()``
  (front doors, sessions, agents), then the HTTP server stops listening and finishes
  the open responses (at most ``GRACEFUL_SHUTDOWN_S``); a second signal skips that wait.
  SIGHUP (the terminal went away) is a stop like the others, not a reload; one ignored
  as the process started (``nohup``) stays ignored.

This module and ``servers`` are the seam for the choice of HTTP server: the only ones
that know granian and uvicorn. It belongs to the composition (it may import
``acp_server.server`` and the settings); no door imports it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from acp_server.http.guard import connection_cap, raise_fd_limit
from acp_server.http.servers import BACKLOG, GRACEFUL_SHUTDOWN_S, HttpServer, Limits, http_server

if TYPE_CHECKING:
    from acp_server.server import Server
    from acp_server.settings import Settings

log = logging.getLogger("acp_server")

# What stops the process, from its start to its end (``acp_server.serve_cli`` opens its one
# receiver before the store). SIGHUP only when it was not ignored as the process
# started (``nohup``, ``trap '' HUP``: the terminal going away must not stop it); read
# at import, before any handler is set.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT) + (
    () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,))



class ListenError(Exception):
    """The address cannot be bound; ``str()`` is the one line the CLI prints."""


def listen(settings: Settings) -> socket.socket:
    """A socket bound to ``settings.hostname:settings.port`` and listening."""
    host, port = settings.hostname, settings.port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host.strip("[]"), port), family=family, backlog=BACKLOG)
    except OSError as exc:
        # "Address already in use", "Permission denied", without socket's address suffix
        reason = (exc.strerror or str(exc)).split(" (while attempting", 1)[0]
        address = f"[{host.strip('[]')}]:{port}" if ":" in host else f"{host}:{port}"
        raise ListenError(f"cannot listen on {address}: {reason[:1].lower()}{reason[1:]}"
                          f"{LISTEN_HINTS.get(exc.errno or 0, '')}") from None


# What to do, after the reason, for the refusals a person meets.
LISTEN_HINTS = {
    errno.EADDRINUSE: " (another server has the port: stop it, or pass --port with another "
                      "one, or 0 for any free one)",
    errno.EACCES: " (a port below 1024 needs privileges: pass --port 1024 or above)",
    errno.EADDRNOTAVAIL: " (no interface of this machine has that address: pass --hostname "
                         "with one of its own, or 127.0.0.1)",
}


async def run_http(server: Server, settings: Settings, sock: socket.socket | None = None, *,
                   signals: AsyncIterator[int] | None = None) -> None:
    """Serve ``server.app`` on ``sock`` (bound here when ``None``) with the HTTP server
    of ``--http-server`` until a signal (from ``signals``, else a receiver of its own),
    then drain ``server`` and stop."""
    if sock is None:
        sock = listen(settings)
    cap = connection_cap(settings.max_connections, raise_fd_limit())
    limits = Limits(header_timeout_s=settings.header_timeout_ms / 1000, max_connections=cap,
                    max_header_bytes=settings.http.max_header_bytes,
                    max_headers=settings.http.max_headers,
                    max_request_line=settings.http.max_request_line,
                    ws_max_bytes=settings.max_body_bytes, graceful_s=GRACEFUL_SHUTDOWN_S)
    http = http_server(server.app, settings.http, sock, limits=limits,
                       stats=server.guard_stats)

    def started(url: str) -> None:
        server.advertise(url)
        announce(f"acp-server listening on {url} "
                 f"(workspace={settings.workspace}, agent={settings.agent})\n"
                 f"state in {settings.state_dir} (--state-dir chooses another)")

    async with anyio.create_task_group() as tg:
        await tg.start(_drain_on_signal, http, server, signals)   # before the listening line
        await http.serve(started)
        tg.cancel_scope.cancel()


def announce(text: str) -> None:
    """``text`` on stdout, flushed. A stdout that cannot be written (its reader closed
    the pipe: EPIPE; a closed or full device) is logged once and pointed at
    ``/dev/null``, so that neither this nor the interpreter's last flush at exit fails."""
    if sys.stdout is None:   # started with no descriptor 1 at all
        return
    try:
        print(text, flush=True)
    except (OSError, ValueError) as exc:
        log.warning("stdout cannot be written (%s): the listening line is lost; "
                    "stdout goes to %s from now on", exc, os.devnull)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            sys.stdout.flush()   # what was left in the buffer goes nowhere, not at exit
        except (OSError, ValueError):
            sys.stdout = None   # type: ignore[assignment] # print() then writes nothing


async def _drain_on_signal(http: HttpServer, server: Server,
                           given: AsyncIterator[int] | None = None, *,
                           task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                           ) -> None:
    draining = False
    with contextlib.ExitStack() as stack:
        signals = given if given is not None \
            else stack.enter_context(anyio.open_signal_receiver(*STOP_SIGNALS))
        task_status.started()
        async for signum in signals:
            if draining:
                http.stop(force=True)
                continue
            draining = True
            log.info("received %s: draining", signal.Signals(signum).name)
            await server.drain()
            http.stop()
