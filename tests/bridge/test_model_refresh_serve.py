"""A real ``acp-server serve --model-server URL --model-refresh-ms 1`` process: a model
server down at start and up later, and a model added to its listing later, are offered
without a restart, over REST and LMSP (the rate limit itself is tested on an injected
clock: ``tests/bridge/test_model_catalog.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
import pytest
from httpx_sse import aconnect_sse

from tests.bridge.fake_model_server import FakeModelState, build_fake_model_app
from tests.bridge.test_model_upstream_serve import run_turn
from tests.harness import ServeProcess, serving
from tests.harness.process import free_port

pytestmark = pytest.mark.anyio


async def until(call: Callable[[], Awaitable[httpx.Response]],
                done: Callable[[httpx.Response], bool]) -> httpx.Response:
    """Call until ``done`` (each call may list the models again: 1 ms apart at least)."""
    with anyio.fail_after(30):
        while not done(response := await call()):
            pass
    return response


async def lmsp_turn(child: ServeProcess, model: str, text: str) -> dict[str, Any]:
    created = await child.client.post("/lmsp/v1/tasks", json={
        "type": "response", "input": {"model": model, "input": text}})
    assert created.status_code == 202, created.text
    task_id = created.json()["id"]
    with anyio.fail_after(30):   # the task's event stream ends with the task
        async with aconnect_sse(child.client, "GET", f"/lmsp/v1/tasks/{task_id}/events"
                                ) as source:
            async for _sse in source.aiter_sse():
                pass
    task = (await child.client.get(f"/lmsp/v1/tasks/{task_id}")).json()
    return task  # type: ignore[no-any-return]


async def test_a_model_server_down_at_start_is_used_once_it_is_up(tmp_path) -> None:
    port = free_port()
    state = FakeModelState()
    async with ServeProcess(tmp_path, "--model-server", f"http://127.0.0.1:{port}/v1",
                            "--model-refresh-ms", "1") as child:
        agents = (await child.client.get("/capabilities")).json()["agents"]
        assert agents["available"] == ["reference"]
        refused = await child.client.post("/session", json={"agent": "fake-small"})
        assert refused.status_code == 400, refused.text
        assert "cannot list the models of" in child.stderr_text()
        async with serving(build_fake_model_app(state), port=port):
            await until(lambda: child.client.get("/capabilities"),
                        lambda r: "fake-small" in r.json()["agents"]["available"])
            made = await child.client.post("/session", json={"agent": "fake-small",
                                                              "sessionScope": "thread"})
            assert made.status_code == 200, made.text
            kind, data, shown = await run_turn(child, made.json()["sessionId"], "hello")
            assert (kind, shown) == ("turn_complete", "pong: hello"), data
            task = await lmsp_turn(child, "fake-large", "hi there")
            assert task["status"] == "succeeded", task
            assert state.requests[-1]["model"] == "fake-large"
        assert "Traceback" not in child.stderr_text()


async def test_a_model_added_later_is_offered(tmp_path) -> None:
    state = FakeModelState()
    async with serving(build_fake_model_app(state)) as base, \
            ServeProcess(tmp_path, "--model-server", base + "/v1",
                         "--model-refresh-ms", "1") as child:
        state.models.append("fake-new")
        made = await until(lambda: child.client.post("/session", json={
            "agent": "fake-new", "sessionScope": "thread"}),
            lambda r: r.status_code != 400)
        assert made.status_code == 200, made.text
        kind, data, shown = await run_turn(child, made.json()["sessionId"], "hello")
        assert (kind, shown) == ("turn_complete", "pong: hello"), data
        assert state.requests[-1]["model"] == "fake-new"
        state.models.append("fake-newer")
        created = await until(lambda: child.client.post("/lmsp/v1/tasks", json={
            "type": "response", "input": {"model": "fake-newer", "input": "hi"}}),
            lambda r: r.status_code != 404)
        assert created.status_code == 202, created.text
        assert "now also offers: fake-new" in child.stderr_text()
