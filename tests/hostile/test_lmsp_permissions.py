"""LMSP work never waits on a permission nobody can answer; a foreground response
is cancelled when its client disconnects (over real HTTP)."""

from __future__ import annotations

import functools
from pathlib import Path

import anyio
import httpx
import pytest

from acp_server.lmsp import LmspConfig
from tests.lmsp.server import LmspServer, running_lmsp

pytestmark = pytest.mark.anyio


def _decisions(events: list[tuple[str, str, dict]]) -> list[dict]:
    return [data for _id, kind, data in events if kind == "response.permission_decided"]


async def test_permission_tasks_do_not_hold_the_slots(server: LmspServer) -> None:
    # More /permission tasks than --max-running-tasks (4): every one ends on its own.
    tasks = [await server.create(f"/permission task {i}") for i in range(6)]
    for task in tasks:
        done = await server.wait(task["id"])
        assert done["status"] == "succeeded", done
        events = await server.events(task["id"])
        [decided] = _decisions(events)
        assert decided["policy"] == "reject" and decided["option_kind"] == "reject_once"
        assert decided["outcome"] == {"outcome": "selected", "optionId": "reject_once"}
        text = "".join(d["delta"] for _i, k, d in events if k == "response.output_text.delta")
        assert text.startswith("Permission rejected (reject_once).")
    status = (await server.client.get("/daemon/status")).json()
    assert status["runtime"]["permissions"]["lmspDecisions"]["reject"] == 6
    assert status["runtime"]["permissions"]["lmspPolicy"] == "reject"


async def test_foreground_response_with_permission_answers(server: LmspServer) -> None:
    response = await server.client.post("/lmsp/v1/responses", json={
        "model": "reference", "input": "/permission fg"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "completed"
    assert body["output"][0]["content"][0]["text"].startswith("Permission rejected")


async def test_allow_policy(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path, config=LmspConfig(permission_policy="allow")) as srv:
        task = await srv.create("/permission yes")
        assert (await srv.wait(task["id"]))["status"] == "succeeded"
        [decided] = _decisions(await srv.events(task["id"]))
        assert decided["option_kind"] == "allow_once"


async def test_foreground_response_cancelled_on_disconnect(server: LmspServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as other:
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(other.post, "/lmsp/v1/responses", json={
                "model": "reference", "input": "/sleep 60s never read"}))
            with anyio.fail_after(10):
                while not server.service.runner.running_ids():
                    await anyio.sleep(0.01)
            [task_id] = server.service.runner.running_ids()
            tg.cancel_scope.cancel()   # the client goes away mid-response
    task = await server.wait(task_id, timeout=15)
    assert task["status"] == "cancelled"
