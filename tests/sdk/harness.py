"""Test servers for the client: the real daemon in process (``tests.harness``,
optionally wrapped in ASGI middleware) on a real loopback port, on either backend.

    recorder = Recorder()
    async with daemon(tmp_path, wrap=recorder.wrap) as server:
        async with DaemonClient(server.url) as client: ...
    assert recorder.count("POST", "/prompt") == 1

Contracts: ``Recorder`` records (method, path, headers) of every request before the
app sees it. ``DropEvents`` kills an event-stream connection (the server closes it
mid-stream, no clean end) after a given number of frames with an id, for the first
``times`` streams only. ``without_prompt_id_replay`` answers ``/capabilities`` as a
server from before that feature.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from acp_server.lmsp import LmspConfig
from bridge import BridgeOptions
from tests.harness.local import LocalServer, local_server

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

            try:
                await app(scope, receive, counting_send)
            except* _Dropped:   # raised inside the stream's task group: in a group
                pass
            # returning with the response unfinished: the server closes the connection
        return dropping


def without_prompt_id_replay(app: ASGIApp, asked: list[str]) -> ASGIApp:
    """``/capabilities`` as a server from before ``prompt_id_replay`` answers it."""
    async def older(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/capabilities":
            await app(scope, receive, send)
            return
        asked.append(scope["path"])

        async def rewrite(message: Message) -> None:
            if message["type"] == "http.response.body":
                body = json.loads(message["body"])
                body["features"].remove("prompt_id_replay")
                message = {**message, "body": json.dumps(body).encode()}
            elif message["type"] == "http.response.start":
                message = {**message, "headers": [
                    (k, v) for k, v in message["headers"] if k.lower() != b"content-length"]}
            await send(message)

        await app(scope, receive, rewrite)
    return older


class Daemon(LocalServer):
    @property
    def url(self) -> str:
        return self.base_url


def daemon(workspace: Any, *, options: BridgeOptions | None = None, wrap: Wrap | None = None,
           config: LmspConfig | None = None, **settings: Any
           ) -> contextlib.AbstractAsyncContextManager[Daemon]:
    """The real daemon in process (``tests.harness.local_server``), optionally wrapped;
    ``config`` is LMSP's; ``settings`` more ``Settings`` fields."""
    return local_server(workspace, kind=Daemon, options=options, wrap=wrap, lmsp_config=config,
                        **settings)


lmsp_daemon = daemon   # every daemon serves LMSP; the name the task tests use

def closed_port_url() -> str:
    """An address where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Until ``predicate()`` holds; ``timeout`` only bounds a hang."""
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)
