"""A real ``acp-server serve --model-server URL`` process with the model server's API key
from the environment (``--model-api-key-env NAME``, else ``ACP_SERVER_MODEL_API_KEY``:
never a flag, which ``ps`` shows), sent as ``Authorization: Bearer`` to ``/models`` and
the completions and never logged; ``--model-history-chars`` keeps a conversation under a
small context window (a llama.cpp ``--ctx-size``), and without it the turn over the
context ends with a ``turn_error`` that says so."""

from __future__ import annotations

import pytest

from acp_server.settings import Settings, SettingsError
from tests.bridge.hostile_model_server import hostile_model_server
from tests.bridge.test_model_upstream_serve import run_turn
from tests.harness import ServeProcess

pytestmark = pytest.mark.anyio

KEY = "sk-test-s3cret-key"


async def test_the_api_key_and_the_history_bound_reach_the_model_server(tmp_path) -> None:
    async with hostile_model_server() as upstream:
        upstream.context_chars = 300
        upstream.strict_roles = True
        async with ServeProcess(tmp_path, "--model-server", upstream.url,
                                "--model-api-key-env", "MY_MODEL_KEY",
                                "--model-history-chars", "250",
                                env={"MY_MODEL_KEY": KEY}) as child:
            sid = (await child.client.post("/session", json={"agent": "m-one"})).json()["sessionId"]
            for letter in "abcd":
                kind, data, shown = await run_turn(child, sid, letter * 60)
                assert (kind, shown) == ("turn_complete", "pong: " + letter * 60), data
            log = child.stderr_text()
        assert set(upstream.seen) == {"models:ok", "normal"}
        assert len(upstream.requests[-1]["messages"]) == 3   # the newest 250 characters
        assert upstream.authorizations == [f"Bearer {KEY}"] * 5   # /models, 4 turns
        assert KEY not in log


async def test_a_turn_over_the_context_says_how_to_go_on(tmp_path) -> None:
    async with hostile_model_server() as upstream:
        upstream.context_chars = 300
        async with ServeProcess(tmp_path, "--model-server", upstream.url,
                                env={"ACP_SERVER_MODEL_API_KEY": KEY}) as child:
            sid = (await child.client.post("/session", json={"agent": "m-one"})).json()["sessionId"]
            kind, data, _shown = await run_turn(child, sid, "a" * 400)
            assert kind == "turn_error"
            assert data["message"].endswith(
                "the conversation (400 characters) exceeds the model's context window. Start "
                "a new session, or have fewer of its newest characters sent "
                "(--model-history-chars, now 16777216)"), data
            kind, data, shown = await run_turn(child, sid, "short")   # the long one is gone
            assert (kind, shown) == ("turn_complete", "pong: short"), data
        assert upstream.authorizations == [f"Bearer {KEY}"] * 3


def test_the_api_key_comes_from_the_environment_only(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("ACP_SERVER_MODEL_API_KEY", raising=False)
    assert Settings.from_flags(workspace=str(tmp_path)).model_api_key is None
    with pytest.raises(SettingsError, match="MISSING_KEY is not set or empty"):
        Settings.from_flags(workspace=str(tmp_path), model_api_key_env="MISSING_KEY")
    with pytest.raises(SettingsError, match="name an environment variable") as caught:
        Settings.from_flags(workspace=str(tmp_path), model_api_key_env="sk-abc123")
    assert "sk-abc123" not in str(caught.value)   # a key given by mistake is not echoed
    monkeypatch.setenv("ACP_SERVER_MODEL_API_KEY", KEY)
    settings = Settings.from_flags(workspace=str(tmp_path), model_history_chars="1000")
    assert (settings.model_api_key, settings.model_history_chars) == (KEY, 1000)
    assert KEY not in repr(settings)
    with pytest.raises(SettingsError, match="model-history-chars"):
        Settings.from_flags(workspace=str(tmp_path), model_history_chars="0")


@pytest.mark.parametrize("key", ["sk-two\nlines", "sk-\r\nX-Evil: 1", "sk-clé"])
@pytest.mark.parametrize("env", [None, "OPENAI_API_KEY"])
def test_a_key_no_header_can_carry_is_refused_without_showing_it(
        tmp_path, monkeypatch, key: str, env: str | None) -> None:
    """Sent, httpx's refusal quoted the header (``Illegal header value b'Bearer …'``) in
    the log, every turn's error and the journal; a non-ASCII one failed every listing."""
    monkeypatch.setenv(env or "ACP_SERVER_MODEL_API_KEY", key)
    with pytest.raises(SettingsError, match="no Authorization header can carry it") as caught:
        Settings.from_flags(workspace=str(tmp_path), model_api_key_env=env)
    assert key not in str(caught.value) and "sk-" not in str(caught.value)
