"""The model agent against a model server with a small context window (llama.cpp with
``--ctx-size 4096`` answers 400 ``exceeds the available context size``) and one that
refuses ``stream_options`` (older Azure OpenAI API versions): a conversation over the
context fails with a message that says so and how to fix it, and the prompt that did
not fit is not kept (the session's next, shorter prompt works); ``max_history_chars``
(``--model-history-chars``) keeps a long conversation under the context; a 400 naming
``stream_options`` is answered by sending the turn again without them, and the model
server's other models never send them either."""

from __future__ import annotations

import json

import pytest

from bridge import Bridge
from bridge import events as ev
from bridge.agents.model import ModelAgentFactory, ModelServerState
from bridge.errors import AgentError
from bridge.transcript import transcript
from bridge.wire import envelope
from tests.bridge.helpers import text
from tests.bridge.hostile_model_server import CONTEXT_ERROR, hostile_model_server

pytestmark = pytest.mark.anyio


def _sent(upstream) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return [(m["role"], m["content"]) for m in upstream.requests[-1]["messages"]]


async def test_a_conversation_over_the_context_fails_saying_so(tmp_path) -> None:
    async with hostile_model_server() as upstream:
        upstream.context_chars = 300
        async with Bridge(ModelAgentFactory(upstream.url, model="m-one"),
                          workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            await bridge.send_prompt(sid, text("a" * 100))   # + "pong: aaa…": 206 in all
            with pytest.raises(AgentError) as caught:
                await bridge.send_prompt(sid, text("b" * 100))
            assert caught.value.message == (
                f"Model server {upstream.url} answered 400: {CONTEXT_ERROR} (type "
                f"exceed_context_size_error, code 400): the conversation (306 characters) "
                f"exceeds the model's context window. Start a new session, or have fewer of "
                f"its newest characters sent (--model-history-chars, now 16777216)")
            assert caught.value.data == {"errorKind": "context_length_exceeded"}
            result = await bridge.send_prompt(sid, text("c"))   # "b…" is not sent again
            assert result.stop_reason == "end_turn", upstream.seen
            assert _sent(upstream) == [("user", "a" * 100), ("assistant", "pong: " + "a" * 100),
                                       ("user", "c")]
            assert upstream.seen == ["normal", "context_refused", "normal"]
            # the turn's error says so on the wire too, and a restored agent's transcript
            # (the journal's events) leaves the prompt out, as the live agent did
            ring = bridge._sessions[sid].bus.ring_events()
            failed = next(e for e in ring if e.type == ev.TURN_ERROR)
            assert json.loads(envelope(failed))["data"]["errorKind"] == \
                "context_length_exceeded"
            assert [(m["role"], m["text"][:7]) for m in transcript(ring)] == [
                ("user", "a" * 7), ("agent", "pong: a"), ("user", "c"), ("agent", "pong: c")]


async def test_max_history_chars_keeps_a_long_conversation_under_the_context(tmp_path) -> None:
    async with hostile_model_server() as upstream:
        upstream.context_chars = 300
        upstream.strict_roles = True
        factory = ModelAgentFactory(upstream.url, model="m-one", max_history_chars=250)
        async with Bridge(factory, workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            for letter in "abcdef":
                result = await bridge.send_prompt(sid, text(letter * 60))
                assert result.stop_reason == "end_turn", upstream.seen
            assert _sent(upstream) == [("user", "e" * 60), ("assistant", "pong: " + "e" * 60),
                                       ("user", "f" * 60)]
            assert set(upstream.seen) == {"normal"}


@pytest.mark.parametrize("named_in", [True, "param"])
async def test_a_refused_stream_options_is_sent_again_without_them(
        tmp_path, named_in: bool | str) -> None:
    """Named in the error's message, or only in its ``param`` (a generic message)."""
    async with hostile_model_server() as upstream:
        upstream.refuse_stream_options = named_in
        shared = ModelServerState()
        one = ModelAgentFactory(upstream.url, model="m-one", upstream=shared)
        two = ModelAgentFactory(upstream.url, model="m-two", upstream=shared)
        async with Bridge(one, agents={"m-two": two}, workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            result = await bridge.send_prompt(sid, text("hello"))
            assert result.stop_reason == "end_turn", upstream.seen
            assert upstream.seen == ["stream_options_refused", "normal"]
            other = (await bridge.create_session(agent="m-two")).session_id
            assert (await bridge.send_prompt(other, text("hi"))).stop_reason == "end_turn"
            assert [("stream_options" in r) for r in upstream.requests] == [True, False, False]
            assert upstream.seen == ["stream_options_refused", "normal", "normal"]


async def test_stream_options_are_sent_to_a_server_that_takes_them(tmp_path) -> None:
    async with hostile_model_server() as upstream:
        async with Bridge(ModelAgentFactory(upstream.url, model="m-one"),
                          workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            result = await bridge.send_prompt(sid, text("hello"))
            assert result.response["usage"]["totalTokens"] == 8
            assert upstream.requests[-1]["stream_options"] == {"include_usage": True}
