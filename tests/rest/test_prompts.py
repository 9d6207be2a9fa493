"""Prompt admission over real HTTP: 202 envelope, validation, the full-queue 503,
recovery, the pending-prompt list, and SSE replay from the 202's ``lastEventId``."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge import BridgeOptions
from tests.rest.server import RunningServer, running_server, text_prompt

pytestmark = pytest.mark.anyio

PROMPT_REQUIRED = "`prompt` is required and must be a non-empty array of content blocks"


async def test_prompt_accepted(server: RunningServer) -> None:
    created = await server.create_session()
    sid = created["sessionId"]
    response = await server.prompt(sid, "hello", **{"X-Qwen-Client-Id": created["clientId"]})
    assert response.status_code == 202
    body = response.json()
    assert set(body) == {"promptId", "lastEventId", "eventEpoch"}
    assert body["eventEpoch"] == created["eventEpoch"]
    assert isinstance(body["lastEventId"], int)


@pytest.mark.parametrize("body", [{}, {"prompt": []}, {"prompt": "hi"}, {"prompt": [1]},
                                  {"prompt": [{"type": "text", "text": "a"}, "b"]},
                                  {"prompt": None}])
async def test_prompt_required(server: RunningServer, body: object) -> None:
    sid = (await server.create_session())["sessionId"]
    response = await server.client.post(f"/session/{sid}/prompt", json=body)
    assert response.status_code == 400
    assert response.json() == {"error": PROMPT_REQUIRED}


@pytest.mark.parametrize("deadline", [0, -5, 1.5, "100", True])
async def test_invalid_deadline(server: RunningServer, deadline: object) -> None:
    sid = (await server.create_session())["sessionId"]
    body = {**text_prompt("hi"), "deadlineMs": deadline}
    response = await server.client.post(f"/session/{sid}/prompt", json=body)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_deadline_ms"


async def test_backpressure_end_to_end(server: RunningServer) -> None:
    """Five prompts held by the agent → five 202; the sixth → the exact 503; after one
    finishes a new prompt is accepted again. Each prompt holds at its permission ask
    until the test answers it (a 1 s sleep could end before the sixth on a loaded
    machine)."""
    sid = (await server.create_session())["sessionId"]
    accepted = []
    for n in range(5):
        response = await server.prompt(sid, f"/permission held {n}")
        assert response.status_code == 202, response.text
        accepted.append(response.json())
    response = await server.prompt(sid, "one too many")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "5"
    assert response.json() == {
        "error": f'Prompt queue full for session "{sid}" (5/5 pending)',
        "code": "prompt_queue_full", "sessionId": sid, "limit": 5, "pendingCount": 5,
    }
    first = accepted[0]
    frames = await server.events_until(sid, "permission_request",
                                       last_event_id=first["lastEventId"],
                                       epoch=first["eventEpoch"])
    request_id = frames[-1][1]["data"]["requestId"]
    vote = await server.client.post(f"/session/{sid}/permission/{request_id}", json={
        "outcome": {"outcome": "selected", "optionId": "allow_once"}})
    assert vote.status_code == 200
    frames = await server.events_until(
        sid, lambda kind, data: kind == "turn_complete" and data["promptId"] == first["promptId"],
        last_event_id=first["lastEventId"], epoch=first["eventEpoch"])
    assert frames[-1][1]["data"]["stopReason"] == "end_turn"
    response = await server.prompt(sid, "room again")
    assert response.status_code == 202
    response = await server.prompt(sid, "full again")
    assert response.status_code == 503
    await server.client.delete(f"/session/{sid}")


async def test_disabled_cap_accepts_more(tmp_path: Path) -> None:
    options = BridgeOptions(max_pending_prompts_per_session=0)
    async with running_server(tmp_path, options=options) as srv:
        sid = (await srv.create_session())["sessionId"]
        for n in range(7):
            assert (await srv.prompt(sid, f"/sleep 60s {n}")).status_code == 202
        status = (await srv.client.get("/daemon/status")).json()["runtime"]["activity"]
        assert status == {"activePrompts": 1, "pendingPrompts": 7, "queuedPrompts": 6}


async def test_replay_from_accepted_cursor(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    first = (await server.prompt(sid, "/chunks 2 first")).json()
    await server.events_until(sid, "turn_complete", last_event_id=first["lastEventId"])
    second = (await server.prompt(sid, "/chunks 2 second")).json()
    assert second["lastEventId"] > first["lastEventId"]
    await server.events_until(
        sid, lambda kind, data: kind == "turn_complete" and data["promptId"] == second["promptId"],
        last_event_id=second["lastEventId"])
    # Reconnect after the fact: the ring replays exactly the first turn onwards.
    frames = await server.events_until(sid, "replay_complete", last_event_id=first["lastEventId"],
                                       epoch=first["eventEpoch"])
    kinds = [kind for kind, _ in frames]
    assert kinds[-1] == "replay_complete"
    ids = [data["id"] for _, data in frames[:-1]]
    assert ids == list(range(first["lastEventId"] + 1, ids[-1] + 1))
    first_turn = [data for kind, data in frames if data.get("promptId") == first["promptId"]]
    assert first_turn[0]["data"]["update"]["sessionUpdate"] == "user_message_chunk"
    assert [d["type"] for d in first_turn].count("turn_complete") == 1
    chunks = [d["data"]["update"]["content"]["text"] for d in first_turn
              if d["type"] == "session_update"
              and d["data"]["update"]["sessionUpdate"] == "agent_message_chunk"]
    assert "".join(chunks) == "Echo: first"
    assert frames[-1][1]["data"]["replayedCount"] == len(frames) - 1


async def test_pending_prompts_list_and_remove(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    running = (await server.prompt(sid, "/sleep 60s running")).json()   # cancelled below
    queued = (await server.prompt(sid, "queued one")).json()
    body = (await server.client.get(f"/session/{sid}/pending-prompts")).json()
    items = {item["promptId"]: item for item in body["pendingPrompts"]}
    assert items[running["promptId"]]["state"] == "running"
    assert items[queued["promptId"]]["state"] == "queued"
    assert items[queued["promptId"]]["text"] == "queued one"
    response = await server.client.delete(f"/session/{sid}/pending-prompts/{queued['promptId']}")
    assert (response.status_code, response.json()) == (200, {"removed": True})
    body = (await server.client.get(f"/session/{sid}/pending-prompts")).json()
    assert [item["promptId"] for item in body["pendingPrompts"]] == [running["promptId"]]
    # no longer pending: 200 {"removed": false}, as qwen serve answers
    response = await server.client.delete(f"/session/{sid}/pending-prompts/{queued['promptId']}")
    assert (response.status_code, response.json()) == (200, {"removed": False})
    await server.client.post(f"/session/{sid}/cancel")


async def test_agent_error_reaches_the_stream(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    accepted = (await server.prompt(sid, "/fail")).json()
    frames = await server.events_until(sid, lambda kind, _: kind in ("turn_error", "turn_complete"),
                                       last_event_id=accepted["lastEventId"])
    assert frames[-1][0] == "turn_error"
    assert frames[-1][1]["promptId"] == accepted["promptId"]


@pytest.mark.parametrize("epoch", ["e" * 36, "é\u2028\"q\""])
def test_fast_accepted_messages_are_the_routes(epoch: str) -> None:
    """The front layer's 202 (``accepted_messages``, no ``Response`` built) is the
    route's ``json_response(202, ...)``, message for message, bytes for bytes."""
    from acp_server.rest import wire
    from acp_server.rest.errors import json_response
    from acp_server.rest.prompts import _messages, accepted_messages

    for last in (0, 12, 10**12):
        body = wire.PromptAccepted(promptId="019ad7c4-5e1b-7a3c-9f02-0123456789ab",
                                   lastEventId=last, eventEpoch=epoch)
        assert accepted_messages(body) == _messages(json_response(202, body))
