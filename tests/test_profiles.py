"""Agent profiles from flags and a config file, and the serve command running them."""

from __future__ import annotations

import sys

import anyio
import httpx
import pytest

from acp_server.profiles import AgentProfile, ProfileError, load_config, merge, parse_agent_flags
from acp_server.settings import Settings, SettingsError
from tests.bridge.fake_model_server import FakeModelState, build_fake_model_app
from tests.harness import ServeProcess, serving



def test_agent_flags():
    default, named = parse_agent_flags(["reference", "alt=python -m bridge.agents.reference",
                                        "node agent.js --opt=1"])
    assert default == AgentProfile("node", ("node", "agent.js", "--opt=1"))
    assert named == [AgentProfile("alt", ("python", "-m", "bridge.agents.reference"))]
    profiles = merge(default, named)
    assert [p.name for p in profiles] == ["node", "alt", "reference"]
    assert [p.kind for p in profiles] == ["stdio", "stdio", "reference"]
    with pytest.raises(ProfileError, match="Duplicate agent name 'alt'"):
        merge(default, [*named, *named])


def test_config_file(tmp_path):
    config = tmp_path / "acp-server.toml"
    config.write_text('[agents.qwen]\ncommand = ["node", "cli.js", "--acp"]\n'
                      f'env = {{ OPENAI_BASE_URL = "http://127.0.0.1:1/v1" }}\ncwd = "{tmp_path}"\n'
                      '[agents.echo]\ncommand = "python -m bridge.agents.reference"\n')
    profiles = load_config(str(config))
    assert profiles[0] == AgentProfile("qwen", ("node", "cli.js", "--acp"),
                                       (("OPENAI_BASE_URL", "http://127.0.0.1:1/v1"),), str(tmp_path))
    assert profiles[1].command == ("python", "-m", "bridge.agents.reference")
    settings = Settings.from_flags(workspace=str(tmp_path), config=str(config))
    assert list(settings.extra_agents()) == ["qwen", "echo"]
    config.write_text('[agents.bad]\nenv = {}\n')
    with pytest.raises(SettingsError, match="needs a command"):
        Settings.from_flags(workspace=str(tmp_path), config=str(config))


def test_stdio_profile_does_not_inherit_the_token(tmp_path, monkeypatch):
    monkeypatch.setenv("ACP_SERVER_TOKEN", "secret")
    settings = Settings.from_flags(workspace=str(tmp_path), agent=["x=python -m some.agent"])
    factory = settings.extra_agents()["x"]
    assert "ACP_SERVER_TOKEN" in factory.unset_env
    assert "ACP_SERVER_MODEL_API_KEY" in factory.unset_env   # the model server's key too


@pytest.mark.anyio
async def test_serve_with_named_agents_and_a_model_server(tmp_path):
    state = FakeModelState()
    async with serving(build_fake_model_app(state)) as model_url:
        async with ServeProcess(tmp_path, "--agent",
                                f"alt={sys.executable} -m bridge.agents.reference",
                                "--model-server", model_url + "/v1", cwd=tmp_path) as child:
            client = child.client
            caps = (await client.get("/capabilities")).json()
            assert caps["agents"] == {"default": "reference",
                                      "available": ["reference", "alt", "fake-small", "fake-large"]}
            answer = await client.post("/session", json={"agent": "nope"})
            assert answer.status_code == 400 and answer.json()["code"] == "agent_not_found"
            for agent, expected in [("alt", "Echo: hi"), ("fake-small", "pong: hi")]:
                created = (await client.post("/session", json={"agent": agent,
                                                                "sessionScope": "thread"})).json()
                sid = created["sessionId"]
                accepted = (await client.post(f"/session/{sid}/prompt", json={
                    "prompt": [{"type": "text", "text": "hi"}]})).json()
                text = await _reply(client, sid, accepted["lastEventId"])
                assert text == expected
            assert state.requests[-1]["model"] == "fake-small"
        assert child.returncode == 0   # drained on SIGTERM


async def _reply(client: httpx.AsyncClient, sid: str, cursor: int) -> str:
    import json

    from httpx_sse import aconnect_sse

    parts = []
    with anyio.fail_after(10):
        async with aconnect_sse(client, "GET", f"/session/{sid}/events",
                                headers={"Last-Event-ID": str(cursor)}) as source:
            async for sse in source.aiter_sse():
                if sse.event == "session_update":
                    update = json.loads(sse.data)["data"]["update"]
                    if update["sessionUpdate"] == "agent_message_chunk":
                        parts.append(update["content"]["text"])
                elif sse.event == "turn_complete":
                    return "".join(parts)
    return "".join(parts)


def test_a_name_with_a_trailing_newline_is_no_name():
    from acp_server.profiles import parse_agent_flag, profile

    assert parse_agent_flag("alt\n=node agent.js") == (None, "alt\n=node agent.js")
    with pytest.raises(ProfileError, match="Invalid agent name"):
        profile("alt\n", ["node", "agent.js"])
