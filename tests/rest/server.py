"""Serve the app over real HTTP on an ephemeral loopback port, on either backend.

    async with running_server(tmp_path, options=BridgeOptions(max_sessions=1)) as srv:
        response = await srv.client.post("/session", json={})
        events = await srv.events_until(sid, "turn_complete", last_event_id=0)

Under asyncio the server is uvicorn; under trio (which uvicorn does not support) it is
hypercorn. Both run inside the test's own event loop, around a ``Bridge`` on the
in-process reference agent.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import httpx
import sniffio
from httpx_sse import aconnect_sse

from acp_server.app import build_app
from acp_server.settings import Settings
from bridge import Bridge, BridgeOptions
from bridge.agents.reference import ReferenceAgentFactory

TEXT = "text"


def text_prompt(text: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": text}]}


@dataclass
class RunningServer:
    base_url: str
    bridge: Bridge
    settings: Settings
    client: httpx.AsyncClient

    async def create_session(self, **body: Any) -> dict[str, Any]:
        response = await self.client.post("/session", json=body)
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    async def prompt(self, session_id: str, text: str, **headers: str) -> httpx.Response:
        return await self.client.post(f"/session/{session_id}/prompt", json=text_prompt(text),
                                      headers=headers)

    async def events_until(self, session_id: str, stop: str | Callable[[str, Any], bool], *,
                           last_event_id: int | None = None, epoch: str | None = None,
                           timeout: float = 5.0,
                           on_open: Callable[[], Any] | None = None,
                           headers: dict[str, str] | None = None) -> list[tuple[str, Any]]:
        """(event type, decoded data) of every frame up to and including ``stop``."""
        headers = dict(headers or {})
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        if epoch is not None:
            headers["X-Qwen-Event-Epoch"] = epoch
        matches = stop if callable(stop) else (lambda kind, _data: kind == stop)
        frames: list[tuple[str, Any]] = []
        with anyio.fail_after(timeout):
            async with aconnect_sse(self.client, "GET", f"/session/{session_id}/events",
                                    headers=headers) as source:
                assert source.response.status_code == 200, await source.response.aread()
                if on_open is not None:
                    await on_open()
                async with contextlib.aclosing(source.aiter_sse()) as stream:
                    async for sse in stream:
                        if not sse.data:  # the leading ``retry:`` block
                            continue
                        data = json.loads(sse.data)
                        frames.append((sse.event, data))
                        if matches(sse.event, data):
                            return frames
        return frames


async def _serve_uvicorn(tg: anyio.abc.TaskGroup, app: Any) -> tuple[int, Callable[[], None]]:
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning",
                            access_log=False, timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    tg.start_soon(server.serve)
    with anyio.fail_after(5):
        while not server.started:
            await anyio.sleep(0.005)
    port = server.servers[0].sockets[0].getsockname()[1]

    def stop() -> None:
        server.should_exit = True

    return port, stop


async def _serve_hypercorn(tg: anyio.abc.TaskGroup, app: Any) -> tuple[int, Callable[[], None]]:
    import hypercorn.trio
    from hypercorn.config import Config

    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.graceful_timeout = 1
    config.accesslog = None
    shutdown = anyio.Event()
    binds = await tg.start(functools.partial(hypercorn.trio.serve, app, config,
                                             shutdown_trigger=shutdown.wait))
    return int(binds[0].rsplit(":", 1)[1]), shutdown.set


@contextlib.asynccontextmanager
async def serving(app: Any, *, on_stop: Callable[[], Awaitable[Any]] | None = None,
                  ) -> AsyncIterator[str]:
    """Serve any ASGI app on a loopback port for the block (uvicorn under asyncio,
    hypercorn under trio); yields its base URL. ``on_stop`` runs right after the server
    is told to stop (e.g. to end open event streams, so it stops at once)."""
    async with anyio.create_task_group() as tg:
        if sniffio.current_async_library() == "trio":
            port, stop = await _serve_hypercorn(tg, app)
        else:
            port, stop = await _serve_uvicorn(tg, app)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            stop()
            if on_stop is not None:
                await on_stop()


@contextlib.asynccontextmanager
async def running_server(workspace: Any, *, options: BridgeOptions | None = None,
                         **settings: Any) -> AsyncIterator[RunningServer]:
    config = Settings(workspace=str(workspace), port=0, options=options or BridgeOptions(),
                      **settings)
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=config.workspace,
                      options=config.options) as bridge:
        async with serving(build_app(config, bridge), on_stop=bridge.aclose) as base_url:
            async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
                yield RunningServer(base_url, bridge, config, client)
