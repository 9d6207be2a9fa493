"""Several named agents behind one bridge: each session runs on the agent it picked."""

from __future__ import annotations

import anyio
import pytest

from bridge import Bridge
from bridge.agents.reference import ReferenceAgentFactory
from bridge.errors import AgentNotFoundError
from tests.bridge.helpers import text
from tests.bridge.scripted_agent import ScriptedAgent

pytestmark = pytest.mark.anyio


async def test_sessions_pick_their_agent(tmp_path):
    scripted = ScriptedAgent()
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=str(tmp_path),
                      agents={"scripted": scripted}) as bridge:
        assert bridge.agents.names == ["reference", "scripted"]
        ref = await bridge.create_session()
        other = await bridge.create_session(agent="scripted")
        assert (ref.agent, other.agent) == ("reference", "scripted")
        assert (await bridge.send_prompt(other.session_id, text("ok"))).stop_reason == "end_turn"
        assert (await bridge.send_prompt(ref.session_id, text("/max_tokens hi"))).stop_reason == "max_tokens"
        assert scripted.prompts() == ["ok"]
        # single scope: one default session per agent
        a, b = await bridge.attach_session(), await bridge.attach_session(agent="scripted")
        assert a.session_id != b.session_id
        assert (await bridge.attach_session(agent="scripted")).session_id == b.session_id
        with pytest.raises(AgentNotFoundError) as info:
            await bridge.create_session(agent="nope")
        assert info.value.available == ["reference", "scripted"]


async def test_death_of_one_agent_spares_the_others(tmp_path):
    scripted = ScriptedAgent()
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=str(tmp_path),
                      agents={"scripted": scripted}) as bridge:
        ref = await bridge.create_session()
        doomed = await bridge.create_session(agent="scripted")
        scripted.die()
        assert [s.session_id for s in bridge.sessions()] == [ref.session_id]
        assert doomed.session_id not in {s.session_id for s in bridge.sessions()}
        assert (await bridge.send_prompt(ref.session_id, text("still here"))).stop_reason == "end_turn"


async def test_ensure_of_a_running_agent_answers_at_once_and_a_dead_one_restarts(tmp_path):
    """``AgentPool.ensure`` of a live connection takes no lock and never yields: even
    inside a cancelled scope it answers (no checkpoint). A dead one is restarted once,
    under the lock, by concurrent callers."""
    scripted = ScriptedAgent()
    async with Bridge(scripted, workspace_cwd=str(tmp_path)) as bridge:
        first = await bridge.create_session()
        live = await bridge._ensure_agent("scripted")
        with anyio.CancelScope() as scope:
            scope.cancel()
            assert await bridge._ensure_agent("scripted") is live
        assert not scope.cancelled_caught
        scripted.die()
        got = []

        async def ensure() -> None:
            got.append(await bridge._ensure_agent("scripted"))

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(ensure)
        assert len(got) == 3 and not got[0].closed and all(c is got[0] for c in got)
        assert sum(m == "initialize" for m, _ in scripted.calls) == 2
        assert first.agent == "scripted"
