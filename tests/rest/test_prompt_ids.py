"""A prompt named by its client (``"promptId"`` in the body) over real HTTP: sent again
under the same id, it is never admitted twice: 202 as before while it is pending, 200
with how it ended once it has, both ``Idempotent-Replayed: true``."""

from __future__ import annotations

from typing import Any

import pytest

from acp_server.rest.prompts import FastPrompt
from tests.rest.server import RunningServer, text_prompt

pytestmark = pytest.mark.anyio


def named(text: str, prompt_id: Any, **extra: Any) -> dict[str, Any]:
    return {**text_prompt(text), "promptId": prompt_id, **extra}


async def _turn_ends(server: RunningServer, sid: str, prompt_id: str) -> list[str]:
    """The terminal events of ``prompt_id`` on the stream, read from the start up to
    the first one and then to the end of the replay (a second run would show)."""
    frames = await server.events_until(
        sid, lambda kind, data: kind in ("turn_complete", "turn_error")
        and data.get("promptId") == prompt_id, last_event_id=0)
    return [kind for kind, data in frames if kind in ("turn_complete", "turn_error")
            and data.get("promptId") == prompt_id]


# The front layer's fast handler takes a prompt without ``X-Qwen-Client-Id``; with it
# the route does: both answer a prompt sent again the same.
VIA = pytest.mark.parametrize("via", ["fast", "route"])


def _headers(created: dict[str, Any], via: str) -> dict[str, str]:
    return {"X-Qwen-Client-Id": created["clientId"]} if via == "route" else {}


@VIA
async def test_a_pending_prompt_sent_again_is_not_admitted_twice(
        server: RunningServer, via: str) -> None:
    created = await server.create_session()
    sid, headers = created["sessionId"], _headers(created, via)
    first = await server.client.post(f"/session/{sid}/prompt", headers=headers,
                                     json=named("/sleep 60s held", "editor-1:p-1"))
    assert first.status_code == 202, first.text
    assert first.json()["promptId"] == "editor-1:p-1"
    assert "idempotent-replayed" not in first.headers
    again = await server.client.post(f"/session/{sid}/prompt", headers=headers,
                                     json=named("/sleep 60s held", "editor-1:p-1"))
    assert again.status_code == 202, again.text
    assert again.json() == first.json()   # the admission's own cursor and epoch
    assert again.headers["idempotent-replayed"] == "true"
    listed = (await server.client.get(f"/session/{sid}/pending-prompts")).json()
    assert [p["promptId"] for p in listed["pendingPrompts"]] == ["editor-1:p-1"]
    status = (await server.client.get(f"/session/{sid}/status")).json()
    assert status["pendingPrompts"] == 1
    await server.client.post(f"/session/{sid}/cancel")


@VIA
async def test_an_ended_prompt_sent_again_answers_how_it_ended(server: RunningServer,
                                                               via: str) -> None:
    created = await server.create_session()
    sid, headers = created["sessionId"], _headers(created, via)
    first = await server.client.post(f"/session/{sid}/prompt", headers=headers,
                                     json=named("/chunks 2 x", "p-2"))
    assert first.status_code == 202, first.text
    assert await _turn_ends(server, sid, "p-2") == ["turn_complete"]
    again = await server.client.post(f"/session/{sid}/prompt", headers=headers,
                                     json=named("/chunks 2 x", "p-2"))
    assert again.status_code == 200, again.text
    assert again.headers["idempotent-replayed"] == "true"
    body = again.json()
    assert body["promptId"] == "p-2" and body["terminal"] == "completed"
    assert body["stopReason"] == "end_turn" and isinstance(body["at"], int)
    # The next prompt runs after nothing: the replay admitted nothing.
    follow = await server.prompt(sid, "/chunks 1 next")
    assert follow.status_code == 202
    next_id = follow.json()["promptId"]
    assert await _turn_ends(server, sid, next_id) == ["turn_complete"]
    assert await _turn_ends(server, sid, "p-2") == ["turn_complete"]   # ran once


async def test_a_failed_prompt_sent_again_answers_its_error(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    assert (await server.client.post(f"/session/{sid}/prompt",
                                     json=named("/fail", "p-3"))).status_code == 202
    assert await _turn_ends(server, sid, "p-3") == ["turn_error"]
    again = await server.client.post(f"/session/{sid}/prompt", json=named("/fail", "p-3"))
    assert again.status_code == 200
    body = again.json()
    assert body["terminal"] == "failed" and body["errorCode"]


async def test_one_id_names_one_prompt_per_session(server: RunningServer) -> None:
    one = (await server.create_session(sessionScope="thread"))["sessionId"]
    two = (await server.create_session(sessionScope="thread"))["sessionId"]
    for sid in (one, two):
        answer = await server.client.post(f"/session/{sid}/prompt",
                                          json=named("/chunks 1 x", "same"))
        assert answer.status_code == 202, answer.text
        assert "idempotent-replayed" not in answer.headers
    for sid in (one, two):
        assert await _turn_ends(server, sid, "same") == ["turn_complete"]


@pytest.mark.parametrize("prompt_id", ["", "a b", "x" * 129, 7, True, {"id": "x"}, ["x"],
                                       "é", "line\n"])
async def test_a_bad_prompt_id_is_400(server: RunningServer, prompt_id: Any) -> None:
    sid = (await server.create_session())["sessionId"]   # (the fast handler declines it)
    answer = await server.client.post(f"/session/{sid}/prompt", json=named("hi", prompt_id))
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "invalid_prompt_id"
    assert (await server.client.get(f"/session/{sid}/status")).json()["pendingPrompts"] == 0


async def test_a_replay_checks_the_body_as_an_admission_does(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    assert (await server.client.post(f"/session/{sid}/prompt",
                                     json=named("/sleep 60s held", "p-4"))).status_code == 202
    bad = await server.client.post(f"/session/{sid}/prompt",
                                   json={"prompt": [], "promptId": "p-4"})
    assert bad.status_code == 400
    late = await server.client.post(f"/session/{sid}/prompt",
                                    json=named("x", "p-4", deadlineMs=0))
    assert late.json()["code"] == "invalid_deadline_ms"
    missing = await server.client.post("/session/no-such-session/prompt", json=named("x", "p-4"))
    assert missing.status_code == 404
    await server.client.post(f"/session/{sid}/cancel")


async def test_a_replay_checks_the_client_id(server: RunningServer) -> None:
    created = await server.create_session()
    sid = created["sessionId"]
    assert (await server.client.post(f"/session/{sid}/prompt",
                                     json=named("/sleep 60s held", "p-5"))).status_code == 202
    stranger = await server.client.post(f"/session/{sid}/prompt", json=named("x", "p-5"),
                                        headers={"X-Qwen-Client-Id": "nobody"})
    assert stranger.status_code == 400 and stranger.json()["code"] == "invalid_client_id"
    await server.client.post(f"/session/{sid}/cancel")


async def test_the_fast_handler_answers_a_prompt_sent_again(
        server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``X-Qwen-Client-Id`` the front layer's handler answers (not the route),
    the admission and both replays alike."""
    answered: list[int] = []
    fast_call = FastPrompt.__call__

    async def counting(self: FastPrompt, scope: Any, body: bytes) -> Any:
        answer = await fast_call(self, scope, body)
        if answer is not None:
            answered.append(answer[0]["status"])
        return answer

    monkeypatch.setattr(FastPrompt, "__call__", counting)
    sid = (await server.create_session())["sessionId"]
    for _ in range(2):
        await server.client.post(f"/session/{sid}/prompt", json=named("/chunks 1 x", "p-6"))
    assert await _turn_ends(server, sid, "p-6") == ["turn_complete"]
    again = await server.client.post(f"/session/{sid}/prompt", json=named("/chunks 1 x", "p-6"))
    assert again.status_code == 200
    assert answered[0] == 202 and answered[1] in (200, 202) and answered[2] == 200
