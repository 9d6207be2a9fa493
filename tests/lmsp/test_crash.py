"""Crash safety: a real server process, SIGKILL, restart on the same SQLite file (§7.5)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.agents.gated import gated_agent
from tests.harness import ServeProcess
from tests.lmsp.server import envelope

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only; the server is its own process


class Process:
    def __init__(self, tmp_path: Path, max_running: int) -> None:
        child = ServeProcess(tmp_path, "--store", f"sqlite:///{tmp_path / 'lmsp.db'}",
                             "--max-running-tasks", str(max_running),
                             "--agent", f"gated={gated_agent(tmp_path)}",
                             "--agent", "reference").start()
        self.proc, self.url = child.process, child.base_url

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        if process.proc.poll() is None:
            process.kill()


async def _wait(client: httpx.AsyncClient, task_id: str, statuses: set[str],
                timeout: float = 15) -> dict[str, Any]:
    with anyio.fail_after(timeout):
        while True:
            task = (await client.get(f"/lmsp/v1/tasks/{task_id}")).json()
            if task["status"] in statuses:
                return task  # type: ignore[no-any-return]
            await anyio.sleep(0.02)


async def _events(client: httpx.AsyncClient, task_id: str) -> list[dict[str, Any]]:
    import json

    response = await client.get(f"/lmsp/v1/tasks/{task_id}/events", timeout=15)
    assert response.status_code == 200
    return [json.loads(line[6:]) for line in response.text.splitlines()
            if line.startswith("data: ")]


async def test_sigkill_then_restart(tmp_path: Path, processes: list[Process]) -> None:
    first = Process(tmp_path, max_running=2)
    processes.append(first)
    accepted: dict[str, str] = {}   # task id → what it should end as
    gate = tmp_path / "gate-open"
    async with httpx.AsyncClient(base_url=first.url, timeout=10) as client:
        done = (await client.post("/lmsp/v1/tasks", json=envelope("quick"))).json()
        await _wait(client, done["id"], {"succeeded"})
        accepted[done["id"]] = "succeeded"
        running = {}
        for policy, expect in (("fail", "failed"), ("retry", "succeeded")):
            # running until the gate opens, after the kill: whatever the machine's load
            # (a 1.5 s turn could end before the kill, the 'fail' one then succeeded)
            body = envelope(f"gate {gate}", on_restart=policy)
            body["input"]["model"] = "gated"
            task = (await client.post("/lmsp/v1/tasks", json=body)).json()
            running[task["id"]] = policy
            accepted[task["id"]] = expect
        for task_id in running:
            await _wait(client, task_id, {"running"})
        queued_ids = []

        async def create(policy: str) -> None:
            response = await client.post("/lmsp/v1/tasks", json=envelope(
                "/sleep 50ms q", on_restart=policy))
            if response.status_code == 202:
                queued_ids.append(response.json()["id"])

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(create, ("fail", "retry")[i % 2])
        for task_id in queued_ids:
            accepted[task_id] = "succeeded"   # queued tasks run after the restart
        statuses = {t: (await client.get(f"/lmsp/v1/tasks/{t}")).json()["status"]
                    for t in running}
        assert set(statuses.values()) == {"running"}
    first.kill()
    gate.touch()   # the retried turn ends on its own after the restart

    second = Process(tmp_path, max_running=4)
    processes.append(second)
    async with httpx.AsyncClient(base_url=second.url, timeout=10) as client:
        for task_id, expect in accepted.items():
            task = await _wait(client, task_id, {"succeeded", "failed", "cancelled"})
            assert task["status"] == expect, (task_id, task)
        fail_id = next(t for t, p in running.items() if p == "fail")
        retry_id = next(t for t, p in running.items() if p == "retry")
        failed = (await client.get(f"/lmsp/v1/tasks/{fail_id}")).json()
        assert failed["error"]["code"] == "server_restarted"
        events = await _events(client, fail_id)
        assert [e["type"] for e in events] == ["response.created", "response.in_progress",
                                               "response.failed"]
        assert events[-1]["response"]["error"]["code"] == "server_restarted"
        events = await _events(client, retry_id)
        types = [e["type"] for e in events]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert types[:3] == ["response.created", "response.in_progress", "response.in_progress"]
        assert types[-1] == "response.completed"
    second.kill()
