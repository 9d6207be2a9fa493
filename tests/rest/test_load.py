"""``/load`` carries the session's history and ``/resume`` does not, as qwen serve 0.24.4
does (the keys below are those of its live recording,
``shared/reference/qwen-serve-load-0.24.4.json``): live, while a prompt runs, and cold
after ``DELETE`` (restored through the agent's ``session/load`` replay)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.rest.server import RunningServer

pytestmark = pytest.mark.anyio

_COMMON = ["sessionId", "workspaceCwd", "attached", "clientId", "createdAt", "state",
           "hasRunningBackgroundTasks", "hasActivePrompt"]
PEER_KEYS = {
    "load": [*_COMMON, "compactedReplay", "liveJournal", "lastEventId", "eventEpoch",
             "promptTerminals"],
    "resume": [*_COMMON, "lastEventId", "eventEpoch"],
}


def _update(event: dict[str, Any]) -> tuple[str, str]:
    update = event["data"]["update"]
    return update["sessionUpdate"], update["content"]["text"]


async def _turn(server: RunningServer, sid: str, text: str) -> str:
    accepted = (await server.prompt(sid, text)).json()
    await server.events_until(sid, lambda kind, data: kind == "turn_complete"
                              and data["promptId"] == accepted["promptId"], last_event_id=0)
    return accepted["promptId"]  # type: ignore[no-any-return]


async def test_load_live_carries_compacted_history(server: RunningServer) -> None:
    sid = (await server.create_session(sessionScope="thread"))["sessionId"]
    pid = await _turn(server, sid, "/chunks 4 say pong")
    response = await server.client.post(f"/session/{sid}/load", json={})
    assert response.status_code == 200
    body = response.json()
    assert list(body) == PEER_KEYS["load"]
    assert body["attached"] is True and body["hasActivePrompt"] is False
    assert body["hasRunningBackgroundTasks"] is False and isinstance(body["state"], dict)
    replay = body["compactedReplay"]
    assert [e["type"] for e in replay] == ["session_update", "session_update", "turn_complete"]
    assert _update(replay[0]) == ("user_message_chunk", "/chunks 4 say pong")
    # the four chunks are one, with the id (and promptId) of the last
    assert _update(replay[1]) == ("agent_message_chunk", "Echo: say pong")
    assert replay[1]["promptId"] == pid and replay[2]["id"] == replay[1]["id"] + 1
    assert replay[1]["id"] == replay[0]["id"] + 4
    assert all(e["v"] == 1 and "serverTimestamp" in e["_meta"] for e in replay)
    assert body["liveJournal"] == []
    status = (await server.client.get(f"/session/{sid}/status")).json()
    assert body["lastEventId"] == replay[-1]["id"] == status["lastEventId"]
    [terminal] = body["promptTerminals"]
    assert terminal == {"v": 1, "promptId": pid, "terminal": "completed",
                        "stopReason": "end_turn", "at": terminal["at"]}
    assert isinstance(terminal["at"], int)


async def test_resume_live_carries_no_history(server: RunningServer) -> None:
    created = await server.create_session(sessionScope="thread")
    sid = created["sessionId"]
    await _turn(server, sid, "hi")
    body = (await server.client.post(f"/session/{sid}/resume", json={})).json()
    assert list(body) == PEER_KEYS["resume"]
    assert body["attached"] is True and body["eventEpoch"] == created["eventEpoch"]
    status = (await server.client.get(f"/session/{sid}/status")).json()
    assert body["lastEventId"] == status["lastEventId"]


async def test_load_while_a_prompt_runs_puts_it_in_the_live_journal(server: RunningServer) -> None:
    sid = (await server.create_session(sessionScope="thread"))["sessionId"]
    first = await _turn(server, sid, "first")
    running = (await server.prompt(sid, "/permission second")).json()["promptId"]
    frames = await server.events_until(sid, "permission_request", last_event_id=0)
    request_id = frames[-1][1]["data"]["requestId"]
    body = (await server.client.post(f"/session/{sid}/load", json={})).json()
    assert body["hasActivePrompt"] is True
    assert {e.get("promptId") for e in body["compactedReplay"]} == {first}
    journal = body["liveJournal"]
    assert journal and {e["promptId"] for e in journal} == {running}
    assert journal[0]["type"] == "session_update" and journal[-1]["type"] == "permission_request"
    assert body["lastEventId"] == journal[-1]["id"]
    assert [t["promptId"] for t in body["promptTerminals"]] == [first]
    vote = await server.client.post(f"/session/{sid}/permission/{request_id}", json={
        "outcome": {"outcome": "selected", "optionId": "allow_once"}})
    assert vote.status_code == 200
    with anyio.fail_after(30):
        await server.events_until(sid, "turn_complete", last_event_id=body["lastEventId"])


async def test_cold_load_after_delete_carries_the_agent_replay(server: RunningServer) -> None:
    created = await server.create_session(sessionScope="thread")
    sid = created["sessionId"]
    pid = await _turn(server, sid, "/chunks 2 say pong")
    before = (await server.client.post(f"/session/{sid}/load", json={})).json()
    assert (await server.client.delete(f"/session/{sid}")).status_code == 204
    response = await server.client.post(f"/session/{sid}/load", json={})
    assert response.status_code == 200
    body = response.json()
    assert list(body) == PEER_KEYS["load"]
    assert body["attached"] is False and body["eventEpoch"] != created["eventEpoch"]
    replay = body["compactedReplay"]
    # the agent's session/load replay, published during the restore; not compacted
    # (no prompt owns it), as the peer's cold load
    assert [_update(e) for e in replay] == [("user_message_chunk", "/chunks 2 say pong"),
                                           ("agent_message_chunk", "Echo: say pong")]
    assert [e["id"] for e in replay] == [1, 2] and body["lastEventId"] == 2
    assert body["liveJournal"] == []
    assert body["promptTerminals"] == before["promptTerminals"]
    assert [t["promptId"] for t in body["promptTerminals"]] == [pid]
    # a subscriber from lastEventId sees the next turn, nothing of the replay again
    frames = await server.events_until(sid, "replay_complete", last_event_id=body["lastEventId"],
                                       epoch=body["eventEpoch"])
    assert [kind for kind, _ in frames] == ["replay_complete"]


async def test_a_prompt_queued_behind_another_has_only_its_turn_in_the_live_journal(
        server: RunningServer) -> None:
    """helper-51: the split was at the running prompt's first event, its
    ``pending_prompt_added``, published while the prompt before it still streamed:
    that turn's chunks landed in ``liveJournal``, not joined, as if the new one's."""
    sid = (await server.create_session(sessionScope="thread"))["sessionId"]
    first = (await server.prompt(sid, "/permission first")).json()["promptId"]
    frames = await server.events_until(sid, "permission_request", last_event_id=0)
    request_id = frames[-1][1]["data"]["requestId"]
    running = (await server.prompt(sid, "/permission second")).json()["promptId"]
    await server.client.post(f"/session/{sid}/permission/{request_id}", json={
        "outcome": {"outcome": "selected", "optionId": "allow_once"}})
    asked: list[str] = []

    def second_question(kind: str, _data: Any) -> bool:
        asked.extend([kind] if kind == "permission_request" else [])
        return len(asked) == 2

    await server.events_until(sid, second_question, last_event_id=0)
    body = (await server.client.post(f"/session/{sid}/load", json={})).json()
    journal = body["liveJournal"]
    assert journal and {e["promptId"] for e in journal} == {running}
    assert journal[0]["type"] == "pending_prompt_started"
    replay = body["compactedReplay"]
    assert any(e["type"] == "turn_complete" and e.get("promptId") == first for e in replay)
    assert any(e["type"] == "pending_prompt_added" and e.get("promptId") == running
               for e in replay)
