"""Test servers for the client: the real daemon (optionally wrapped in ASGI
middleware) or a tiny Starlette app, on a real loopback port, on either backend.

    recorder = Recorder()
    async with daemon(tmp_path, wrap=recorder.wrap) as url:
        async with DaemonClient(url) as client: ...
    assert recorder.count("POST", "/prompt") == 1

Contracts: ``Recorder`` records (method, path, headers) of every request before the
app sees it. ``DropEvents`` kills an event-stream connection (the server closes it
mid-stream, no clean end) after a given number of frames with an id, for the first
``times`` streams only.
"""

from __future__ import annotations

import contextlib
import socket
from contextlib import asynccontextmanager
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from acp_server.app import build_app
from acp_server.settings import Settings
from bridge import Bridge, BridgeOptions
from bridge.agents.reference import ReferenceAgentFactory
from tests.rest.server import serving

Wrap = Callable[[ASGIApp], ASGIApp]


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class Recorder:
    requests: list[Request] = field(default_factory=list)

    def wrap(self, app: ASGIApp) -> ASGIApp:
        async def recording(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
                self.requests.append(Request(scope["method"], scope["path"], headers))
            await app(scope, receive, send)
        return recording

    def matching(self, method: str, suffix: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and suffix in r.path]

    def count(self, method: str, suffix: str) -> int:
        return len(self.matching(method, suffix))


class _Dropped(Exception):
    pass


@dataclass
class DropEvents:
    """Break the first ``times`` event streams after ``after`` frames with an id."""

    after: int = 2
    times: int = 1
    dropped: int = 0

    def wrap(self, app: ASGIApp) -> ASGIApp:
        async def dropping(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http" or not scope["path"].endswith("/events") \
                    or self.dropped >= self.times:
                await app(scope, receive, send)
                return
            seen = 0

            async def counting_send(message: Message) -> None:
                nonlocal seen
                if message["type"] == "http.response.body":
                    body = message.get("body", b"")
                    frames = body.split(b"\n\n")
                    kept: list[bytes] = []
                    for frame in frames:
                        kept.append(frame)
                        if frame.startswith(b"id: "):
                            seen += 1
                            if seen >= self.after:
                                break
                    if seen >= self.after:
                        self.dropped += 1
                        await send({"type": "http.response.body",
                                    "body": b"\n\n".join(kept) + b"\n\n", "more_body": True})
                        raise _Dropped("dropping the event stream")
                await send(message)

            with contextlib.suppress(_Dropped):
                await app(scope, receive, counting_send)
            # returning with the response unfinished: the server closes the connection
        return dropping


@dataclass
class Daemon:
    url: str
    bridge: Bridge


@contextlib.asynccontextmanager
async def daemon(workspace: Any, *, options: BridgeOptions | None = None,
                 wrap: Wrap | None = None) -> AsyncIterator[Daemon]:
    config = Settings(workspace=str(workspace), port=0, options=options or BridgeOptions())
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=config.workspace,
                      options=config.options) as bridge:
        app: ASGIApp = build_app(config, bridge)
        if wrap is not None:
            app = wrap(app)
        async with serving(app, on_stop=bridge.aclose) as url:
            yield Daemon(url, bridge)


@asynccontextmanager
async def lmsp_daemon(workspace: Any, *, wrap: Wrap | None = None,
                      config: Any = None) -> AsyncIterator[Daemon]:
    """The daemon with LMSP installed, composed as ``tests/lmsp/server.py`` does."""
    from acp_server.lmsp import install_lmsp, open_lmsp

    settings = Settings(workspace=str(workspace), port=0)
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=settings.workspace,
                      options=settings.options) as bridge, \
            open_lmsp(bridge, state_dir=str(workspace), config=config) as service:
        app = build_app(settings, bridge)
        install_lmsp(app, service)

        async def on_stop() -> None:
            service.closed.set()
            service.hub.close()

        async with serving(wrap(app) if wrap is not None else app, on_stop=on_stop) as url:
            yield Daemon(url, bridge)


def closed_port_url() -> str:
    """An address where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)
