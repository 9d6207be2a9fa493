"""Permission votes over real HTTP with the reference agent's ``/permission``."""

from __future__ import annotations

import pytest

from tests.rest.server import RunningServer

pytestmark = pytest.mark.anyio

OUTCOME_REQUIRED = ('`outcome` must be `{ outcome: "cancelled" }` or '
                    '`{ outcome: "selected", optionId: string }`')


def _selected(option_id: str) -> dict[str, object]:
    return {"outcome": {"outcome": "selected", "optionId": option_id}}


async def _await_request(server: RunningServer, sid: str, cursor: int) -> dict:
    frames = await server.events_until(sid, "permission_request", last_event_id=cursor)
    return frames[-1][1]["data"]  # type: ignore[no-any-return]


async def test_round_trip(server: RunningServer) -> None:
    created = await server.create_session()
    sid, client_id = created["sessionId"], created["clientId"]
    accepted = (await server.prompt(sid, "/permission please")).json()
    request = await _await_request(server, sid, accepted["lastEventId"])
    request_id = request["requestId"]
    assert request["sessionId"] == sid
    assert {o["optionId"] for o in request["options"]} >= {"allow_once", "reject_once"}
    vote_url = f"/session/{sid}/permission/{request_id}"

    response = await server.client.post(vote_url, json={"outcome": {"outcome": "maybe"}})
    assert response.status_code == 400
    assert response.json() == {"error": OUTCOME_REQUIRED}
    response = await server.client.post(vote_url, json=_selected("not_offered"))
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_option_id"
    assert response.json()["requestId"] == request_id
    assert response.json()["optionId"] == "not_offered"

    response = await server.client.post(vote_url, json=_selected("allow_once"),
                                        headers={"X-Qwen-Client-Id": client_id})
    assert response.status_code == 200
    assert response.json() == {}

    response = await server.client.post(vote_url, json=_selected("allow_once"))
    assert response.status_code == 404
    assert response.json() == {"error": "No pending permission request for session",
                               "sessionId": sid, "requestId": request_id}
    response = await server.client.post(f"/permission/{request_id}", json=_selected("allow_once"))
    assert response.status_code == 404
    assert response.json()["error"] == "No pending permission request"

    frames = await server.events_until(sid, "turn_complete", last_event_id=accepted["lastEventId"])
    resolved = [data for kind, data in frames if kind == "permission_resolved"]
    assert resolved[0]["data"]["outcome"] == {"outcome": "selected", "optionId": "allow_once"}
    assert resolved[0]["data"]["voterClientId"] == client_id
    reply = "".join(d["data"]["update"]["content"]["text"] for kind, d in frames
                    if kind == "session_update"
                    and d["data"]["update"]["sessionUpdate"] == "agent_message_chunk")
    assert reply.startswith("Permission allowed (allow_once).")
    assert frames[-1][1]["data"]["stopReason"] == "end_turn"


async def test_legacy_route_cancelled_vote(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    accepted = (await server.prompt(sid, "/permission")).json()
    request = await _await_request(server, sid, accepted["lastEventId"])
    response = await server.client.post(f"/permission/{request['requestId']}",
                                        json={"outcome": {"outcome": "cancelled"}})
    assert response.status_code == 200
    frames = await server.events_until(sid, "turn_complete", last_event_id=accepted["lastEventId"])
    assert frames[-1][1]["data"]["stopReason"] == "cancelled"


async def test_unknown_request(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    response = await server.client.post(f"/session/{sid}/permission/nope", json=_selected("x"))
    assert response.status_code == 404
    assert response.json() == {"error": "No pending permission request for session",
                               "sessionId": sid, "requestId": "nope"}
    response = await server.client.post("/permission/nope", json={"outcome": {"outcome": "cancelled"}})
    assert response.status_code == 404
    assert response.json() == {"error": "No pending permission request", "requestId": "nope"}


@pytest.mark.parametrize("body", [{}, {"outcome": "selected"},
                                  {"outcome": {"outcome": "selected"}},
                                  {"outcome": {"outcome": "selected", "optionId": 3}}])
async def test_bad_vote_body(server: RunningServer, body: object) -> None:
    response = await server.client.post("/permission/whatever", json=body)
    assert response.status_code == 400
    assert response.json() == {"error": OUTCOME_REQUIRED}


async def test_status_lists_the_open_request(server: RunningServer) -> None:
    """A permission request waiting is in the status and the listing as qwen serve
    lists it (``pendingInteractions``, its SDK's ``DaemonPendingInteraction``), and
    gone once answered."""
    sid = (await server.create_session(sessionScope="thread"))["sessionId"]
    accepted = (await server.prompt(sid, "/permission please")).json()
    request_id = (await _await_request(server, sid, accepted["lastEventId"]))["requestId"]
    status = (await server.client.get(f"/session/{sid}/status")).json()
    [asked] = [dict(i) for i in status["pendingInteractions"]]
    assert asked.pop("createdAt").endswith("Z")
    assert asked == {
        "requestId": request_id, "kind": "permission",
        "action": {"type": "other", "title": "Reference permission check"},
        "options": [{"optionId": "allow_once", "label": "Allow once", "kind": "allow_once"},
                    {"optionId": "allow_always", "label": "Allow always",
                     "kind": "allow_always"},
                    {"optionId": "reject_once", "label": "Reject", "kind": "reject_once"}]}
    assert (status["isWaitingForPermission"], status["isWaitingForUserQuestion"],
            status["pendingInteractionCount"]) == (True, False, 1)
    wid = (await server.client.get("/capabilities")).json()["workspaces"][0]["id"]
    listed = (await server.client.get(f"/workspace/{wid}/sessions")).json()["sessions"]
    assert [s["pendingInteractions"] for s in listed if s["sessionId"] == sid] == \
        [status["pendingInteractions"]]
    voted = await server.client.post(f"/session/{sid}/permission/{request_id}",
                                     json=_selected("allow_once"))
    assert voted.status_code == 200
    status = (await server.client.get(f"/session/{sid}/status")).json()
    assert (status["pendingInteractions"], status["isWaitingForPermission"]) == ([], False)
    await server.events_until(sid, "turn_complete", last_event_id=accepted["lastEventId"])
