"""The runner waiting on the agent side: a task whose agent never answers
``session/new`` is cancelled for real (#21 item 2), and work at the bridge's session
limit stays queued until a slot frees instead of failing (#21 item 7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from bridge.agents.reference import ReferenceAgentFactory
from bridge.options import BridgeOptions
from tests.bridge.helpers import wait_until
from tests.lmsp.server import running_lmsp

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("store_name")]


class _NoNewSession:
    """The reference agent, except that ``session/new`` is never answered."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def request(self, method: str, params: Any) -> Any:
        if method == "session/new":
            await anyio.sleep_forever()
        return await self.inner.request(method, params)


class NoNewFactory(ReferenceAgentFactory):
    async def connect(self, client: Any, task_group: anyio.abc.TaskGroup) -> Any:
        return _NoNewSession(await super().connect(client, task_group))


async def test_cancelling_a_loading_task_ends_it(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path, agent_factory=NoNewFactory()) as server:
        task = await server.create("never starts")
        await server.wait(task["id"], {"loading"})
        answer = await server.client.post(f"/lmsp/v1/tasks/{task['id']}/cancel")
        assert answer.status_code == 200, answer.text
        done = await server.wait(task["id"])
        assert done["status"] == "cancelled"
        # its runner slot is free again: the terminal is committed before the turn unwinds
        await wait_until(lambda: not server.service.runner.running, timeout=10)


async def test_work_at_the_session_limit_stays_queued_until_a_slot_frees(
        tmp_path: Path) -> None:
    async with running_lmsp(tmp_path, options=BridgeOptions(max_sessions=1)) as server:
        bridge = server.service.runner.models["reference"][0]
        held = await bridge.create_session(agent="reference")   # the only slot
        first = await server.create("first")
        second = await server.create("second")
        with anyio.fail_after(10):   # the runner met the limit and put the task back
            while server.service.runner._slot_wait == 0:
                await anyio.sleep(0.01)
        for task in (first, second):
            assert (await server.get(task["id"]))["status"] in ("queued", "loading")
        await bridge.close_session(held.session_id)
        for task in (first, second):
            done = await server.wait(task["id"])
            assert done["status"] == "succeeded", done
            assert done["response"]["output"][0]["content"][0]["text"]


async def test_a_task_cancelled_while_waiting_for_a_slot_is_cancelled(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path, options=BridgeOptions(max_sessions=1)) as server:
        bridge = server.service.runner.models["reference"][0]
        held = await bridge.create_session(agent="reference")
        task = await server.create("waiting")
        with anyio.fail_after(10):
            while server.service.runner._slot_wait == 0:
                await anyio.sleep(0.01)
        answer = await server.client.post(f"/lmsp/v1/tasks/{task['id']}/cancel")
        assert answer.status_code == 200
        assert (await server.wait(task["id"]))["status"] == "cancelled"
        await bridge.close_session(held.session_id)
