"""The model agent against a fake OpenAI-compatible server on a loopback port."""

from __future__ import annotations

import anyio
import pytest

from bridge import Bridge
from bridge.agents.model import ModelAgentFactory, discover_models
from bridge.errors import AgentError
from tests.bridge.fake_model_server import FakeModelState, build_fake_model_app
from tests.bridge.helpers import drain, envelope, text, wait_until
from tests.harness import serving

pytestmark = pytest.mark.anyio


async def test_streams_in_order_keeps_history_and_usage(tmp_path):
    state = FakeModelState()
    async with serving(build_fake_model_app(state)) as url:
        assert await discover_models(url + "/v1") == ["fake-small", "fake-large"]
        factory = ModelAgentFactory(url + "/v1", model="fake-small")
        async with Bridge(factory, workspace_cwd=str(tmp_path)) as bridge:
            assert bridge.agents.names == ["fake-small"]
            sid = (await bridge.create_session()).session_id
            sub = bridge.subscribe(sid)
            result = await bridge.send_prompt(sid, text("hello there"))
            assert result.stop_reason == "end_turn"
            assert result.response["usage"] == {"inputTokens": 7, "outputTokens": 3, "totalTokens": 10}
            updates = [envelope(f).data["update"] for f in drain(sub) if f.type == "session_update"]
            chunks = [u["content"]["text"] for u in updates if u["sessionUpdate"] == "agent_message_chunk"]
            assert len(chunks) == 3 and "".join(chunks) == "pong: hello there"
            assert updates[-1]["sessionUpdate"] == "usage_update"
            await bridge.send_prompt(sid, text("again"))
            assert state.requests[-1]["model"] == "fake-small"
            assert [m["role"] for m in state.requests[-1]["messages"]] == ["user", "assistant", "user"]
            assert state.requests[-1]["messages"][1]["content"] == "pong: hello there"


async def test_length_maps_to_max_tokens_and_errors_are_clear(tmp_path):
    state = FakeModelState()
    async with serving(build_fake_model_app(state)) as url:
        async with Bridge(ModelAgentFactory(url + "/v1", model="fake-small"),
                          workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            assert (await bridge.send_prompt(sid, text("LENGTH please"))).stop_reason == "max_tokens"
            with pytest.raises(AgentError, match="answered 500"):
                await bridge.send_prompt(sid, text("ERROR now"))
            assert (await bridge.send_prompt(sid, text("fine"))).stop_reason == "end_turn"


async def test_cancel_closes_the_upstream_stream(tmp_path):
    state = FakeModelState()
    async with serving(build_fake_model_app(state)) as url:
        async with Bridge(ModelAgentFactory(url + "/v1", model="fake-small"),
                          workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            ticket = bridge.send_prompt(sid, text("SLOW story"))
            await wait_until(lambda: len(state.requests) == 1)
            await anyio.sleep(0.25)
            await bridge.cancel_session(sid)
            with anyio.fail_after(30):
                assert (await ticket).stop_reason == "cancelled"
            await wait_until(lambda: state.closed_early == 1, timeout=30)
            assert state.finished == 0


async def test_unreachable_server_is_a_clear_turn_error(tmp_path):
    factory = ModelAgentFactory("http://127.0.0.1:9/v1", model="nothing", timeout_s=2)
    async with Bridge(factory, workspace_cwd=str(tmp_path)) as bridge:
        sid = (await bridge.create_session()).session_id
        with pytest.raises(AgentError) as caught:
            await bridge.send_prompt(sid, text("hi"))
        # as docs/agents.md shows it: the cause after a colon, not in parentheses
        assert caught.value.message.startswith(
            "Cannot reach model server http://127.0.0.1:9/v1: ConnectError: "), caught.value
