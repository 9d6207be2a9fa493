"""PostgreSQL store: after a SIGKILL, the restarted instance (same state directory)
recovers its own running tasks at start-up, before listening, as SQLite does —
not when their 30 s lease expires. The real ``acp-server serve`` process."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.harness import ServeProcess
from tests.lmsp import stores

pytestmark = pytest.mark.anyio


@pytest.fixture
def store_url(tmp_path: Path) -> Iterator[str]:
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    url = stores.postgres_url_for(tmp_path, "identity")
    try:
        yield url
    finally:
        stores.drop_schemas()


async def _task_status(daemon, task_id: str) -> str:  # type: ignore[no-untyped-def]
    response = await daemon.client.get(f"/lmsp/v1/tasks/{task_id}")
    assert response.status_code == 200, response.text
    return str(response.json()["status"])


@pytest.mark.parametrize("anyio_backend", ["trio"])   # the servers are child processes
async def test_restarted_instance_recovers_its_own_tasks_at_once(tmp_path: Path,
                                                                  store_url: str) -> None:
    flags = ("--store", store_url)
    async with ServeProcess(tmp_path, *flags) as first:
        response = await first.client.post("/lmsp/v1/tasks", json={
            "type": "response", "input": {"model": "reference", "input": "/sleep 60s held"}})
        assert response.status_code == 202, response.text
        task_id = response.json()["id"]
        with anyio.fail_after(10):
            while await _task_status(first, task_id) != "running":
                await anyio.sleep(0.02)
        os.kill(first.pid, signal.SIGKILL)
    identities = sorted(p.name for p in (tmp_path / "state").iterdir()
                        if p.name.startswith("lmsp-instance-"))
    assert len(identities) == 1
    async with ServeProcess(tmp_path, *flags) as second:
        # Listening means recovery already ran: no wait for the lease (30 s).
        task = (await second.client.get(f"/lmsp/v1/tasks/{task_id}")).json()
        assert task["status"] == "failed", task
        assert task["error"]["code"] == "server_restarted"
        # A second live instance on the same state directory gets its own identity.
        async with ServeProcess(tmp_path, *flags):
            slots = sorted(p.name for p in (tmp_path / "state").iterdir()
                           if p.name.startswith("lmsp-instance-"))
            assert len(slots) == 2
