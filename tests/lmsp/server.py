"""The LMSP tests' helpers on the in-process server (``tests.harness.local_server``).

    async with running_lmsp(tmp_path) as srv:
        task = await srv.create({"model": "reference", "input": "hi"})
        events = await srv.events(task["id"])

The store is the one the ``store_name`` fixture selected (``tests.lmsp.stores.current``;
SQLite for tests without it); with a ``token`` the client sends it.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import anyio
from httpx_sse import aconnect_sse

from acp_server.lmsp import LmspConfig, LmspService
from acp_server.store.tasks import TaskStore
from tests.harness.local import LocalServer, local_server
from tests.lmsp.stores import STORE_FACTORIES, current

TERMINAL = {"succeeded", "failed", "cancelled"}


def problem_of(response: Any) -> dict[str, Any]:
    """An answer's problem object less its ``message``, which must repeat ``detail``
    (the member the OpenAI SDKs show): the bodies the tests compare whole."""
    body: dict[str, Any] = response.json()
    assert body.pop("message") == body["detail"], body
    return body


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


class LmspServer(LocalServer):
    @property
    def service(self) -> LmspService:
        return self.server.lmsp

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


def running_lmsp(tmp_path: Any, *, token: str | None = None, max_running_tasks: int = 4,
                 config: LmspConfig | None = None, group_commit: bool = True,
                 db_name: str = "lmsp.sqlite3", store: TaskStore | None = None,
                 **kwargs: Any) -> contextlib.AbstractAsyncContextManager[LmspServer]:
    """``tests.harness.local_server`` with the LMSP helpers, on the selected store (or
    ``store``, a test's own: a fault-injecting one, say)."""
    if store is None:
        store = STORE_FACTORIES[current["name"]](Path(tmp_path), db_name, group_commit)
    return local_server(tmp_path, kind=LmspServer, token=token,
                        max_running_tasks=max_running_tasks, lmsp_store=store,
                        lmsp_config=config, group_commit=group_commit,
                        headers={"Authorization": f"Bearer {token}"} if token else None,
                        **kwargs)
