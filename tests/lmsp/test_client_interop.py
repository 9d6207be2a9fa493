"""The project's own ``TaskClient`` against this server (wire compatibility)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from acp_server.client.tasks import TaskClient, TaskNotCancelableError
from tests.lmsp.server import running_lmsp

pytestmark = pytest.mark.anyio


async def test_task_client_round_trip(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path, token="tok") as srv, \
            TaskClient(srv.base_url, token="tok") as tasks:
        task = await tasks.create({"model": "reference", "input": "/chunks 4 a b c d"})
        assert task.status == "queued"
        types = []
        async with contextlib.aclosing(tasks.events(task.id)) as events:
            async for event in events:
                types.append(event.type)
        assert types[0] == "response.created" and types[-1] == "response.completed"
        assert types.count("response.output_text.delta") == 4
        done = await tasks.wait(task.id)
        assert done.status == "succeeded"
        with pytest.raises(TaskNotCancelableError):
            await tasks.cancel(task.id)
        after = []
        async with contextlib.aclosing(tasks.events(task.id, after=len(types) - 1)) as events:
            async for event in events:
                after.append(event)
        assert after == []   # 204
