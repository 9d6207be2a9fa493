"""`claude-agent-acp` (npm @zed-industries/claude-agent-acp) behind our server, against
our fake model server's Anthropic Messages shape: a real turn over REST."""

from __future__ import annotations

import shutil

import pytest

from bridge import BridgeOptions
from bridge.agents.stdio import StdioAgentFactory
from tests.bridge.fake_model_server import FakeModelState, build_fake_model_app
from tests.harness import local_server, serving
from tests.npm_agents.test_qwen import agent_text, events, new_session, prompt

pytestmark = [pytest.mark.anyio, pytest.mark.agents]


async def test_plain_turn(tmp_path, claude_entry):
    state = FakeModelState()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    async with serving(build_fake_model_app(state)) as model_url:
        # As root the adapter runs only with IS_SANDBOX exactly "1" (acp.md §4).
        factory = StdioAgentFactory(
            [shutil.which("node") or "node", claude_entry], cwd=str(workspace), name="claude",
            env={"HOME": str(home), "IS_SANDBOX": "1", "ANTHROPIC_API_KEY": "x",
                 "ANTHROPIC_BASE_URL": model_url})
        options = BridgeOptions(initialize_timeout_ms=60_000)
        async with local_server(workspace, options=options, agent_factory=factory,
                                state_dir=tmp_path / "state", timeout=90) as srv:
            client = srv.client
            sid = await new_session(client)
            accepted = await prompt(client, sid, "say hello")
            assert accepted.status_code == 202
            frames = await events(client, sid, accepted.json()["lastEventId"], "turn_complete")
            assert frames[-1][1]["data"]["stopReason"] == "end_turn"
            assert "pong" in agent_text(frames)
            assert any("messages" in r for r in state.requests)
