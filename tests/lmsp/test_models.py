"""``model`` → agent: the bridge's agents by name, plus what the composition maps (§6.1;
``acp_server.cli`` always configures ``reference``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio

import pytest

from acp_server.lmsp import open_lmsp
from acp_server.lmsp.requests import parse_task_envelope
from acp_server.lmsp.service import bridge_models
from acp_server.principals import LOCAL_CALLER
from bridge import Bridge
from bridge.agents.reference import ReferenceAgentFactory

pytestmark = pytest.mark.anyio


class Renamed(ReferenceAgentFactory):
    name = "house-agent"


async def _run(service: object, model: str) -> str:
    body = {"type": "response", "input": {"model": model, "input": "hi"}}
    parsed = parse_task_envelope(body)
    record, _ = await service.create_task(parsed.request, on_restart="fail",  # type: ignore
                                          key=None, route="t", caller=LOCAL_CALLER)
    return (await service.wait_terminal(record.id)).status  # type: ignore


async def test_every_bridge_agent_is_a_model_and_composed_models_join_them() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with Bridge(Renamed(), workspace_cwd=tmp,
                          agents={"second": ReferenceAgentFactory()}) as bridge, \
                Bridge(ReferenceAgentFactory(), workspace_cwd=tmp) as private, \
                open_lmsp(bridge, state_dir=tmp, models={
                    **bridge_models(bridge), "reference": (private, None)}) as service:
            assert service.capabilities().models == ["house-agent", "reference", "second"]
            assert service.models["reference"][0] is not bridge   # a private reference bridge
            for model in ("house-agent", "second", "reference"):
                assert await _run(service, model) == "succeeded"


class SlowStart(ReferenceAgentFactory):
    """Starts once the test opens ``gate``: the task stays ``loading`` until then."""

    name = "slow"

    def __init__(self) -> None:
        super().__init__()
        self.gate = anyio.Event()

    async def connect(self, client: object, task_group: object) -> object:
        await self.gate.wait()
        return await super().connect(client, task_group)  # type: ignore[arg-type]


class Broken(ReferenceAgentFactory):
    name = "broken"

    async def connect(self, client: object, task_group: object) -> object:
        raise RuntimeError("cannot start the agent")


async def test_loading_then_failed_when_the_agent_cannot_start(tmp_path: Path) -> None:
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=str(tmp_path),
                      agents={"broken": Broken(), "slow": SlowStart()}) as bridge, \
            open_lmsp(bridge, state_dir=str(tmp_path)) as service:
        body = {"type": "response", "input": {"model": "broken", "input": "hi"}}
        parsed = parse_task_envelope(body)
        record, _ = await service.create_task(parsed.request, on_restart="fail",
                                              key=None, route="t", caller=LOCAL_CALLER)
        done = await service.wait_terminal(record.id)
        assert done.status == "failed" and b'"code":"agent_error"' in (done.error or b"")
        events = await service.store.read_events(record.id, -1, 10)
        assert [e.type for e in events] == ["response.created", "response.failed"]


async def test_cancel_while_loading(tmp_path: Path) -> None:
    slow = SlowStart()
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=str(tmp_path),
                      agents={"slow": slow}) as bridge, \
            open_lmsp(bridge, state_dir=str(tmp_path)) as service:
        body = {"type": "response", "input": {"model": "slow", "input": "hi"}}
        parsed = parse_task_envelope(body)
        record, _ = await service.create_task(parsed.request, on_restart="fail",
                                              key=None, route="t", caller=LOCAL_CALLER)
        with anyio.fail_after(30):
            while (await service.get_task(record.id)).status != "loading":
                await anyio.sleep(0.01)
        cancelling = await service.cancel(record.id)
        assert cancelling.status == "cancelling"
        slow.gate.set()
        done = await service.wait_terminal(record.id)
        assert done.status == "cancelled"
        events = await service.store.read_events(record.id, -1, 10)
        assert [e.type for e in events] == ["response.created", "response.cancelled"]
