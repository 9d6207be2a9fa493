"""Several named agents behind one bridge: each session runs on the agent it picked."""

from __future__ import annotations

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
