"""The HTTP server in front of the composed app: bind, serve, drain on a signal.

    sock = listen(settings)                       # ListenError: "cannot listen on …"
    async with open_server(settings) as server:
        await run_http(server, settings, sock)     # until SIGTERM / SIGINT, then drained

Contracts:

* ``listen`` binds the address before anything else starts (``acp-server serve``
  calls it before opening the store), so a port in use is one ``ListenError`` line
  naming the address, not a traceback and not a store that was opened for nothing.
* ``run_http`` runs uvicorn on that socket with the connection guard below ASGI
  (``acp_server.http.guard``: the header timeout and the connection cap; WebSocket
  frames capped at the body cap, close 1009), no lifespan, no access log of its own
  (``acp_server.ops.request_log`` logs every request). It prints the listening line to
  stdout (flushed) once the socket accepts connections, with the real port, and the
  state folder on the next line.
* Signals are handled from before the listening line on. The first SIGTERM / SIGINT
  runs ``server.drain()`` (front doors, sessions, agents),
  then uvicorn stops listening and finishes the open responses (at most
  ``GRACEFUL_SHUTDOWN_S``); a second signal skips that wait.

This module is the seam for the choice of HTTP server: it is the only one that knows
uvicorn. It belongs to the composition (it may import ``acp_server.server`` and the
settings); no door imports it.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import uvicorn

from acp_server.http.guard import connection_cap, guarded_protocol, raise_fd_limit

if TYPE_CHECKING:
    from acp_server.server import Server
    from acp_server.settings import Settings

log = logging.getLogger("acp_server")

GRACEFUL_SHUTDOWN_S = 5
BACKLOG = 2048


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
                          ) from None


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling (``run_http`` drains first), announcing
    the bound address once listening."""

    def __init__(self, config: uvicorn.Config, settings: Settings) -> None:
        super().__init__(config)
        self.settings = settings

    def capture_signals(self) -> Any:
        return contextlib.nullcontext()

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            settings = self.settings
            print(f"acp-server listening on {listening_url(self)} "
                  f"(workspace={settings.workspace}, agent={settings.agent})\n"
                  f"state in {settings.state_dir} (--state-dir chooses another)",
                  flush=True)


def listening_url(server: uvicorn.Server) -> str:
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def run_http(server: Server, settings: Settings, sock: socket.socket | None = None
                   ) -> None:
    """Serve ``server.app`` on ``sock`` (bound here when ``None``) until a signal,
    then drain ``server`` and stop."""
    if sock is None:
        sock = listen(settings)
    cap = connection_cap(settings.max_connections, raise_fd_limit())
    protocol = guarded_protocol(header_timeout_s=settings.header_timeout_ms / 1000,
                                max_connections=cap)
    config = uvicorn.Config(server.app, host=settings.hostname, port=settings.port,
                            http=protocol, ws_max_size=settings.max_body_bytes,
                            lifespan="off", access_log=False, log_level="warning",
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, backlog=BACKLOG)
    http = _Uvicorn(config, settings)
    with sock:
        async with anyio.create_task_group() as tg:
            await tg.start(_drain_on_signal, http, server)   # before the listening line
            await http.serve(sockets=[sock])
            tg.cancel_scope.cancel()


async def _drain_on_signal(http: uvicorn.Server, server: Server, *,
                           task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                           ) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            if http.should_exit:
                http.force_exit = True
                continue
            log.info("received %s: draining", signal.Signals(signum).name)
            await server.drain()
            http.should_exit = True
