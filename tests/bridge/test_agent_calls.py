"""``Bridge.agent_state``: the session's state as its agent answered it, with the
setters ``forward``ed since (any door's) recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge import Bridge, BridgeOptions
from bridge.agents.reference import ReferenceAgentFactory
from bridge.errors import AgentError, SessionNotFoundError

pytestmark = pytest.mark.anyio


async def test_agent_state_follows_the_setters(tmp_path: Path) -> None:
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=str(tmp_path),
                      options=BridgeOptions()) as bridge:
        sid = (await bridge.create_session()).session_id
        state = await bridge.agent_state(sid)
        assert "sessionId" not in state
        assert (state["modes"]["currentModeId"], state["models"]["currentModelId"]) == \
            ("default", "reference")
        await bridge.forward(sid, "session/set_mode", {"sessionId": sid, "modeId": "plan"})
        await bridge.forward(sid, "session/set_model",
                             {"sessionId": sid, "modelId": "reference-large"})
        await bridge.forward(sid, "session/set_config_option", {
            "sessionId": sid, "configId": "reasoning_effort", "value": "max"})
        with pytest.raises(AgentError):   # refused: nothing recorded
            await bridge.forward(sid, "session/set_mode", {"sessionId": sid, "modeId": "x"})
        state = await bridge.agent_state(sid)
        assert (state["modes"]["currentModeId"], state["models"]["currentModelId"],
                state["configOptions"][0]["currentValue"]) == ("plan", "reference-large", "max")
        assert [m["id"] for m in state["modes"]["availableModes"]] == \
            ["default", "plan", "auto-edit", "yolo"]
        with pytest.raises(SessionNotFoundError):
            await bridge.agent_state("no-such-session")
