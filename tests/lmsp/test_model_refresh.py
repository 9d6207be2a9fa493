"""``--model-server``'s models listed again while the server runs, seen through the
doors of one in-process server (real HTTP on loopback, the fake OpenAI-compatible
model server, the refresh clock injected: ``models_clock``): LMSP's models, a task
naming a model listed since, REST's and LMSP's capabilities, REST ``POST /session``
and ``/acp`` ``session/new``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acp_http.server import RunningAcpServer, request
from tests.bridge.fake_model_server import FakeModelState, build_fake_model_app
from tests.bridge.test_model_catalog import Clock
from tests.harness import local_server, serving
from tests.lmsp.server import LmspServer

pytestmark = pytest.mark.anyio


class Served(LmspServer, RunningAcpServer):
    """The LMSP helpers and the ``/acp`` ones on one server."""


def task(model: str, text: str = "hello") -> dict[str, object]:
    return {"type": "response", "input": {"model": model, "input": text}}


async def test_a_model_listed_later_is_a_model_and_an_agent(tmp_path: Path) -> None:
    state = FakeModelState()
    clock = Clock()
    async with serving(build_fake_model_app(state)) as base, \
            local_server(tmp_path, kind=Served, model_server=base + "/v1",
                         models_clock=clock) as srv:
        client = srv.client
        caps = (await client.get("/lmsp/v1/capabilities")).json()
        assert caps["models"] == ["fake-large", "fake-small", "reference"]
        state.models.append("fake-new")
        refused = await client.post("/lmsp/v1/tasks", json=task("fake-new"))
        assert refused.status_code == 404 and refused.json()["code"] == "model_not_found"
        assert state.models_asked == 1   # within the interval: not listed again

        clock.now += 30   # a task naming it lists again: it runs on the new model
        created = await client.post("/lmsp/v1/tasks", json=task("fake-new"))
        assert created.status_code == 202, created.text
        done = await srv.wait(created.json()["id"])
        assert done["status"] == "succeeded" and state.requests[-1]["model"] == "fake-new"
        assert state.models_asked == 2

        state.models.append("fake-newer")   # a listing read lists again
        clock.now += 30
        caps = (await client.get("/lmsp/v1/capabilities")).json()
        assert "fake-newer" in caps["models"]
        state.models.append("fake-third")
        clock.now += 30
        agents = (await client.get("/capabilities")).json()["agents"]
        assert agents["available"] == ["reference", "fake-small", "fake-large", "fake-new",
                                       "fake-newer", "fake-third"]
        state.models.append("fake-fourth")
        clock.now += 30
        status = (await client.get("/daemon/status")).json()
        assert "fake-fourth" in [a["name"] for a in status["agents"]]

        state.models.append("fake-rest")   # REST POST /session naming it
        clock.now += 30
        made = await client.post("/session", json={"agent": "fake-rest",
                                                   "sessionScope": "thread"})
        assert made.status_code == 200, made.text
        assert state.models_asked == 6

        unknown = await client.post("/session", json={"agent": "no-such-model"})
        assert unknown.status_code == 400, unknown.text   # within the interval: refused
        assert state.models_asked == 6

        state.models.append("fake-acp")   # /acp session/new naming it
        clock.now += 30
        conn_id, _init = await srv.initialize()
        async with srv.stream(conn_id) as conn_stream:
            await srv.post(conn_id, request(2, "session/new", {
                "cwd": srv.workspace, "mcpServers": [],
                "_meta": {"acp-server/agent": "fake-acp"}}))
            reply = await conn_stream.wait_for_id(2)
        assert "sessionId" in reply["result"], reply
        assert state.models_asked == 7
