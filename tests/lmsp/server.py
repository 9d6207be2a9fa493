"""Serve the app with LMSP over real HTTP on a loopback port, on either backend.

    async with running_lmsp(tmp_path) as srv:
        task = await srv.create({"model": "reference", "input": "hi"})
        events = await srv.events(task["id"])

Composition is exactly what the CLI wiring does: ``build_app`` + ``install_lmsp``; the
store is the one the ``store_name`` fixture selected (``tests.lmsp.stores.current``;
SQLite for tests without it).
uvicorn under asyncio, hypercorn under trio, inside the test's own event loop.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import sniffio
from httpx_sse import aconnect_sse

from acp_server.app import build_app
from acp_server.lmsp import LmspConfig, LmspService, install_lmsp, open_lmsp
from acp_server.settings import Settings
from acp_server.store.tasks import TaskStore
from bridge import Bridge
from bridge.options import BridgeOptions
from bridge.agents.reference import ReferenceAgentFactory
from tests.lmsp.stores import STORE_FACTORIES, current
from tests.rest.server import _serve_hypercorn, _serve_uvicorn

TERMINAL = {"succeeded", "failed", "cancelled"}


def envelope(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "response", "input": {"model": "reference", "input": text}, **extra}


class FakeClock:
    """A wall clock the test moves: ``LmspConfig(clock=clock)``, then ``clock.advance(s)``."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class LmspServer:
    base_url: str
    service: LmspService
    client: httpx.AsyncClient

    async def create(self, text: str = "hello", *, status: int = 202, headers: dict[str, str]
                     | None = None, **extra: Any) -> dict[str, Any]:
        response = await self.client.post("/lmsp/v1/tasks", json=envelope(text, **extra),
                                          headers=headers)
        assert response.status_code == status, response.text
        return response.json()  # type: ignore[no-any-return]

    async def get(self, task_id: str) -> dict[str, Any]:
        response = await self.client.get(f"/lmsp/v1/tasks/{task_id}")
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    async def wait(self, task_id: str, statuses: set[str] = TERMINAL, timeout: float = 10
                   ) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            while True:
                task = await self.get(task_id)
                if task["status"] in statuses:
                    return task
                await anyio.sleep(0.01)

    async def events(self, task_id: str, *, headers: dict[str, str] | None = None,
                     params: dict[str, str] | None = None, timeout: float = 10,
                     limit: int | None = None) -> list[tuple[str, str, dict[str, Any]]]:
        """(id, event, data) of every frame until the server closes the stream."""
        frames: list[tuple[str, str, dict[str, Any]]] = []
        with anyio.fail_after(timeout):
            async with aconnect_sse(self.client, "GET", f"/lmsp/v1/tasks/{task_id}/events",
                                    headers=dict(headers or {}), params=params) as source:
                assert source.response.status_code == 200, await source.response.aread()
                async for sse in source.aiter_sse():
                    if not sse.data:
                        continue
                    frames.append((sse.id, sse.event, json.loads(sse.data)))
                    if limit is not None and len(frames) >= limit:
                        break
        return frames


@contextlib.asynccontextmanager
async def running_lmsp(tmp_path: Any, *, token: str | None = None, max_running_tasks: int = 4,
                       config: LmspConfig | None = None, group_commit: bool = True,
                       db_name: str = "lmsp.sqlite3", store: TaskStore | None = None,
                       factory: Any = None, options: BridgeOptions | None = None
                       ) -> AsyncIterator[LmspServer]:
    """``store``: a store of the test's own (else the selected one); ``factory``: the
    agent factory (else the reference agent); ``options``: the bridge's."""
    settings = Settings(workspace=str(tmp_path), port=0, token=token)
    async with Bridge(factory or ReferenceAgentFactory(), workspace_cwd=settings.workspace,
                      options=options or settings.options) as bridge:
        if store is None:
            store = STORE_FACTORIES[current["name"]](Path(tmp_path), db_name, group_commit)
        async with open_lmsp(bridge, state_dir=str(tmp_path), store=store, token=token,
                             max_running_tasks=max_running_tasks, config=config) as service:
            app = build_app(settings, bridge)
            install_lmsp(app, service)
            async with anyio.create_task_group() as tg:
                if sniffio.current_async_library() == "trio":
                    port, stop = await _serve_hypercorn(tg, app)
                else:
                    port, stop = await _serve_uvicorn(tg, app)
                base_url = f"http://127.0.0.1:{port}"
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                try:
                    async with httpx.AsyncClient(base_url=base_url, timeout=10,
                                                 headers=headers) as client:
                        yield LmspServer(base_url, service, client)
                finally:
                    service.stop()
                    stop()
