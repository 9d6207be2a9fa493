"""Restart recovery in process (§7.5): stop the service with tasks in flight, reopen
the same SQLite file. The SIGKILL variant is ``test_crash``."""

from __future__ import annotations

from pathlib import Path

import pytest

from acp_server.lmsp import LmspConfig
from tests.agents.held import HeldAgent
from tests.lmsp.server import running_lmsp

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("store_name")]


async def test_policies_after_restart(tmp_path: Path) -> None:
    # the turns wait in the agent (never released): still running when the service
    # stops, whatever the machine's load (no clock to race)
    async with running_lmsp(tmp_path, max_running_tasks=2, agent_factory=HeldAgent()) as srv:
        fail = await srv.create("a", on_restart="fail")
        retry = await srv.create("b", on_restart="retry")
        queued = await srv.create("c")
        for task in (fail, retry):
            await srv.wait(task["id"], {"running"})
    async with running_lmsp(tmp_path, max_running_tasks=0) as srv:
        assert srv.service.recovery.failed == 1 and srv.service.recovery.requeued == 1
        failed = await srv.get(fail["id"])
        assert failed["status"] == "failed"
        assert failed["error"] == {
            "type": "https://lmsp.invalid/problems/server_restarted",
            "title": "Server restarted",
            "detail": "The server restarted while the task was running.",
            "code": "server_restarted"}
        assert (await srv.get(retry["id"]))["status"] == "queued"
        assert (await srv.get(queued["id"]))["status"] == "queued"
        frames = await srv.events(fail["id"])
        assert [f[1] for f in frames] == ["response.created", "response.in_progress",
                                          "response.failed"]
        assert frames[-1][2]["response"]["error"] == {
            "code": "server_restarted",
            "message": "The server restarted while the task was running."}


async def test_retry_is_capped(tmp_path: Path) -> None:
    config = LmspConfig(max_attempts=2)
    # each attempt waits in the agent (never released) until the service stops
    async with running_lmsp(tmp_path, max_running_tasks=1, config=config,
                            agent_factory=HeldAgent()) as srv:
        task = await srv.create("r", on_restart="retry")
        await srv.wait(task["id"], {"running"})
    async with running_lmsp(tmp_path, max_running_tasks=1, config=config,
                            agent_factory=HeldAgent()) as srv:
        await srv.wait(task["id"], {"running"})   # attempt 2
    async with running_lmsp(tmp_path, max_running_tasks=1, config=config) as srv:
        done = await srv.get(task["id"])
        assert done["status"] == "failed" and done["error"]["code"] == "server_restarted"
        assert done["error"]["detail"] == "The server restarted during the last of 2 attempts."
        frames = await srv.events(task["id"])
        assert [f[1] for f in frames] == ["response.created", "response.in_progress",
                                          "response.in_progress", "response.failed"]
        assert [int(f[0]) for f in frames] == [0, 1, 2, 3]


async def test_cancel_frees_a_queue_slot(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path, max_running_tasks=0,
                            config=LmspConfig(max_queued_tasks=1)) as srv:
        first = await srv.create("a")
        await srv.create("b", status=503)
        await srv.client.post(f"/lmsp/v1/tasks/{first['id']}/cancel")
        await srv.create("c")


async def test_agent_death_applies_the_restart_policy(tmp_path: Path) -> None:
    """A dead agent is treated like a restart: ``retry`` runs the task again on the
    restarted agent (capped), ``fail`` fails it with the agent's error."""
    config = LmspConfig(max_attempts=3)
    async with running_lmsp(tmp_path, max_running_tasks=1, config=config) as srv:
        retried = await srv.create("/crash down", on_restart="retry")
        done = await srv.wait(retried["id"], {"failed"})
        assert done["error"]["code"] == "agent_error"
        frames = await srv.events(retried["id"])
        kinds = [f[1] for f in frames]
        assert kinds.count("response.in_progress") == 3   # three attempts, numbering goes on
        assert kinds[0] == "response.created" and kinds[-1] == "response.failed"
        assert [int(f[0]) for f in frames] == list(range(len(frames)))

        failed = await srv.create("/crash down", on_restart="fail")
        done = await srv.wait(failed["id"], {"failed"})
        kinds = [f[1] for f in await srv.events(failed["id"])]
        assert kinds.count("response.in_progress") == 1
        # the agent came back for the next task
        ok = await srv.create("fine")
        assert (await srv.wait(ok["id"], {"succeeded"}))["status"] == "succeeded"
