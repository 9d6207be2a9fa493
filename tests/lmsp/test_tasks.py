"""Task lifecycle over HTTP: creation, polling, every state transition, cancel (§7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.agents.held import HeldAgent
from tests.lmsp.server import LmspServer, problem_of, running_lmsp

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("store_name")]


def _response(task: dict[str, Any], status: str, **fields: Any) -> dict[str, Any]:
    return {"id": task["response_id"], "object": "response", "created_at": task["created_at"],
            "status": status, "model": "reference", "output": [], "usage": None, "error": None,
            "incomplete_details": None, "metadata": {}, "instructions": None,
            "max_output_tokens": None, "background": False,
            "previous_response_id": None, "completed_at": None, "store": True,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "temperature": None, "top_p": None, "top_logprobs": 0, "max_tool_calls": None,
            "text": {"format": {"type": "text"}, "verbosity": None}, "truncation": "disabled",
            "reasoning": {"effort": None, "summary": None}, "service_tier": "default",
            "user": None, "safety_identifier": None, "prompt_cache_key": None, **fields}


def _usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0}}


def _message(task: dict[str, Any], text: str, status: str = "completed") -> dict[str, Any]:
    return {"id": "msg_" + task["response_id"].removeprefix("resp_") + "_1", "type": "message",
            "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


async def test_create_answers_202_with_the_queued_task(server: LmspServer) -> None:
    response = await server.client.post("/lmsp/v1/tasks", json={
        "type": "response", "on_restart": "retry",
        "input": {"model": "reference", "input": [
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "/sleep 200ms Write"}]}]}})
    assert response.status_code == 202
    assert response.headers["content-type"] == "application/json"
    task = response.json()
    assert task["id"].startswith("task_") and task["response_id"].startswith("resp_")
    assert response.headers["location"] == f"/lmsp/v1/tasks/{task['id']}"
    assert task == {"id": task["id"], "object": "task", "type": "response", "status": "queued",
                    "created_at": task["created_at"], "updated_at": task["created_at"],
                    "response_id": task["response_id"],
                    "events_url": f"/lmsp/v1/tasks/{task['id']}/events",
                    "on_restart": "retry", "response": None, "error": None}
    assert "Idempotent-Replayed" not in response.headers


async def test_succeeded_task_carries_the_full_response(server: LmspServer) -> None:
    task = await server.create("/chunks 2 hello there")
    done = await server.wait(task["id"])
    assert done["status"] == "succeeded" and done["error"] is None
    assert done["response"] == _response(
        task, "completed", output=[_message(task, "Echo: hello there")],
        usage=_usage(5, 4), completed_at=done["response"]["completed_at"])
    assert done["response"]["completed_at"] >= task["created_at"]


@pytest.mark.parametrize(("directive", "reason"), [("/max_tokens", "max_output_tokens"),
                                                   ("/refuse", "content_filter")])
async def test_incomplete_counts_as_succeeded(server: LmspServer, directive: str,
                                              reason: str) -> None:
    task = await server.create(f"{directive} hi")
    done = await server.wait(task["id"])
    assert done["status"] == "succeeded"
    assert done["response"]["status"] == "incomplete"
    assert done["response"]["incomplete_details"] == {"reason": reason}
    assert done["response"]["output"] == [_message(task, "Echo: hi", "incomplete")]
    frames = await server.events(task["id"])
    assert frames[-1][1] == "response.incomplete"


async def test_agent_error_fails_the_task_with_a_problem(server: LmspServer) -> None:
    task = await server.create("/fail boom")
    done = await server.wait(task["id"])
    assert done["status"] == "failed" and done["response"] is None
    error = done["error"]
    assert error["code"] == "agent_error" and "status" not in error
    assert error["type"] == "https://lmsp.invalid/problems/agent_error"
    assert error["title"] == "Agent error"
    assert "Reference agent failure" in error["detail"]
    frames = await server.events(task["id"])
    last = frames[-1][2]
    assert last["type"] == "response.failed" and "error" not in last
    assert last["response"]["status"] == "failed"
    assert last["response"]["error"] == {"code": "agent_error", "message": error["detail"]}


async def test_agent_crash_fails_the_task(server: LmspServer) -> None:
    task = await server.create("/crash boom")
    done = await server.wait(task["id"])
    assert done["status"] == "failed" and done["error"]["code"] == "agent_error"
    # the next task gets a fresh agent
    again = await server.wait((await server.create("after"))["id"])
    assert again["status"] == "succeeded"


async def test_state_walk_queued_loading_running(tmp_path: Path) -> None:
    # the turn waits in the agent until a poll saw 'running' (committed FLUSH_S after
    # the prompt went out, while the turn is still in the agent): a timed turn could be
    # over before that commit or between two polls on a loaded machine
    agent = HeldAgent()
    async with running_lmsp(tmp_path, agent_factory=agent) as server:
        task = await server.create("slow")
        seen = {task["status"]}
        with anyio.fail_after(30):
            while True:
                status = (await server.get(task["id"]))["status"]
                seen.add(status)
                if status == "running" and agent.turns:
                    agent.turns[0].release()
                if status == "succeeded":
                    break
                await anyio.sleep(0.005)
        assert {"queued", "running", "succeeded"} <= seen
        types = [f[1] for f in await server.events(task["id"])]
        assert types[:2] == ["response.created", "response.in_progress"]


async def test_cancel_queued_is_immediate(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path, max_running_tasks=0) as srv:
        task = await srv.create("never runs")
        response = await srv.client.post(f"/lmsp/v1/tasks/{task['id']}/cancel")
        assert response.status_code == 200
        body = response.json()
        assert body["status"] == "cancelled" and body["response"] is None
        frames = await srv.events(task["id"])
        assert [(f[0], f[1]) for f in frames] == [("0", "response.created"),
                                                   ("1", "response.cancelled")]
        assert frames[1][2]["response"] == _response(task, "cancelled")
        again = await srv.client.post(f"/lmsp/v1/tasks/{task['id']}/cancel")
        assert again.status_code == 200 and again.json()["status"] == "cancelled"


async def test_cancel_running_goes_through_cancelling(server: LmspServer) -> None:
    task = await server.create("/sleep 60s slow")   # ended by the cancel, never by itself
    await server.wait(task["id"], {"running"})
    response = await server.client.post(f"/lmsp/v1/tasks/{task['id']}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] in ("cancelling", "cancelled")
    twice = await server.client.post(f"/lmsp/v1/tasks/{task['id']}/cancel")
    assert twice.status_code == 200
    done = await server.wait(task["id"], timeout=30)
    assert done["status"] == "cancelled"
    frames = await server.events(task["id"])
    assert [f[1] for f in frames] == ["response.created", "response.in_progress",
                                      "response.cancelled"]


async def test_cancel_finished_is_409(server: LmspServer) -> None:
    for text, status in (("ok", "succeeded"), ("/fail x", "failed")):
        task = await server.create(text)
        await server.wait(task["id"])
        response = await server.client.post(f"/lmsp/v1/tasks/{task['id']}/cancel")
        assert response.status_code == 409
        assert response.headers["content-type"] == "application/problem+json"
        assert response.headers["x-should-retry"] == "false"
        assert problem_of(response) == {
            "type": "https://lmsp.invalid/problems/task_not_cancelable",
            "title": "Task cannot be cancelled", "status": 409,
            "detail": f"Task {task['id']} already finished with status '{status}'.",
            "instance": f"/lmsp/v1/tasks/{task['id']}/cancel",
            "code": "task_not_cancelable", "task_id": task["id"], "task_status": status}


async def test_unknown_task_is_404_everywhere(server: LmspServer) -> None:
    for method, path in (("GET", ""), ("POST", "/cancel"), ("GET", "/events")):
        response = await server.client.request(method, f"/lmsp/v1/tasks/task_nope{path}")
        assert response.status_code == 404
        assert problem_of(response) == {
            "type": "https://lmsp.invalid/problems/task_not_found", "title": "Task not found",
            "status": 404, "detail": "No task 'task_nope'.",
            "instance": f"/lmsp/v1/tasks/task_nope{path}", "code": "task_not_found",
            "task_id": "task_nope"}


async def test_runner_bounds_concurrency_and_keeps_creation_order(tmp_path: Path) -> None:
    # every turn waits in the agent until the test releases it: the cap is reached (two
    # turns in the agent at once) and not passed (the rest stay queued meanwhile),
    # whatever the machine's load (200 ms turns could each end before the next began)
    agent = HeldAgent()
    async with running_lmsp(tmp_path, max_running_tasks=2, agent_factory=agent) as srv:
        tasks = [await srv.create(f"t{i}") for i in range(5)]
        for n in range(5):
            await agent.arrived(min(n + 2, 5))   # the cap's worth running, or what is left
            running = [turn for turn in agent.turns if not turn.released]
            assert agent.in_flight == len(running) == min(2, 5 - n)
            statuses = [(await srv.get(t["id"]))["status"] for t in tasks]
            assert statuses[n + 2:] == ["queued"] * len(statuses[n + 2:])
            running[0].release()
            await agent.until(lambda: agent.in_flight < len(running))
        for t in tasks:
            assert (await srv.wait(t["id"]))["status"] == "succeeded"
        assert agent.peak == 2
        assert [turn.text for turn in agent.turns] == [f"t{i}" for i in range(5)]
        starts = []
        for t in tasks:
            record = await srv.service.store.get_task(t["id"])
            assert record is not None and record.attempt == 1
            starts.append(record.updated_at)
        frames = [await srv.events(t["id"]) for t in tasks]
        begun = [f[1][2]["response"]["created_at"] for f in frames]
        assert begun == sorted(begun)


async def test_capabilities(server: LmspServer) -> None:
    response = await server.client.get("/lmsp/v1/capabilities")
    assert response.status_code == 200
    assert response.json() == {
        "object": "capabilities", "version": "1.0",
        "capabilities": {"tasks": True, "event_resume": True, "snapshots": False,
                         "idempotency": True,
                         "background": True, "previous_response_id": True},
        "limits": {"event_retention_seconds": 600, "task_retention_seconds": 86400,
                   "idempotency_key_ttl_seconds": 86400, "max_request_bytes": 1048576},
        "models": ["reference"]}


async def test_max_output_tokens_cuts_the_text(server: LmspServer) -> None:
    response = await server.client.post("/lmsp/v1/tasks", json={
        "type": "response", "input": {"model": "reference", "max_output_tokens": 4,
                                      "input": "/sleep 50ms /chunks 6 one two three four five"}})
    task = response.json()
    done = await server.wait(task["id"])
    assert done["status"] == "succeeded"
    result = done["response"]
    assert result["status"] == "incomplete"
    assert result["incomplete_details"] == {"reason": "max_output_tokens"}
    assert result["output"][0]["content"][0]["text"] == "Echo: one two"
    assert result["usage"]["output_tokens"] == 4
    frames = await server.events(task["id"])
    deltas = "".join(f[2]["delta"] for f in frames if f[1] == "response.output_text.delta")
    assert deltas == "Echo: one two" and frames[-1][1] == "response.incomplete"


@pytest.mark.parametrize("text", ["/chunks 3 a b c", "/chunks 150 " + "w " * 150,
                                  "/sleep 120ms /chunks 5 a b c d e"])
async def test_every_delta_once_in_order_whichever_way_the_turn_is_written(
        server: LmspServer, text: str) -> None:
    """A short turn (written in its final commit alone), one past ``FLUSH_EVENTS``
    within ``FLUSH_S`` and one past ``FLUSH_S`` (both committed ``running`` first, the
    runner's writer task): every delta once, in order, the numbers gapless."""
    task = await server.create(text)
    done = await server.wait(task["id"])
    assert done["status"] == "succeeded"
    frames = await server.events(task["id"])
    assert [int(f[0]) for f in frames] == list(range(len(frames)))
    assert [f[1] for f in frames[:2]] == ["response.created", "response.in_progress"]
    assert frames[-1][1] == "response.completed"
    deltas = "".join(f[2]["delta"] for f in frames if f[1] == "response.output_text.delta")
    assert deltas == done["response"]["output"][0]["content"][0]["text"]
