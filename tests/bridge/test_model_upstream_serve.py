"""A real ``acp-server serve --model-server <hostile upstream>`` process over REST: an
upstream fault ends the turn with ``turn_error`` carrying the cause, the server stays up
and the next prompt works; a ``/models`` that cannot be listed leaves the server
starting with one clear log line (no traceback)."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from httpx_sse import aconnect_sse

from tests.bridge.helpers import wait_until
from tests.bridge.hostile_model_server import hostile_model_server, refused_url
from tests.harness import ServeProcess

pytestmark = pytest.mark.anyio


async def run_turn(child: ServeProcess, sid: str, prompt: str, *,
                   meanwhile: Callable[[], Awaitable[Any]] | None = None,
                   ) -> tuple[str, dict[str, Any], str]:
    """(``turn_complete`` or ``turn_error``, its envelope's data, the text of the turn's
    chunks); ``meanwhile`` runs once the prompt was accepted."""
    posted = await child.client.post(f"/session/{sid}/prompt",
                                     json={"prompt": [{"type": "text", "text": prompt}]})
    assert posted.status_code == 202, posted.text
    accepted = posted.json()
    if meanwhile is not None:
        await meanwhile()
    shown = []
    with anyio.fail_after(60):   # a bound against a hang
        async with aconnect_sse(child.client, "GET", f"/session/{sid}/events",
                                headers={"Last-Event-ID": str(accepted["lastEventId"])}) as source:
            async for sse in source.aiter_sse():
                if not sse.data:
                    continue
                data = json.loads(sse.data)["data"]
                update = data.get("update")
                if isinstance(update, dict) and update.get("sessionUpdate") == "agent_message_chunk":
                    shown.append(update["content"]["text"])
                if sse.event in ("turn_complete", "turn_error") \
                        and data.get("promptId") == accepted["promptId"]:
                    return sse.event, data, "".join(shown)
    raise AssertionError("the event stream ended before the turn did")


FAULTS = [
    ("ENDLESS_LINE", "sent an SSE line or event over 4 MiB"),
    ("GZIP_BOMB", "sent an SSE line or event over 4 MiB"),
    ("STREAM_ERROR", "reported an error: The upstream model crashed (type server_error, "
                     "code model_crashed)"),
    ("ENDLESS_ERROR", "answered 500: upstream trouble: zzz"),
    ("HTML", "answered 200 with Content-Type 'text/html', not an event stream"),
    ("RATE_LIMITED", "answered 429 (Retry-After: 30): Rate limit reached for requests"),
    ("RESET", "broke off the reply"),
]


async def test_upstream_faults_are_turn_errors_and_the_server_keeps_serving(tmp_path) -> None:
    async with hostile_model_server() as upstream, \
            ServeProcess(tmp_path, "--model-server", upstream.url) as child:
        agents = (await child.client.get("/capabilities")).json()["agents"]
        assert agents["available"] == ["reference", "m-one", "m-two"]
        created = await child.client.post("/session", json={"agent": "m-one"})
        assert created.status_code in (200, 201), created.text
        sid = created.json()["sessionId"]
        for behaviour, cause in FAULTS:
            kind, data, _shown = await run_turn(child, sid, f"{behaviour} please")
            assert kind == "turn_error", (behaviour, data)
            message = data["message"]
            assert message.startswith(f"Model server {upstream.url} ") and cause in message, \
                (behaviour, message)
            assert len(message) < 800   # the error body was cut, not quoted whole
        kind, data, shown = await run_turn(child, sid, "ENDLESS_REPLY please")
        assert (kind, data["stopReason"]) == ("turn_complete", "max_tokens")
        assert 0 < len(shown.encode()) <= 4 * 1024 * 1024

        async def cancel_when_stalled() -> None:
            await wait_until(lambda: upstream.stalled == ["STALL_HEADERS"], timeout=30)
            cancelled = await child.client.post(f"/session/{sid}/cancel")
            assert cancelled.status_code == 204, cancelled.text

        kind, data, _shown = await run_turn(child, sid, "STALL_HEADERS",
                                            meanwhile=cancel_when_stalled)
        assert (kind, data["stopReason"]) == ("turn_complete", "cancelled")
        kind, data, shown = await run_turn(child, sid, "all good again")
        assert (kind, data["stopReason"], shown) == ("turn_complete", "end_turn",
                                                     "pong: all good again")
        assert child.returncode is None
        assert upstream.exhausted == []
        await wait_until(lambda: "STALL_HEADERS" in upstream.cut_off, timeout=30)
        assert sorted(upstream.cut_off) == sorted(["ENDLESS_LINE", "GZIP_BOMB", "ENDLESS_ERROR",
                                                   "RESET", "ENDLESS_REPLY", "STALL_HEADERS"])
        assert "Traceback" not in child.stderr_text()


@pytest.mark.parametrize("mode", ["html", "wrong_types", "missing", "refused"])
async def test_serve_starts_when_the_models_cannot_be_listed(tmp_path, mode: str) -> None:
    async with hostile_model_server() as upstream:
        upstream.models_mode = mode
        url = refused_url() if mode == "refused" else upstream.url
        async with ServeProcess(tmp_path, "--model-server", url) as child:
            agents = (await child.client.get("/capabilities")).json()["agents"]
            assert agents["available"] == ["reference"]
            log = child.stderr_text()
            assert f"cannot list the models of {url}: " in log
            assert "Traceback" not in log
        expected = {"html": "not JSON", "wrong_types": "unknown shape",
                    "missing": "answered 404 at /models", "refused": "cannot be reached"}[mode]
        assert expected in log


async def test_a_model_named_like_a_configured_agent_is_not_offered(tmp_path) -> None:
    async with hostile_model_server() as upstream, \
            ServeProcess(tmp_path, "--agent", f"m-one={sys.executable} -m bridge.agents.reference",
                         "--model-server", upstream.url) as child:
        agents = (await child.client.get("/capabilities")).json()["agents"]
        assert agents["available"] == ["reference", "m-one", "m-two"]
        sid = (await child.client.post("/session", json={"agent": "m-one"})).json()["sessionId"]
        kind, _data, shown = await run_turn(child, sid, "hi")
        assert (kind, shown) == ("turn_complete", "Echo: hi")   # the configured agent
        assert upstream.requests == []
        log = child.stderr_text()
        assert f"model server {upstream.url}: not offering m-one: an agent configured by " \
               f"name has it" in log
        assert "Traceback" not in log


async def test_credentials_in_the_model_server_url_are_sent_never_shown(tmp_path) -> None:
    """``--model-server http://user:password@host/v1`` (a proxy behind basic auth): the
    credentials go to the model server, never into a turn's error (every reader of the
    session sees it) nor the log."""
    async with hostile_model_server() as upstream:
        url = upstream.url.replace("http://", "http://alice:s3cret@")
        async with ServeProcess(tmp_path, "--model-server", url) as child:
            sid = (await child.client.post("/session", json={"agent": "m-one"})).json()["sessionId"]
            kind, data, _shown = await run_turn(child, sid, "RATE_LIMITED please")
            assert kind == "turn_error"
            assert data["message"].startswith(
                f"Model server http://***@127.0.0.1:{upstream.port}/v1 answered 429"), data
            log = child.stderr_text()
        assert f"model server http://***@127.0.0.1:{upstream.port}/v1 offers: m-one" in log
        assert "s3cret" not in log
        basic = "Basic " + base64.b64encode(b"alice:s3cret").decode()
        assert upstream.authorizations == [basic, basic]   # /models, then the prompt


async def test_a_session_goes_on_after_a_turn_without_a_reply(tmp_path) -> None:
    """Over REST on a real server, against a model server whose chat template wants
    alternating roles: a failed turn and a turn cancelled before its first word leave
    the session usable (they were two user messages in a row: 400 for ever after)."""
    async with hostile_model_server() as upstream, \
            ServeProcess(tmp_path, "--model-server", upstream.url) as child:
        upstream.strict_roles = True
        sid = (await child.client.post("/session", json={"agent": "m-one"})).json()["sessionId"]
        kind, _data, _shown = await run_turn(child, sid, "RATE_LIMITED please")
        assert kind == "turn_error"

        async def cancel_when_stalled() -> None:
            await wait_until(lambda: upstream.stalled == ["STALL_HEADERS"], timeout=30)
            assert (await child.client.post(f"/session/{sid}/cancel")).status_code == 204

        kind, data, _shown = await run_turn(child, sid, "STALL_HEADERS",
                                            meanwhile=cancel_when_stalled)
        assert (kind, data["stopReason"]) == ("turn_complete", "cancelled")
        for prompt in ("hello", "and again"):
            kind, data, shown = await run_turn(child, sid, prompt)
            assert (kind, shown) == ("turn_complete", f"pong: {prompt}"), data
        assert "roles_refused" not in upstream.seen
        assert [m["role"] for m in upstream.requests[-1]["messages"]] == [
            "user", "assistant", "user"]
