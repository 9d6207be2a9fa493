"""The server in this process, over real loopback HTTP, on either anyio backend.

    async with local_server(tmp_path, options=BridgeOptions(max_sessions=1)) as srv:
        response = await srv.client.post("/session", json={})
        srv.bridge, srv.lmsp, srv.acp, srv.server.metrics       # the composed parts

It is ``acp_server.server.open_server`` (the composition ``acp-server serve`` runs), its
app served by uvicorn under asyncio and by hypercorn under trio (which uvicorn does not
support), inside the test's own event loop. Settings are keyword arguments
(``Settings`` fields); the state folder defaults to ``<workspace>/state``.
``open_server``'s test overrides pass through (``agent_factory``, ``lmsp_store``,
``lmsp_config``, ``group_commit``, ``acp_clock``, ``principals_clock``). ``wrap`` puts an
ASGI middleware in front of the app (a recorder, a fault); ``headers`` and ``timeout``
are the client's; ``app_errors_expected`` for a test that makes an exception escape the
app (otherwise one fails the block: ``tests.harness.unhandled``). A door's tests add
their helpers with ``kind=`` (a ``LocalServer`` subclass). At the end the server is
told to stop and ``Server.drain()`` runs (open streams end), as on SIGTERM.

``serving(app)`` serves any other ASGI app the same way (fake model servers, peers).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.abc
import httpx
import sniffio
from starlette.types import ASGIApp

from acp_server.acp_http import ConnectionRegistry
from acp_server.lmsp import LmspService
from acp_server.server import Server, open_server
from acp_server.settings import Settings
from bridge import Bridge, BridgeOptions
from tests.harness.unhandled import Escapes

OVERRIDES = ("agent_factory", "lmsp_store", "lmsp_config", "group_commit", "acp_clock",
             "session_clock", "principals_clock", "models_clock", "lease_offset")


@dataclass
class LocalServer:
    """A served ``Server``: its base URL, its parts and an HTTP client on it."""

    base_url: str
    server: Server
    client: httpx.AsyncClient

    @property
    def bridge(self) -> Bridge:
        return self.server.bridge

    @property
    def settings(self) -> Settings:
        return self.server.settings

    @property
    def lmsp(self) -> LmspService:
        return self.server.lmsp

    @property
    def acp(self) -> ConnectionRegistry:
        return self.server.acp

    @property
    def workspace(self) -> str:
        return self.server.settings.workspace


Kind = TypeVar("Kind", bound=LocalServer)


async def _serve_uvicorn(tg: anyio.abc.TaskGroup, app: Any,
                         port: int = 0) -> tuple[int, Callable[[], None]]:
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning",
                            access_log=False, timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    tg.start_soon(server.serve)
    with anyio.fail_after(30):   # a hang bound: a loaded machine starts slowly
        while not server.started:
            await anyio.sleep(0.005)
    port = server.servers[0].sockets[0].getsockname()[1]

    def stop() -> None:
        server.should_exit = True

    return port, stop


async def _serve_hypercorn(tg: anyio.abc.TaskGroup, app: Any,
                           port: int = 0) -> tuple[int, Callable[[], None]]:
    import hypercorn.trio
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.graceful_timeout = 1
    config.accesslog = None
    shutdown = anyio.Event()
    binds = await tg.start(functools.partial(hypercorn.trio.serve, app, config,
                                             shutdown_trigger=shutdown.wait))
    return int(binds[0].rsplit(":", 1)[1]), shutdown.set


@contextlib.asynccontextmanager
async def serving(app: Any, *, on_stop: Callable[[], Awaitable[Any]] | None = None,
                  port: int = 0, app_errors_expected: bool = False) -> AsyncIterator[str]:
    """Serve any ASGI app on a loopback port for the block (uvicorn under asyncio,
    hypercorn under trio); yields its base URL. ``on_stop`` runs right after the server
    is told to stop (e.g. to end open event streams, so it stops at once). ``port``:
    that one (``free_port()``: a server started later at an address known before), else
    any free one. An exception out of the app fails the block at its end
    (``tests.harness.unhandled``) unless ``app_errors_expected``."""
    escapes = Escapes(app)
    async with anyio.create_task_group() as tg:
        if sniffio.current_async_library() == "trio":
            port, stop = await _serve_hypercorn(tg, escapes, port)
        else:
            port, stop = await _serve_uvicorn(tg, escapes, port)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            stop()
            if on_stop is not None:
                await on_stop()
    if not app_errors_expected:
        escapes.check()


@contextlib.asynccontextmanager
async def local_server(workspace: Any, *, kind: type[Kind] = LocalServer,  # type: ignore[assignment]
                       options: BridgeOptions | None = None, state_dir: Any = None,
                       wrap: Callable[[ASGIApp], ASGIApp] | None = None,
                       headers: dict[str, str] | None = None, timeout: float = 10,
                       app_errors_expected: bool = False,
                       **settings: Any) -> AsyncIterator[Kind]:
    overrides = {name: settings.pop(name) for name in OVERRIDES if name in settings}
    config = Settings(workspace=str(workspace), port=0, options=options or BridgeOptions(),
                      state_dir=str(state_dir or Path(workspace) / "state"), **settings)
    async with open_server(config, **overrides) as server:
        app = wrap(server.app) if wrap is not None else server.app
        async with serving(app, on_stop=server.drain,
                           app_errors_expected=app_errors_expected) as base_url, \
                httpx.AsyncClient(base_url=base_url, timeout=timeout, headers=headers) as client:
            server.advertise(base_url)
            yield kind(base_url, server, client)
