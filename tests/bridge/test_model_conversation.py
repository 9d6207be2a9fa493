"""What the model agent sends upstream as a session's conversation: roles that
alternate user/assistant starting with a user message, whatever happened to the turns
before (a fault, a cancel before the first word, a reply with no text, a trimmed or
restored history). Chat templates such as Gemma's or Mistral's refuse anything else,
and vLLM and llama.cpp then answer 400 to every later prompt of the session
(``hostile_model_server(strict_roles)`` does the same)."""

from __future__ import annotations

import anyio
import pytest

from bridge import Bridge, BridgeOptions
from bridge.agents.model import ModelAgentFactory
from bridge.errors import AgentError
from bridge.transcript import TRANSCRIPT_META
from tests.bridge.fake_agent_client import FakeClient
from tests.bridge.helpers import drain, envelope, text, wait_until
from tests.bridge.hostile_model_server import hostile_model_server

pytestmark = pytest.mark.anyio


def _sent(upstream) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return [(m["role"], m["content"]) for m in upstream.requests[-1]["messages"]]


async def test_a_prompt_without_a_reply_is_joined_to_the_next(tmp_path) -> None:
    async with hostile_model_server() as upstream:
        upstream.strict_roles = True
        async with Bridge(ModelAgentFactory(upstream.url, model="m-one"),
                          workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            with pytest.raises(AgentError, match="answered 429"):
                await bridge.send_prompt(sid, text("RATE_LIMITED first"))
            ticket = bridge.send_prompt(sid, text("STALL_HEADERS"))   # cancelled: no word
            await wait_until(lambda: upstream.stalled == ["STALL_HEADERS"])
            await bridge.cancel_session(sid)
            with anyio.fail_after(30):   # a bound against a hang
                assert (await ticket).stop_reason == "cancelled"
            result = await bridge.send_prompt(sid, text("hello"))
            assert result.stop_reason == "end_turn", upstream.seen
            assert _sent(upstream) == [("user", "RATE_LIMITED first\n\nSTALL_HEADERS\n\nhello")]
            await bridge.send_prompt(sid, text("again"))
            assert [role for role, _ in _sent(upstream)] == ["user", "assistant", "user"]
            assert "roles_refused" not in upstream.seen


async def test_a_trimmed_history_starts_with_a_user_message(tmp_path) -> None:
    async with hostile_model_server() as upstream:
        upstream.strict_roles = True
        factory = ModelAgentFactory(upstream.url, model="m-one", max_history_chars=100)
        async with Bridge(factory, workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            await bridge.send_prompt(sid, text("a" * 60))   # its 66-character reply stays
            result = await bridge.send_prompt(sid, text("b"))
            assert result.stop_reason == "end_turn", upstream.seen
            assert _sent(upstream) == [("user", "b")]


async def test_a_restored_transcript_is_sent_alternating(tmp_path) -> None:
    async with hostile_model_server() as upstream, anyio.create_task_group() as tg:
        upstream.strict_roles = True
        connection = await ModelAgentFactory(upstream.url, model="m-one").connect(
            FakeClient(root=tmp_path), tg)
        seed = [{"role": "agent", "text": "a greeting replayed"},
                {"role": "user", "text": "one"}, {"role": "user", "text": "two"},
                {"role": "agent", "text": "first part"}, {"role": "agent", "text": "second"}]
        created = await connection.request("session/new", {
            "cwd": str(tmp_path), "mcpServers": [], "_meta": {TRANSCRIPT_META: seed}})
        result = await connection.request("session/prompt", {
            "sessionId": created["sessionId"], "prompt": text("three")})
        assert result["stopReason"] == "end_turn", upstream.seen
        assert _sent(upstream) == [("user", "one\n\ntwo"),
                                   ("assistant", "first part\n\nsecond"), ("user", "three")]
        await connection.aclose()


async def test_every_session_of_a_model_streams_at_once_past_a_hundred(tmp_path) -> None:
    """Each session has at most one turn, so the connections to the model server are
    bounded by the sessions (``--max-sessions``); the HTTP client's own pool of 100 held
    the 101st turn back (to fail after the read timeout with a ``PoolTimeout``) while the
    model server would have taken it."""
    count = 110
    async with hostile_model_server() as upstream:
        async with Bridge(ModelAgentFactory(upstream.url, model="m-one"),
                          workspace_cwd=str(tmp_path),
                          options=BridgeOptions(max_sessions=count)) as bridge:
            sids = [(await bridge.create_session()).session_id for _ in range(count)]
            tickets = [bridge.send_prompt(sid, text("STALL_HEADERS")) for sid in sids]
            await wait_until(lambda: len(upstream.stalled) == count)
            for sid in sids:
                await bridge.cancel_session(sid)
            with anyio.fail_after(30):   # a bound against a hang
                for ticket in tickets:
                    assert (await ticket).stop_reason == "cancelled"
            await wait_until(lambda: len(upstream.cut_off) == count)


async def test_a_thinking_models_reasoning_is_shown_as_thoughts_not_kept(tmp_path) -> None:
    async with hostile_model_server() as upstream:
        async with Bridge(ModelAgentFactory(upstream.url, model="m-one"),
                          workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            sub = bridge.subscribe(sid)
            result = await bridge.send_prompt(sid, text("REASONING please"))
            assert result.stop_reason == "end_turn"
            updates = [envelope(f).data["update"] for f in drain(sub)
                       if f.type == "session_update"]
            shown = [(u["sessionUpdate"], u["content"]["text"]) for u in updates
                     if u["sessionUpdate"] in ("agent_thought_chunk", "agent_message_chunk")]
            assert shown == [("agent_thought_chunk", "Let me think. "),
                             ("agent_thought_chunk", "Still thinking."),
                             ("agent_message_chunk", "the answer")]
            await bridge.send_prompt(sid, text("next"))
            assert _sent(upstream) == [("user", "REASONING please"),
                                       ("assistant", "the answer"), ("user", "next")]
            drain(sub)
            await bridge.send_prompt(sid, text("WHOLE please"))   # a whole completion
            assert [(u["sessionUpdate"], u["content"]["text"]) for u in (
                envelope(f).data["update"] for f in drain(sub) if f.type == "session_update")
                if u["sessionUpdate"] in ("agent_thought_chunk", "agent_message_chunk")] == [
                ("agent_thought_chunk", "thought through"),
                ("agent_message_chunk", "a whole answer")]


async def test_an_emoji_split_in_surrogate_halves_is_joined(tmp_path) -> None:
    """JSON may escape a character outside the BMP as two UTF-16 surrogates; a server
    that cuts its text by UTF-16 units sends them in two chunks. The turn failed ("not
    a chat.completion.chunk (Input data was truncated)"); the halves are now one
    character, and a surrogate alone is U+FFFD."""
    async with hostile_model_server() as upstream:
        async with Bridge(ModelAgentFactory(upstream.url, model="m-one"),
                          workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            sub = bridge.subscribe(sid)
            result = await bridge.send_prompt(sid, text("SPLIT_EMOJI please"))
            assert result.stop_reason == "end_turn"
            shown = "".join(u["content"]["text"] for u in (
                envelope(f).data["update"] for f in drain(sub) if f.type == "session_update")
                if u["sessionUpdate"] == "agent_message_chunk")
            assert shown == "smile \U0001f600 then lone \ufffd"
            await bridge.send_prompt(sid, text("next"))
            assert _sent(upstream)[1] == ("assistant", shown)


async def test_an_error_with_a_surrogate_half_is_a_clean_turn_error(tmp_path) -> None:
    async with hostile_model_server() as upstream:
        async with Bridge(ModelAgentFactory(upstream.url, model="m-one"),
                          workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            sub = bridge.subscribe(sid)
            with pytest.raises(AgentError, match="reported an error: bad \ufffd thing"):
                await bridge.send_prompt(sid, text("SURROGATE_ERROR please"))
            assert [f.type for f in drain(sub)][-1] == "turn_error"
            assert (await bridge.send_prompt(sid, text("next"))).stop_reason == "end_turn"


async def test_a_resource_link_reaches_the_model_as_a_link(tmp_path) -> None:
    """ACP requires every agent to take ``resource_link`` blocks; the model agent
    dropped them (a prompt of only a link sent the model an empty message)."""
    async with hostile_model_server() as upstream:
        async with Bridge(ModelAgentFactory(upstream.url, model="m-one"),
                          workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            await bridge.send_prompt(sid, [
                {"type": "text", "text": "look at"},
                {"type": "resource_link", "uri": "file:///w/a.py", "name": "a.py"},
                {"type": "resource_link", "uri": "https://example.com/spec"}])
            assert _sent(upstream) == [
                ("user", "look at\n[a.py](file:///w/a.py)\n"
                         "[https://example.com/spec](https://example.com/spec)")]


@pytest.mark.parametrize(("behaviour", "usage"), [
    ("NULL_USAGE", {"inputTokens": 0, "outputTokens": 2, "totalTokens": 2}),
    ("OTHER_USAGE", {"inputTokens": 11, "outputTokens": 5, "totalTokens": 16}),
    ("NULL_CHOICES", {"inputTokens": 3, "outputTokens": 1, "totalTokens": 4}),
])
async def test_usage_of_another_shape_never_fails_the_turn(tmp_path, behaviour: str,
                                                          usage: dict[str, int]) -> None:
    """Counts given as null, or the usage chunk's ``choices`` as null, made the turn
    fail after its whole reply was shown (``Expected `int`, got `null```); counts named
    ``input_tokens``/``output_tokens`` were taken as 0."""
    async with hostile_model_server() as upstream:
        async with Bridge(ModelAgentFactory(upstream.url, model="m-one"),
                          workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            result = await bridge.send_prompt(sid, text(f"{behaviour} please"))
            assert (result.stop_reason, result.response["usage"]) == ("end_turn", usage)
