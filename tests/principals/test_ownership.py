"""Ownership over real loopback HTTP: two principals through the REST and ``/acp``
doors never see each other's sessions, events, prompts or permission requests (404,
as an unknown id); an admin sees all; ``--share-sessions`` opens them; the audit log
records a scripted scenario exactly."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.acp_http.server import RunningAcpServer, request, text
from tests.acp_http.wsclient import ws_connect
from tests.harness.local import local_server
from tests.principals.helpers import bearer, mint
from tests.rest.server import RunningServer, text_prompt

pytestmark = pytest.mark.anyio
BOOT = "boot-s3cret"
PERMISSION = "/permission please"   # the reference agent asks before it answers


class Doors(RunningAcpServer, RunningServer):
    """The REST and ``/acp`` helpers on one server."""


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, **settings: Any
                  ) -> AsyncIterator[tuple[Doors, dict[str, dict[str, str]]]]:
    async with local_server(tmp_path, kind=Doors, token=BOOT, headers=bearer(BOOT),
                            **settings) as srv:
        people = {name: bearer(await mint(srv.server, name, *scopes, unlimited=True))
                  for name, scopes in (("alice", ()), ("bob", ()), ("ops", ("admin",)))}
        yield srv, people


async def _thread(srv: Doors, headers: dict[str, str]) -> str:
    made = await srv.client.post("/session", json={"sessionScope": "thread"}, headers=headers)
    assert made.status_code == 200, made.text
    return made.json()["sessionId"]  # type: ignore[no-any-return]


async def _listed(srv: Doors, headers: dict[str, str]) -> dict[str, str | None]:
    caps = (await srv.client.get("/capabilities", headers=headers)).json()
    page = await srv.client.get(f"/workspace/{caps['workspaces'][0]['id']}/sessions",
                                headers=headers)
    assert page.status_code == 200, page.text
    return {s["sessionId"]: s["owner"] for s in page.json()["sessions"]}


async def _permission_request(srv: Doors, sid: str, headers: dict[str, str]) -> str:
    accepted = await srv.client.post(f"/session/{sid}/prompt", json=text_prompt(PERMISSION),
                                     headers=headers)
    assert accepted.status_code == 202, accepted.text
    frames = await srv.events_until(sid, "permission_request",
                                    last_event_id=accepted.json()["lastEventId"], headers=headers)
    return frames[-1][1]["data"]["requestId"]  # type: ignore[no-any-return]


def _is_404(response: Any, code: str = "session_not_found") -> bool:
    return response.status_code == 404 and response.json().get("code") == code


async def test_rest_sessions_are_their_makers(tmp_path: Path) -> None:
    async with serving(tmp_path) as (srv, who):
        alice, bob, ops = who["alice"], who["bob"], who["ops"]
        a, b = await _thread(srv, alice), await _thread(srv, bob)
        request_id = await _permission_request(srv, a, alice)
        # bob: every route of alice's session is 404, as an unknown id
        c = srv.client
        refused = [
            await c.get(f"/session/{a}/status", headers=bob),
            await c.get(f"/session/{a}/events", headers=bob),
            await c.get(f"/session/{a}/pending-prompts", headers=bob),
            await c.post(f"/session/{a}/prompt", json=text_prompt("hi"), headers=bob),
            await c.post(f"/session/{a}/cancel", headers=bob),
            await c.post(f"/session/{a}/heartbeat", headers=bob),
            await c.post(f"/session/{a}/branch", json={}, headers=bob),
            await c.post(f"/session/{a}/load", json={}, headers=bob),
            await c.post(f"/session/{a}/resume", json={}, headers=bob),
            await c.post("/session", json={"sessionId": a}, headers=bob),
            await c.delete(f"/session/{a}", headers=bob),
            await c.post(f"/session/{a}/permission/{request_id}",
                         json={"outcome": {"outcome": "selected", "optionId": "allow_once"}},
                         headers=bob),
        ]
        assert [r.status_code for r in refused] == [404] * len(refused)
        assert all(_is_404(r) for r in refused[:-1]), [r.text for r in refused]
        legacy = await c.post(f"/permission/{request_id}",
                              json={"outcome": {"outcome": "cancelled"}}, headers=bob)
        assert legacy.status_code == 404   # as an unknown request
        assert legacy.json() == {"error": "No pending permission request", "requestId": request_id}
        # nothing bob did reached alice's session: her request still waits, her turn runs
        status = (await c.get(f"/session/{a}/status", headers=alice)).json()
        assert status["pendingInteractionCount"] == 1 and status["hasActivePrompt"]
        # listings per principal; an admin (a token or the bootstrap) sees all, with owners
        assert await _listed(srv, alice) == {a: "alice"}
        assert await _listed(srv, bob) == {b: "bob"}
        assert await _listed(srv, ops) == {a: "alice", b: "bob"}
        assert await _listed(srv, bearer(BOOT)) == {a: "alice", b: "bob"}
        assert (await c.get(f"/session/{a}/status", headers=ops)).status_code == 200
        # alice answers on the legacy route: her own request
        voted = await c.post(f"/permission/{request_id}",
                             json={"outcome": {"outcome": "selected", "optionId": "allow_once"}},
                             headers=alice)
        assert voted.status_code == 200, voted.text
        # the default ("single") session is per principal
        first = (await c.post("/session", json={}, headers=alice)).json()
        again = (await c.post("/session", json={}, headers=alice)).json()
        other = (await c.post("/session", json={}, headers=bob)).json()
        assert (first["attached"], again["attached"]) == (False, True)
        assert again["sessionId"] == first["sessionId"] != other["sessionId"]
        # a branch belongs to who branched; alice closes hers, bob cannot see it either way
        branched = await c.post(f"/session/{b}/branch", json={}, headers=bob)
        assert branched.status_code == 201, branched.text
        assert _is_404(await c.get(f"/session/{branched.json()['sessionId']}/status",
                                   headers=alice))
        assert (await c.delete(f"/session/{a}", headers=alice)).status_code == 204
        assert _is_404(await c.post(f"/session/{a}/load", json={}, headers=bob))


async def test_acp_sessions_are_their_makers(tmp_path: Path) -> None:
    async with serving(tmp_path) as (srv, who):
        alice, bob = who["alice"], who["bob"]
        a = await _thread(srv, alice)
        b_conn, _ = await srv.initialize(**bob)
        async with srv.stream(b_conn, **bob) as stream:
            mine = await srv.post(b_conn, request(1, "session/new", {
                "cwd": srv.workspace, "mcpServers": []}), **bob)
            assert mine.status_code == 202
            b = (await stream.wait_for_id(1))["result"]["sessionId"]
            asks = [("session/load", {"sessionId": a, "cwd": srv.workspace, "mcpServers": []}),
                    ("session/resume", {"sessionId": a, "cwd": srv.workspace,
                                        "mcpServers": []}),
                    ("session/prompt", {"sessionId": a, "prompt": text("hi")}),
                    ("session/cancel", {"sessionId": a}),
                    ("session/close", {"sessionId": a}),
                    ("session/delete", {"sessionId": a}),
                    ("session/fork", {"sessionId": a, "cwd": srv.workspace}),
                    ("session/set_mode", {"sessionId": a, "modeId": "x"})]
            for rpc_id, (method, params) in enumerate(asks, start=10):
                assert (await srv.post(b_conn, request(rpc_id, method, params),
                                       **bob)).status_code == 202
                reply = await stream.wait_for_id(rpc_id)
                assert reply["error"]["code"] == -32602, (method, reply)
            assert (await srv.post(b_conn, request(30, "session/list", {}), **bob)).status_code \
                == 202
            listed = (await stream.wait_for_id(30))["result"]["sessions"]
            assert [s["sessionId"] for s in listed] == [b]
        # a session stream of alice's session opens as one of an unknown id does (no
        # 404 to tell them apart), and is never subscribed: nothing of hers reaches it
        unknown = "00000000-0000-4000-8000-000000000000"
        async with srv.stream(b_conn, unknown, **bob), srv.stream(b_conn, a, **bob) as peek:
            status = (await srv.client.get(f"/session/{a}/status", headers=alice)).json()
            assert status["subscribers"] == 0
            said = await srv.client.post(f"/session/{a}/prompt", headers=alice,
                                         json={"prompt": [{"type": "text", "text": "hi"}]})
            assert said.status_code == 202
            with anyio.fail_after(10):
                while (await srv.client.get(f"/session/{a}/status", headers=alice)
                       ).json()["pendingPrompts"]:
                    await anyio.sleep(0.01)
        assert peek.messages == []
        # alice's session lived through it all, and no channel of bob's reads it
        status = (await srv.client.get(f"/session/{a}/status", headers=alice)).json()
        assert status["subscribers"] == 0
        # over a WebSocket: bob's prompt on alice's session is an unknown session
        async with ws_connect(srv.base_url, headers=bob) as ws:
            await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
            assert "result" in await ws.receive_json()
            await ws.send_json(request(1, "session/prompt", {"sessionId": a,
                                                             "prompt": text("hi")}))
            frame = await ws.wait_for(lambda m: m.get("id") == 1)
            assert frame["error"]["code"] == -32602
        # alice's permission request reaches her /acp connection, never bob's
        a_conn, _ = await srv.initialize(**alice)
        async with srv.stream(a_conn, a, **alice) as mine_a:
            await srv.post(a_conn, request(2, "session/prompt", {
                "sessionId": a, "prompt": text(PERMISSION)}), a, **alice)
            asked = await mine_a.wait_for(
                lambda m: m.get("method") == "session/request_permission")
            answer = {"jsonrpc": "2.0", "id": asked["id"],
                      "result": {"outcome": {"outcome": "cancelled"}}}
            assert (await srv.post(b_conn, answer, **bob)).status_code == 202
            assert (await srv.client.get(f"/session/{a}/status", headers=alice)
                    ).json()["pendingInteractionCount"] == 1   # bob's answer counted for nothing
            assert (await srv.post(a_conn, answer, **alice)).status_code == 202
            await mine_a.wait_for_id(2)


async def test_share_sessions_opens_them_to_every_principal(tmp_path: Path) -> None:
    async with serving(tmp_path, share_sessions=True) as (srv, who):
        a = await _thread(srv, who["alice"])
        assert (await srv.client.get(f"/session/{a}/status", headers=who["bob"])).status_code \
            == 200
        assert await _listed(srv, who["bob"]) == {a: "alice"}
        prompted = await srv.client.post(f"/session/{a}/prompt", json=text_prompt("hi"),
                                         headers=who["bob"])
        assert prompted.status_code == 202


async def test_the_audit_log_records_a_scripted_scenario_exactly(tmp_path: Path) -> None:
    async with serving(tmp_path, audit_prompts=True) as (srv, who):
        alice = who["alice"]
        sid = await _thread(srv, alice)
        request_id = await _permission_request(srv, sid, alice)
        prompt_id = (await srv.client.get(f"/session/{sid}/status", headers=alice)
                     ).json()["activePromptId"]
        await srv.client.post(f"/session/{sid}/permission/{request_id}", json={
            "outcome": {"outcome": "selected", "optionId": "allow_once"}}, headers=alice)
        assert (await srv.client.post(f"/session/{sid}/cancel", headers=alice)).status_code == 204
        assert (await srv.client.delete(f"/session/{sid}", headers=alice)).status_code == 204
        await srv.server.gate.audit.flush()
        page = (await srv.client.get("/audit", params={"principal": "alice"})).json()
        got = [(r["action"], r["target"], r["detail"]) for r in page["records"]]
        assert got == [
            ("session.created", sid, {"how": "new", "agent": None}),
            ("prompt.accepted", sid, {"prompt_id": prompt_id, "door": "rest",
                                      "text": PERMISSION}),
            ("permission.answered", sid, {"request_id": request_id, "outcome": "selected",
                                          "door": "rest", "option_id": "allow_once"}),
            ("session.cancelled", sid, {}),
            ("session.closed", sid, {}),
        ]
        assert {r["client"] for r in page["records"]} == {"127.0.0.1"}


async def test_lmsp_tasks_and_responses_are_their_makers(tmp_path: Path) -> None:
    async with serving(tmp_path) as (srv, who):
        alice, bob, ops = who["alice"], who["bob"], who["ops"]
        c = srv.client
        task = await c.post("/lmsp/v1/tasks", headers=alice, json={
            "type": "response", "input": {"model": "reference", "input": "/sleep 60s held"}})
        assert task.status_code == 202, task.text
        tid = task.json()["id"]
        done = await c.post("/lmsp/v1/responses", headers=alice,
                            json={"model": "reference", "input": "hi"})
        assert done.status_code == 200, done.text
        rid = done.json()["id"]
        refused = [await c.get(f"/lmsp/v1/tasks/{tid}", headers=bob),
                   await c.get(f"/lmsp/v1/tasks/{tid}/events", headers=bob),
                   await c.post(f"/lmsp/v1/tasks/{tid}/cancel", headers=bob),
                   await c.get(f"/lmsp/v1/responses/{rid}", headers=bob),
                   await c.post(f"/lmsp/v1/responses/{rid}/cancel", headers=bob),
                   await c.delete(f"/lmsp/v1/responses/{rid}", headers=bob),
                   await c.post("/lmsp/v1/responses", headers=bob, json={
                       "model": "reference", "input": "x", "previous_response_id": rid})]
        assert [r.status_code for r in refused] == [404] * len(refused), \
            [r.text for r in refused]
        assert (await c.get("/lmsp/v1/tasks", headers=bob)).json()["data"] == []
        assert (await c.get(f"/lmsp/v1/tasks/{tid}", headers=alice)).json()["status"] in (
            "queued", "loading", "running", "in_progress")   # bob's cancel did nothing
        listed = (await c.get("/lmsp/v1/tasks", headers=ops)).json()["data"]
        assert tid in [t["id"] for t in listed]
        cancelled = await c.post(f"/lmsp/v1/tasks/{tid}/cancel", headers=ops)   # an admin may
        assert cancelled.status_code == 200, cancelled.text


async def test_a_stream_another_principal_opens_keeps_no_acp_session_alive(
        tmp_path: Path) -> None:
    """helper-52: bob's stream named after alice's /acp session made bob's connection
    its heir: alice's DELETE /acp left it live, owned by bob's connection."""
    async with serving(tmp_path) as (srv, who):
        alice, bob = who["alice"], who["bob"]
        a_conn, _ = await srv.initialize(**alice)
        async with srv.stream(a_conn, **alice) as stream:
            made = await srv.post(a_conn, request(1, "session/new", {
                "cwd": srv.workspace, "mcpServers": []}), **alice)
            assert made.status_code == 202
            sid = (await stream.wait_for_id(1))["result"]["sessionId"]
        b_conn, _ = await srv.initialize(**bob)
        async with srv.stream(b_conn, sid, **bob) as peek:
            gone = await srv.client.request("DELETE", "/acp",
                                            headers={"Acp-Connection-Id": a_conn, **alice})
            assert gone.status_code == 202
            status = await srv.client.get(f"/session/{sid}/status", headers=alice)
            assert status.status_code == 404, status.text   # closed with its maker's connection
        assert peek.messages == []
