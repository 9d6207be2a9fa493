"""A hostile pass over authorization: an attacker holding a valid but low-privilege
token (another principal's, one scope only, expired, revoked) against every door, over
real loopback HTTP and WebSocket (``docs/security.md``, "Principals").

Each test is one attack, asserted on what the attacker's client sees; a passing test
documents a defence that holds. Refusals of another principal's things must be the
answers an unknown id gets (404 / ``-32602``), byte for byte but for the id, so that
nothing tells a guessed id that exists from one that does not.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from acp_server.http import session_cursor
from acp_server.principals.tokens import issue
from tests.acp_http.server import RunningAcpServer, request
from tests.acp_http.wsclient import WsRejected, ws_connect
from tests.harness.local import local_server
from tests.lmsp.server import envelope
from tests.lmsp.stores import STORE_FACTORIES, current
from tests.principals.helpers import bearer, mint
from tests.rest.server import RunningServer, text_prompt

pytestmark = pytest.mark.anyio
BOOT = "boot-s3cret"
PERMISSION = "/permission please"   # the reference agent asks before it answers
INIT = request(0, "initialize", {"protocolVersion": 1})
Headers = dict[str, str]


class Doors(RunningAcpServer, RunningServer):
    """The REST and ``/acp`` helpers on one server."""


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, **settings: Any
                  ) -> AsyncIterator[tuple[Doors, dict[str, Headers]]]:
    """A server with a bootstrap token and five stored tokens: ``alice`` and ``bob``
    (prompt + read), ``reader`` (read), ``prompter`` (prompt), ``ops`` (admin); on the
    store the ``store_name`` fixture selects (SQLite without it)."""
    store = STORE_FACTORIES[current["name"]](tmp_path, "lmsp.sqlite3", True)
    async with local_server(tmp_path, kind=Doors, token=BOOT, headers=bearer(BOOT),
                            lmsp_store=store, **settings) as srv:
        people = {name: bearer(await mint(srv.server, name, *scopes, unlimited=True))
                  for name, scopes in (("alice", ()), ("bob", ()), ("reader", ("read",)),
                                       ("prompter", ("prompt",)), ("ops", ("admin",)))}
        yield srv, people


def raw(client: httpx.AsyncClient, path: str) -> httpx.URL:
    """``path`` sent as it is (httpx would normalise ``//`` and ``%2F`` otherwise)."""
    return client.base_url.copy_with(raw_path=path.encode())


def _protocol(token: str) -> str:
    return "qwen-bearer." + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def _token(headers: Headers) -> str:
    return headers["Authorization"].removeprefix("Bearer ")


async def _thread(srv: Doors, headers: Headers) -> str:
    made = await srv.client.post("/session", json={"sessionScope": "thread"}, headers=headers)
    assert made.status_code == 200, made.text
    return str(made.json()["sessionId"])


async def _workspace(srv: Doors) -> str:
    return str((await srv.client.get("/capabilities")).json()["workspaces"][0]["id"])


def assert_same_refusal(known: httpx.Response, unknown: httpx.Response, known_id: str,
                        unknown_id: str) -> None:
    """Another's id is refused exactly as an unknown id is: the same status, content
    type and body once the ids are swapped."""
    assert known.status_code == unknown.status_code, (known.text, unknown.text)
    assert known.headers.get("content-type") == unknown.headers.get("content-type")
    assert known.text.replace(known_id, "ID") == unknown.text.replace(unknown_id, "ID"), \
        (known.text, unknown.text)


# -- REST ---------------------------------------------------------------------------------
async def test_every_rest_route_of_anothers_session_is_an_unknown_id(tmp_path: Path) -> None:
    async with serving(tmp_path) as (srv, who):
        alice, bob = who["alice"], who["bob"]
        c = srv.client
        a = await _thread(srv, alice)
        asked = await c.post(f"/session/{a}/prompt", json=text_prompt(PERMISSION), headers=alice)
        assert asked.status_code == 202, asked.text
        frames = await srv.events_until(a, "permission_request", headers=alice,
                                        last_event_id=asked.json()["lastEventId"])
        request_id = frames[-1][1]["data"]["requestId"]
        queued = await c.post(f"/session/{a}/prompt", json=text_prompt("queued"), headers=alice)
        assert queued.status_code == 202, queued.text
        prompt_id = queued.json()["promptId"]
        unknown = str(uuid.uuid4())
        vote = {"outcome": {"outcome": "selected", "optionId": "allow_once"}}
        routes: list[tuple[str, str, Any]] = [
            ("GET", "/session/{}/status", None),
            ("GET", "/session/{}/events", None),
            ("GET", "/session/{}/pending-prompts", None),
            ("DELETE", "/session/{}/pending-prompts/" + prompt_id, None),
            ("POST", "/session/{}/prompt", text_prompt("mine now")),
            ("POST", "/session/{}/cancel", None),
            ("POST", "/session/{}/heartbeat", None),
            ("POST", "/session/{}/approval-mode", {"mode": "plan"}),
            ("POST", "/session/{}/model", {"modelId": "reference-large"}),
            ("POST", "/session/{}/config-option",
             {"configId": "reasoning_effort", "value": "high"}),
            ("POST", "/session/{}/branch", {}),
            ("POST", "/session/{}/load", {}),
            ("POST", "/session/{}/resume", {}),
            ("DELETE", "/session/{}", None),
            ("POST", "/session/{}/permission/" + request_id, vote),
            # the same routes spelled otherwise: a trailing slash, %2F for a slash
            ("GET", "/session/{}/status/", None),
            ("GET", "/session/{}%2Fstatus", None),
            ("POST", "/session/{}/prompt/", text_prompt("mine now")),
            ("POST", "/session/{}%2Fcancel", None),
            ("POST", "/session/{}%2Fprompt", text_prompt("mine now")),   # the hot path
        ]
        for method, template, body in routes:
            sent = {"json": body} if body is not None else {}
            mine = await c.request(method, raw(c, template.format(a)), headers=bob, **sent)
            none = await c.request(method, raw(c, template.format(unknown)), headers=bob,
                                   **sent)
            assert mine.status_code == 404, (method, template, mine.text)
            assert_same_refusal(mine, none, a, unknown)
        # the id's case, an empty or a dot segment: no route, or no session, never hers
        for path in (f"/session/{a.upper()}/status", f"/SESSION/{a}/status",
                     f"//session/{a}/status", f"/session//{a}/status",
                     f"/session/./{a}/status", f"/x/../session/{a}/status"):
            answer = await c.get(raw(c, path), headers=bob)
            assert answer.status_code == 404, (path, answer.text)
        # a session id asked for at creation: hers is 404, as an unknown one that is live
        taken = await c.post("/session", json={"sessionId": a}, headers=bob)
        assert (taken.status_code, taken.json()["code"]) == (404, "session_not_found")
        # the legacy vote by request id alone: as an unknown request
        legacy = await c.post(f"/permission/{request_id}", json=vote, headers=bob)
        other = await c.post("/permission/no-such-request", json=vote, headers=bob)
        assert_same_refusal(legacy, other, request_id, "no-such-request")
        # her prompt's and her request's ids on bob's own session: not his to touch
        b = await _thread(srv, bob)
        dropped = await c.delete(f"/session/{b}/pending-prompts/{prompt_id}", headers=bob)
        # as for a prompt his session never had (qwen's answer): nothing of hers told
        assert (dropped.status_code, dropped.json()) == (200, {"removed": False})
        voted = await c.post(f"/session/{b}/permission/{request_id}", json=vote, headers=bob)
        assert voted.status_code == 404, voted.text
        head = await c.head(f"/session/{a}/status", headers=bob)
        assert head.status_code == 404
        # nothing of it reached alice's session
        status = (await c.get(f"/session/{a}/status", headers=alice)).json()
        assert status["pendingInteractionCount"] == 1 and status["hasActivePrompt"]
        pending = await c.get(f"/session/{a}/pending-prompts", headers=alice)
        assert prompt_id in pending.text
        frames = await srv.events_until(a, lambda kind, _d: True, headers=alice,
                                        last_event_id=0)
        assert "mine now" not in json.dumps(frames)
        # and the admin (a token with the scope) may act on it
        assert (await c.get(f"/session/{a}/status", headers=who["ops"])).status_code == 200
        assert (await c.post(f"/session/{a}/permission/{request_id}", json=vote,
                             headers=who["ops"])).status_code == 200


async def test_listings_and_cursors_never_show_anothers_session(tmp_path: Path) -> None:
    async with serving(tmp_path) as (srv, who):
        alice, bob = who["alice"], who["bob"]
        c = srv.client
        a = [await _thread(srv, alice) for _ in range(3)]
        b = await _thread(srv, bob)
        wid = await _workspace(srv)

        async def walk(headers: Headers, cursor: str | None = None) -> list[str]:
            seen: list[str] = []
            while True:
                page = await c.get(f"/workspace/{wid}/sessions", headers=headers,
                                   params={"size": 1, **({"cursor": cursor} if cursor else {})})
                assert page.status_code == 200, page.text
                seen += [s["sessionId"] for s in page.json()["sessions"]]
                cursor = page.json().get("nextCursor")
                if cursor is None:
                    return seen

        assert await walk(bob) == [b]
        # a hand-made cursor (the canonical form: a position like any other) before
        # every session, and one from alice's own walk: still bob's own only
        first = session_cursor.encode(session_cursor.SessionKey(
            createdUs=session_cursor.MAX_CREATED_US, sessionHash="0" * 32))
        assert await walk(bob, first) == [b]
        hers = (await c.get(f"/workspace/{wid}/sessions", headers=alice,
                            params={"size": 1})).json()["nextCursor"]
        assert set(await walk(bob, hers)) <= {b}
        assert sorted(await walk(alice)) == sorted(a)
        # the same over /acp session/list (a WebSocket), with the forged cursor too
        async with ws_connect(srv.base_url, headers=bob) as ws:
            await ws.send_json(INIT)
            assert "result" in await ws.receive_json()
            for rpc_id, params in enumerate(({}, {"cursor": first}), start=1):
                await ws.send_json(request(rpc_id, "session/list", params))
                reply = await ws.wait_for(lambda m, i=rpc_id: m.get("id") == i)
                assert [s["sessionId"] for s in reply["result"]["sessions"]] == [b]
        # the console's daemon page counts, never names; /metrics names no session,
        # principal or token
        alice_id = _token(alice)[len("acps_"):len("acps_") + 16]
        for path in ("/daemon/status", "/metrics", "/whoami", "/capabilities",
                     "/openapi.json", "/health?deep=1"):
            answer = await c.get(path, headers=bob)
            assert answer.status_code in (200, 403), (path, answer.text)
            assert not any(sid in answer.text for sid in a), path
            assert alice_id not in answer.text and '"alice"' not in answer.text, path


# -- scopes, admin routes, dead credentials ---------------------------------------------
async def test_a_missing_scope_is_refused_on_every_door(tmp_path: Path) -> None:
    async with serving(tmp_path) as (srv, who):
        c = srv.client
        reader, prompter, alice = who["reader"], who["prompter"], who["alice"]
        mine = await _thread(srv, prompter)
        wid = await _workspace(srv)
        # read alone: nothing is made, prompted or answered, on any door
        writes = [await c.post("/session", json={"sessionScope": "thread"}, headers=reader),
                  await c.post(f"/session/{mine}/prompt", json=text_prompt("x"),
                               headers=reader),
                  await c.post("/lmsp/v1/tasks", json=envelope("x"), headers=reader),
                  await c.post("/lmsp/v1/responses", headers=reader,
                               json={"model": "reference", "input": "x"}),
                  await c.post("/acp", headers=reader,
                               json=request(1, "session/new", {"cwd": srv.workspace,
                                                               "mcpServers": []}))]
        assert [r.status_code for r in writes] == [403] * len(writes), [r.text for r in writes]
        assert writes[0].json()["requiredScope"] == "prompt"
        assert writes[2].json()["code"] == "forbidden"
        assert writes[4].json()["error"]["data"]["errorKind"] == "forbidden"
        async with ws_connect(srv.base_url, headers=reader) as ws:
            await ws.send_json(INIT)
            assert "result" in await ws.receive_json()
            await ws.send_json(request(1, "session/new", {"cwd": srv.workspace,
                                                          "mcpServers": []}))
            refused = await ws.wait_for(lambda m: m.get("id") == 1)
            assert refused["error"]["data"]["errorKind"] == "forbidden"
            await ws.send_json(request(2, "session/list", {}))   # the socket stays open
            assert "result" in await ws.wait_for(lambda m: m.get("id") == 2)
        # prompt alone: nothing is read back, on any door
        reads = [await c.get(f"/session/{mine}/events", headers=prompter),
                 await c.get(f"/session/{mine}/status", headers=prompter),
                 await c.get(f"/workspace/{wid}/sessions", headers=prompter),
                 await c.get(f"/workspace/{wid}/ended-sessions", headers=prompter),
                 await c.get("/lmsp/v1/tasks", headers=prompter)]
        assert [r.status_code for r in reads] == [403] * len(reads), [r.text for r in reads]
        conn, _ = await srv.initialize(**prompter)
        stream = await c.get("/acp", headers={"Acp-Connection-Id": conn, **prompter})
        assert stream.status_code == 403
        # the admin routes, however spelled, for a token without ``admin``
        for method, path in (("GET", "/tokens"), ("POST", "/tokens"), ("GET", "/tokens/"),
                             ("GET", "/tokens%2F"), ("GET", "/%74okens"),
                             ("DELETE", "/tokens/bob"), ("DELETE", "/tokens/bob/"),
                             ("DELETE", "/tokens%2Fbob"), ("GET", "/audit"),
                             ("GET", "/audit/"), ("GET", "/audit?principal=bob"),
                             ("GET", "/TOKENS"), ("GET", "/Audit"), ("GET", "//tokens"),
                             ("POST", "/tokens/"), ("GET", "/tokens/../tokens")):
            sent = {"json": {"name": "mine", "scopes": ["admin"]}} if method == "POST" else {}
            answer = await c.request(method, raw(c, path), headers=alice, **sent)
            assert answer.status_code in (403, 404), (method, path, answer.text)
        listed = (await c.get("/tokens", headers=who["ops"])).json()["tokens"]
        assert {t["name"] for t in listed} == {"alice", "bob", "reader", "prompter", "ops"}


async def test_expired_revoked_and_spliced_credentials_are_one_401(tmp_path: Path) -> None:
    async with serving(tmp_path) as (srv, who):
        c = srv.client
        gate = srv.server.gate
        now = time.time()
        expired = issue("late", by="bootstrap", now=now - 3600, expires_in_s=60)
        await gate._store.create_token(expired.record)
        revoked = await mint(srv.server, "gone")
        sid = await _thread(srv, bearer(revoked))
        assert (await c.delete("/tokens/gone")).status_code == 200
        alice, bob = _token(who["alice"]), _token(who["bob"])
        spliced = alice[:len("acps_") + 16] + bob[len("acps_") + 16:]   # alice's id, bob's secret
        dead = [expired.token, revoked, spliced, BOOT + "x", BOOT[:-1], BOOT.upper(),
                alice + "x", alice[:-1], "acps_" + "0" * 16 + "_" + "x" * 43]
        paths = [("GET", "/whoami"), ("GET", f"/session/{sid}/status"),
                 ("POST", "/session"), ("GET", "/lmsp/v1/tasks"), ("POST", "/acp"),
                 ("GET", "/tokens"), ("GET", "/daemon/status")]
        for credential in dead:
            for method, path in paths:
                answer = await c.request(method, path, json={},
                                         headers={"Authorization": f"Bearer {credential}"})
                assert answer.status_code == 401, (credential, path, answer.text)
            with pytest.raises(WsRejected) as refused:
                async with ws_connect(srv.base_url, subprotocols=[_protocol(credential)]):
                    pass
            assert refused.value.status == 401
        # other schemes and placements carry nothing
        for headers in ({"Authorization": f"Basic {alice}"}, {"Authorization": alice},
                        {"Authorization": f"Token {alice}"}, {"X-Api-Key": alice},
                        {"Cookie": f"token={alice}"}):
            answer = await c.get("/whoami", headers={"Authorization": "", **headers})
            assert answer.status_code == 401, (headers, answer.text)
        # a token re-created under the revoked name is a new credential: the old one
        # stays refused, and the name's sessions stay the name's
        again = await mint(srv.server, "gone")
        assert (await c.get("/whoami", headers=bearer(revoked))).status_code == 401
        assert (await c.get(f"/session/{sid}/status", headers=bearer(again))).status_code == 200


async def test_a_websocket_token_counts_only_in_the_bearer_places(tmp_path: Path) -> None:
    async with serving(tmp_path) as (srv, who):
        alice = _token(who["alice"])
        a = await _thread(srv, who["alice"])
        b = await _thread(srv, who["bob"])
        for path in (f"/acp?token={alice}", f"/acp?access_token={alice}",
                     f"/acp?authorization=Bearer%20{alice}", f"/acp?token={BOOT}"):
            with pytest.raises(WsRejected) as refused:
                async with ws_connect(srv.base_url, path):
                    pass
            assert refused.value.status == 401, path
        for protocols in (["qwen-bearer", alice], [f"bearer.{alice}"], [alice],
                          [f"qwen-bearer.{alice}"]):   # not base64url: not her token
            with pytest.raises(WsRejected) as refused:
                async with ws_connect(srv.base_url, subprotocols=protocols):
                    pass
            assert refused.value.status == 401, protocols
        # the bearer subprotocol is its token's principal: alice, never more
        async with ws_connect(srv.base_url, subprotocols=[_protocol(alice)]) as ws:
            await ws.send_json(INIT)
            assert "result" in await ws.receive_json()
            await ws.send_json(request(1, "session/list", {}))
            listed = await ws.wait_for(lambda m: m.get("id") == 1)
            assert [s["sessionId"] for s in listed["result"]["sessions"]] == [a]
            await ws.send_json(request(2, "session/load", {
                "sessionId": b, "cwd": srv.workspace, "mcpServers": []}))
            assert (await ws.wait_for(lambda m: m.get("id") == 2))["error"]["code"] == -32602
        # a bearer header that fails does not fall back to an admin's subprotocol on HTTP
        answer = await srv.client.get("/tokens", headers={
            "Authorization": f"Bearer {alice}", "Sec-WebSocket-Protocol": _protocol(BOOT)})
        assert answer.status_code == 403
        nothing = await srv.client.get("/whoami", headers={
            "Authorization": "", "Sec-WebSocket-Protocol": _protocol(BOOT)})
        assert nothing.status_code == 401


# -- LMSP ---------------------------------------------------------------------------------
@pytest.mark.usefixtures("store_name")
async def test_lmsp_tasks_responses_streams_and_keys_stay_their_makers(tmp_path: Path) -> None:
    async with serving(tmp_path) as (srv, who):
        alice, bob = who["alice"], who["bob"]
        c = srv.client
        key = {"Idempotency-Key": "same-key-for-everyone"}
        held = await c.post("/lmsp/v1/tasks", json=envelope("/sleep 60s held"),
                            headers={**alice, **key})
        assert held.status_code == 202, held.text
        tid = held.json()["id"]
        done = await c.post("/lmsp/v1/responses", headers={**alice, **key},
                            json={"model": "reference", "input": "secret words"})
        assert done.status_code == 200, done.text
        rid = done.json()["id"]
        task_of_rid = (await c.get("/lmsp/v1/tasks", headers=alice)).json()["data"]
        done_tid = next(t["id"] for t in task_of_rid if t["response_id"] == rid)
        # bob's reads, streams (every cursor), cancels and deletes: as unknown ids
        unknown_task, unknown_resp = "task_" + "0" * 26, "resp_" + "0" * 26
        for method, template, extra in (
                ("GET", "/lmsp/v1/tasks/{}", {}),
                ("GET", "/lmsp/v1/tasks/{}/events", {}),
                ("GET", "/lmsp/v1/tasks/{}/events", {"headers": {"Last-Event-ID": "0"}}),
                ("GET", "/lmsp/v1/tasks/{}/events?starting_after=0", {}),
                ("GET", "/lmsp/v1/tasks/{}/events?starting_after=1", {}),
                ("POST", "/lmsp/v1/tasks/{}/cancel", {}),
                ("GET", "/lmsp/v1/tasks/{}/", {})):
            for target in (tid, done_tid):
                sent = {**bob, **extra.get("headers", {})}
                mine = await c.request(method, template.format(target), headers=sent)
                none = await c.request(method, template.format(unknown_task), headers=sent)
                assert mine.status_code == 404, (template, mine.text)
                assert_same_refusal(mine, none, target, unknown_task)
        for method, template in (("GET", "/lmsp/v1/responses/{}"),
                                 ("GET", "/lmsp/v1/responses/{}?stream=true"),
                                 ("GET", "/lmsp/v1/responses/{}?stream=true&starting_after=0"),
                                 ("POST", "/lmsp/v1/responses/{}/cancel"),
                                 ("DELETE", "/lmsp/v1/responses/{}")):
            mine = await c.request(method, template.format(rid), headers=bob)
            none = await c.request(method, template.format(unknown_resp), headers=bob)
            assert mine.status_code == 404, (template, mine.text)
            assert_same_refusal(mine, none, rid, unknown_resp)
        went_on = await c.post("/lmsp/v1/responses", headers=bob, json={
            "model": "reference", "input": "go on", "previous_response_id": rid})
        none = await c.post("/lmsp/v1/responses", headers=bob, json={
            "model": "reference", "input": "go on", "previous_response_id": unknown_resp})
        assert went_on.status_code == 404
        assert_same_refusal(went_on, none, rid, unknown_resp)
        # alice's Idempotency-Key sent by bob: another body is no 422 (that would tell
        # the key is in use), her very body is bob's own new task, never hers replayed
        other = await c.post("/lmsp/v1/responses", headers={**bob, **key},
                             json={"model": "reference", "input": "something else"})
        assert other.status_code == 200, other.text
        assert other.json()["id"] != rid and other.headers.get("idempotent-replayed") is None
        assert "secret words" not in other.text
        queued = await c.post("/lmsp/v1/tasks", json=envelope("/sleep 60s held"),
                              headers={**bob, **key})
        assert queued.status_code == 202 and queued.json()["id"] != tid
        assert queued.headers.get("idempotent-replayed") is None
        again = await c.post("/lmsp/v1/responses", headers={**bob, **key},
                             json={"model": "reference", "input": "something else"})
        assert again.json()["id"] == other.json()["id"]   # bob's key replays bob's own
        assert again.headers.get("idempotent-replayed") == "true"
        hers = await c.post("/lmsp/v1/responses", headers={**alice, **key},
                            json={"model": "reference", "input": "secret words"})
        assert hers.json()["id"] == rid   # and alice's hers
        # listings: bob's own only, whatever the anchor (alice's ids are places in time,
        # as a deleted id is)
        bobs = {t["id"] for t in (await c.get("/lmsp/v1/tasks", headers=bob)).json()["data"]}
        assert tid not in bobs and done_tid not in bobs and queued.json()["id"] in bobs
        for anchor in (tid, done_tid):
            page = await c.get("/lmsp/v1/tasks", params={"after": anchor}, headers=bob)
            assert page.status_code == 200
            assert {t["id"] for t in page.json()["data"]} <= bobs
        for status in ("running", "queued", "loading", "succeeded", "in_progress"):
            page = await c.get("/lmsp/v1/tasks", params={"status": status}, headers=bob)
            assert {t["id"] for t in page.json().get("data", [])} <= bobs
        # alice's task runs on, untouched; the admin may end both
        assert (await c.get(f"/lmsp/v1/tasks/{tid}", headers=alice)).json()["status"] in (
            "queued", "loading", "running")
        for task in (tid, queued.json()["id"]):
            assert (await c.post(f"/lmsp/v1/tasks/{task}/cancel", headers=who["ops"])
                    ).status_code == 200


# -- /acp ---------------------------------------------------------------------------------
async def test_acp_connections_and_streams_of_another_principal(tmp_path: Path) -> None:
    async with serving(tmp_path) as (srv, who):
        alice, bob = who["alice"], who["bob"]
        c = srv.client
        a_conn, _ = await srv.initialize(**alice)
        b_conn, _ = await srv.initialize(**bob)
        unknown = str(uuid.uuid4())
        async with srv.stream(a_conn, **alice) as mine:
            assert (await srv.post(a_conn, request(1, "session/new", {
                "cwd": srv.workspace, "mcpServers": []}), **alice)).status_code == 202
            a = (await mine.wait_for_id(1))["result"]["sessionId"]
            # bob naming alice's connection: every method is 404, as an unknown one
            for method in ("GET", "POST", "DELETE"):
                sent = {"content": json.dumps(request(5, "session/list", {}))} \
                    if method == "POST" else {}
                for conn in (a_conn, unknown):
                    answer = await c.request(method, "/acp", headers={
                        **bob, "Acp-Connection-Id": conn, "Content-Type": "application/json",
                        "Accept": "application/json, text/event-stream"},
                        **sent)
                    assert answer.status_code == 404, (method, answer.text)
                    assert answer.json()["error"]["message"] == "Unknown Acp-Connection-Id"
            # the admin's token does not take alice's connection over either
            assert (await c.request("DELETE", "/acp", headers={
                **who["ops"], "Acp-Connection-Id": a_conn})).status_code == 404
            # alice's connection lives on: her next request is answered on her stream
            assert (await srv.post(a_conn, request(6, "session/list", {}), **alice)
                    ).status_code == 202
            assert [s["sessionId"] for s in (await mine.wait_for_id(6))["result"]["sessions"]
                    ] == [a]
        # bob's own connection: alice's session by every method (HTTP), as unknown
        async with srv.stream(b_conn, **bob) as theirs:
            for rpc_id, (method, params) in enumerate((
                    ("session/load", {"sessionId": a, "cwd": srv.workspace,
                                      "mcpServers": [],
                                      "_meta": {"acp-server/lastEventId": 0}}),
                    ("session/resume", {"sessionId": a, "cwd": srv.workspace,
                                        "mcpServers": []}),
                    ("session/fork", {"sessionId": a, "cwd": srv.workspace}),
                    ("session/delete", {"sessionId": a}),
                    ("session/set_config_option", {"sessionId": a, "configId": "x",
                                                   "value": "y"}),
                    ("session/permission", {"sessionId": a, "requestId": "r1",
                                            "outcome": {"outcome": "cancelled"}}),
                    ("$/cancel_request", {"requestId": 1})), start=10):
                for offset, sid in enumerate((a, unknown)):
                    named = {**params, **({"sessionId": sid} if "sessionId" in params else {})}
                    number = rpc_id + 100 * offset
                    assert (await srv.post(b_conn, request(number, method, named), sid,
                                           **bob)).status_code in (200, 202)
                    reply = await theirs.wait_for(lambda m, i=number: m.get("id") == i)
                    reply = {**reply, "id": rpc_id}
                    if sid == a:
                        seen = reply
                    else:
                        assert json.dumps(seen).replace(a, "ID") == \
                            json.dumps(reply).replace(unknown, "ID"), method
            # bob's stream carried his replies only: no update or request of alice's
            assert all("method" not in m for m in theirs.messages), theirs.messages
        # a session stream of hers asked from the start of its ring (Last-Event-ID 0,
        # her epoch): it opens as one of an unknown id does, and carries nothing of hers
        epoch = (await c.get(f"/session/{a}/status", headers=alice)).json()["eventEpoch"]
        cursor = {"Last-Event-ID": "0", "X-Qwen-Event-Epoch": epoch}
        async with srv.stream(b_conn, a, **bob, **cursor) as peek:
            said = await c.post(f"/session/{a}/prompt", json=text_prompt("words of hers"),
                                headers=alice)
            assert said.status_code == 202, said.text
            frames = await srv.events_until(a, "turn_complete", headers=alice,
                                            last_event_id=0)
            assert "words of hers" in json.dumps(frames)
        assert peek.messages == []
        assert not any(channel.subscription is not None
                       for channel in srv.registry.get(b_conn).channels.values())
        # alice's session is whole and still hers
        assert (await c.get(f"/session/{a}/status", headers=alice)).status_code == 200
        assert (await c.get(f"/session/{a}/status", headers=bob)).status_code == 404
