"""``TaskClient`` against the real daemon with LMSP: create (idempotent), get, cancel,
events resumed after a drop, the typed 410, problems as typed errors, wait."""

from __future__ import annotations

import contextlib
from pathlib import Path

import anyio
import pytest

from acp_server.client import (EventHistoryExpiredError, LmspProblem, TaskClient, TaskEvent,
                               TaskNotCancelableError, TaskNotFoundError)
from acp_server.client.tasks import IdempotencyKeyReusedError, InvalidRequestError
from acp_server.lmsp import LmspConfig
from tests.sdk.harness import DropEvents, Recorder, lmsp_daemon
from tests.lmsp.server import FakeClock

pytestmark = pytest.mark.anyio


def request(text: str) -> dict[str, object]:
    return {"model": "reference", "input": text}


async def collect(tasks: TaskClient, task_id: str, **kw: int) -> list[TaskEvent]:
    async with contextlib.aclosing(tasks.events(task_id, **kw)) as events:
        return [event async for event in events]


async def test_create_get_wait(tmp_path: Path) -> None:
    recorder = Recorder()
    async with lmsp_daemon(tmp_path, wrap=recorder.wrap) as srv, TaskClient(srv.url) as tasks:
        assert (await tasks.capabilities())["capabilities"]["tasks"] is True
        task = await tasks.create(request("/chunks 3 hello tasks"))
        assert task.status == "queued" and task.on_restart == "fail" and not task.terminal
        key = recorder.matching("POST", "/lmsp/v1/tasks")[0].headers["idempotency-key"]
        assert len(key) == 36  # a fresh UUID
        done = await tasks.wait(task.id)
        assert done.status == "succeeded" and done.response is not None
        assert done.response["output"][0]["content"][0]["text"] == "Echo: hello tasks"
        assert (await tasks.get(task.id)).status == "succeeded"
        events = await collect(tasks, task.id)
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        assert "".join(e.delta or "" for e in events) == "Echo: hello tasks"
        assert await collect(tasks, task.id, after=events[-1].sequence_number) == []  # 204
        assert [e.sequence_number for e in await collect(tasks, task.id, after=3)] == \
            list(range(4, len(events)))


async def test_idempotency(tmp_path: Path) -> None:
    async with lmsp_daemon(tmp_path) as srv, TaskClient(srv.url) as tasks:
        first = await tasks.create(request("same"), idempotency_key="key-1")
        again = await tasks.create(request("same"), idempotency_key="key-1")
        assert again.id == first.id
        with pytest.raises(IdempotencyKeyReusedError) as info:
            await tasks.create(request("different"), idempotency_key="key-1")
        assert info.value.code == "idempotency_key_reused" and info.value.status == 422
        other = await tasks.create(request("same"))
        assert other.id != first.id


async def test_problems_are_typed(tmp_path: Path) -> None:
    async with lmsp_daemon(tmp_path) as srv, TaskClient(srv.url) as tasks:
        with pytest.raises(TaskNotFoundError) as info:
            await tasks.get("task_nope")
        assert info.value.code == "task_not_found" and info.value.status == 404
        assert info.value.problem["task_id"] == "task_nope"
        with pytest.raises(InvalidRequestError):
            await tasks.create(request("x"), on_restart="sometimes")
        with pytest.raises(LmspProblem) as unsupported:
            await tasks.create(request("x"), on_restart="resume")
        assert unsupported.value.code == "unsupported_capability"
        task = await tasks.create(request("quick"))
        await tasks.wait(task.id)
        with pytest.raises(TaskNotCancelableError) as refused:
            await tasks.cancel(task.id)
        assert refused.value.problem["task_status"] == "succeeded"


async def test_cancel(tmp_path: Path) -> None:
    async with lmsp_daemon(tmp_path) as srv, TaskClient(srv.url) as tasks:
        task = await tasks.create(request("/sleep 60s slow"))   # cancelled below
        async with contextlib.aclosing(tasks.events(task.id)) as events:
            async for event in events:
                if event.type == "response.in_progress":
                    break
        cancelled = await tasks.cancel(task.id)
        assert cancelled.status in {"cancelling", "cancelled"}
        assert (await tasks.cancel(task.id)).status in {"cancelling", "cancelled"}  # idempotent
        with anyio.fail_after(30):   # only against a hang
            done = await tasks.wait(task.id, poll_interval=0.05)
        assert done.status == "cancelled"
        events = await collect(tasks, task.id)
        assert events[-1].type == "response.cancelled"


async def test_events_resume_after_a_drop(tmp_path: Path) -> None:
    drop, recorder = DropEvents(after=4, times=2), Recorder()
    async with lmsp_daemon(tmp_path, wrap=lambda app: recorder.wrap(drop.wrap(app))) as srv, \
            TaskClient(srv.url) as tasks:
        task = await tasks.create(request("/sleep 200ms /chunks 30 " + "y " * 60))
        events = await collect(tasks, task.id)
    assert drop.dropped == 2
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].terminal
    streams = recorder.matching("GET", "/events")
    assert len(streams) == 3
    assert "last-event-id" not in streams[0].headers
    assert streams[1].headers["last-event-id"] == "3"


async def test_event_history_expired(tmp_path: Path) -> None:
    clock = FakeClock()   # expiry is judged by the service's clock
    config = LmspConfig(event_retention_s=0.2, purge_interval_s=3600, clock=clock)
    async with lmsp_daemon(tmp_path, config=config) as srv, TaskClient(srv.url) as tasks:
        task = await tasks.create(request("x"))
        await tasks.wait(task.id)
        clock.advance(0.5)
        with pytest.raises(EventHistoryExpiredError) as info:
            await collect(tasks, task.id)
        assert info.value.status == 410 and info.value.code == "event_history_expired"
        assert info.value.retention_seconds == 0
        assert (await tasks.wait(task.id)).status == "succeeded"  # wait falls back to polling
