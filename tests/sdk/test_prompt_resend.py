"""``DaemonClient`` sends every prompt under an id and sends it again when a fleet
instance answers ``owner_lost`` (the owner took it, the answer was lost) or
``owner_unreachable`` (it never got there): against the real daemon on loopback behind
a fault that loses answers, the prompt runs once."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from acp_server.client import (DaemonClient, DaemonHttpError, DaemonTurnError, PromptRequest,
                               PromptResult)
from acp_server.client.daemon import MAX_PROMPT_SENDS
from tests.sdk.harness import Daemon, daemon, wait_until, without_prompt_id_replay

pytestmark = pytest.mark.anyio


@dataclass
class LoseAnswers:
    """The first ``times`` prompt requests: with ``deliver`` the daemon takes each (a
    prompt admitted) and its answer is replaced by 503 ``code`` (a lost answer), else
    the daemon never sees it. Records every prompt body."""

    code: str = "owner_lost"
    times: int = 1
    deliver: bool = True
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def wrap(self, app: ASGIApp) -> ASGIApp:
        async def losing(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http" or not scope["path"].endswith("/prompt"):
                await app(scope, receive, send)
                return
            chunks: list[bytes] = []
            more = True
            while more:
                message = await receive()
                chunks.append(message.get("body", b""))
                more = message.get("more_body", False)
            body = b"".join(chunks)
            self.bodies.append(json.loads(body))

            async def replay() -> Message:
                return {"type": "http.request", "body": body, "more_body": False}

            if len(self.bodies) > self.times:
                await app(scope, replay, send)
                return
            if self.deliver:
                async def dropped(message: Message) -> None:
                    pass
                await app(scope, replay, dropped)
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"retry-after", b"5")]})
            await send({"type": "http.response.body", "body": json.dumps(
                {"error": "lost", "code": self.code}).encode()})
        return losing


def _turn_ends(srv: Daemon, sid: str, prompt_id: str) -> list[str]:
    """How many times the prompt ended, from the session's history."""
    return [t.terminal for t in srv.bridge.get_session(sid).prompt_terminals
            if t.prompt_id == prompt_id]


@pytest.mark.parametrize(("code", "deliver"), [("owner_lost", True),
                                               ("owner_unreachable", False)])
async def test_a_lost_answer_is_sent_again_and_runs_once(tmp_path: Path, code: str,
                                                         deliver: bool) -> None:
    fault = LoseAnswers(code=code, times=2, deliver=deliver)
    async with daemon(tmp_path, wrap=fault.wrap) as srv, \
            DaemonClient(srv.url, max_retry_wait_s=0) as client:
        sid = (await client.create_or_attach_session()).session_id
        result = await client.prompt(sid, "/chunks 2 once")
        assert result.stop_reason == "end_turn"
        assert len(fault.bodies) == 3
        ids = {body["promptId"] for body in fault.bodies}
        assert ids == {result.prompt_id}
        assert _turn_ends(srv, sid, result.prompt_id) == ["completed"]
        assert client.pending_prompt_count(sid) == 0


async def test_answers_lost_every_time_raise_and_release(tmp_path: Path) -> None:
    fault = LoseAnswers(times=MAX_PROMPT_SENDS)
    async with daemon(tmp_path, wrap=fault.wrap) as srv, \
            DaemonClient(srv.url, max_retry_wait_s=0) as client:
        sid = (await client.create_or_attach_session()).session_id
        with pytest.raises(DaemonHttpError) as info:
            await client.prompt(sid, "/chunks 1 lost")
        assert info.value.status == 503 and info.value.code == "owner_lost"
        assert len(fault.bodies) == MAX_PROMPT_SENDS
        assert client.pending_prompt_count(sid) == 0
        [prompt_id] = {body["promptId"] for body in fault.bodies}
        await wait_until(lambda: _turn_ends(srv, sid, prompt_id))
        assert _turn_ends(srv, sid, prompt_id) == ["completed"]   # taken once, all the same


async def test_the_requests_own_id_is_kept(tmp_path: Path) -> None:
    fault = LoseAnswers(times=0)
    async with daemon(tmp_path, wrap=fault.wrap) as srv, DaemonClient(srv.url) as client:
        sid = (await client.create_or_attach_session()).session_id
        result = await client.prompt(sid, PromptRequest.text("/chunks 1 mine", prompt_id="mine"))
        assert result.prompt_id == "mine"
        result = await client.prompt(sid, {"prompt": [{"type": "text", "text": "x"}],
                                           "promptId": "theirs"}, prompt_id="ignored")
        assert result.prompt_id == "theirs"
        assert [b["promptId"] for b in fault.bodies] == ["mine", "theirs"]


async def test_an_ended_prompt_sent_again_answers_how_it_ended(server: Daemon) -> None:
    async with DaemonClient(server.url) as client:
        sid = (await client.create_or_attach_session()).session_id
        with pytest.raises(DaemonTurnError):
            await client.prompt(sid, "/fail", prompt_id="f-1")
        with pytest.raises(DaemonTurnError) as info:
            await client.prompt_nonblocking(sid, "/fail", prompt_id="f-1")
        assert info.value.prompt_id == "f-1" and info.value.code
        await client.prompt(sid, "/chunks 1 fine", prompt_id="ok-1")
        again = await client.prompt(sid, "/chunks 1 fine", prompt_id="ok-1")
        assert again == PromptResult(stop_reason="end_turn", prompt_id="ok-1")
        assert client.pending_prompt_count(sid) == 0


async def test_a_server_without_the_feature_is_not_sent_it_again(tmp_path: Path) -> None:
    """It would run the prompt twice: the lost answer is the caller's error."""
    fault = LoseAnswers(times=2)
    asked: list[str] = []
    async with daemon(tmp_path, wrap=lambda app: fault.wrap(
            without_prompt_id_replay(app, asked))) as srv, \
            DaemonClient(srv.url, max_retry_wait_s=0) as client:
        sid = (await client.create_or_attach_session()).session_id
        with pytest.raises(DaemonHttpError) as info:
            await client.prompt(sid, "/chunks 1 once")
        assert info.value.code == "owner_lost" and len(fault.bodies) == 1
        with pytest.raises(DaemonHttpError):
            await client.prompt(sid, "/chunks 1 twice")
        assert len(fault.bodies) == 2 and len(asked) == 1   # asked once, remembered


async def test_a_session_gone_before_its_stream_was_read_answers_how_the_prompt_ended(
        server: Daemon) -> None:
    """The agent dies as it runs the prompt and the session closes before the client
    subscribes to its events (404): the prompt's end is asked by sending it again under
    its id, which a closed session answers from the terminals it keeps."""
    async with DaemonClient(server.url) as client:
        for _ in range(3):   # whichever comes first, the subscription or the close
            sid = (await client.create_or_attach_session()).session_id
            with pytest.raises(DaemonTurnError) as info:
                await client.prompt(sid, "/crash now", prompt_id="c-1")
            assert info.value.code == "agent_died"
        again = await server.client.post(f"/session/{sid}/prompt", json={
            "prompt": [{"type": "text", "text": "/crash now"}], "promptId": "c-1"})
        assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
        assert again.json()["errorCode"] == "agent_died"
        other = await server.client.post(f"/session/{sid}/prompt", json={
            "prompt": [{"type": "text", "text": "x"}], "promptId": "c-2"})
        assert other.status_code == 404 and other.json()["code"] == "session_not_found"
