"""SIGTERM with running sessions that another door closes meanwhile exits 0 (#21
item 11), with the real ``acp-server serve`` and a real stdio agent.

On a drain the LMSP runner is stopped first, and its running tasks close their
sessions as they end, while ``Bridge.aclose`` closes every session it knows. The agent
takes a while to answer ``session/close`` (as ``qwen --acp`` does), so the two
interleave: whatever closes first, the drain ends with exit code 0 and no traceback.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.harness import ServeProcess
from tests.hostile.test_hung_agents import agent_flag, create

pytestmark = pytest.mark.anyio

TASKS = 4   # --max-running-tasks: all of them running at the SIGTERM


@pytest.mark.parametrize("anyio_backend", ["trio"])   # the servers are child processes
async def test_sigterm_while_lmsp_tasks_run_exits_0(tmp_path: Path) -> None:
    flags = [*agent_flag("slow", "--slow-close-ms", "300"),
             "--max-running-tasks", str(TASKS)]
    async with ServeProcess(tmp_path, *flags) as daemon:
        ids = []
        for i in range(TASKS):
            created = await daemon.client.post("/lmsp/v1/responses", json={
                "model": "slow", "input": f"hold {i}", "background": True})
            assert created.status_code in (200, 202), created.text
            ids.append(created.json()["id"])
        for _ in range(2):   # and sessions the bridge alone closes
            assert (await create(daemon.client, "slow")).status_code == 200
        with anyio.fail_after(20):
            for response_id in ids:
                while (await daemon.client.get(f"/lmsp/v1/responses/{response_id}")
                       ).json()["status"] != "in_progress":
                    await anyio.sleep(0.02)
        status = await anyio.to_thread.run_sync(daemon.stop)   # SIGTERM, then the exit status
        stderr = daemon.stderr_text()
        assert status == 0, stderr[-3000:]
        assert "Traceback" not in stderr and "SessionNotFoundError" not in stderr
