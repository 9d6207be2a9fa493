"""review8's findings on principals, each reproduced over real loopback HTTP."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from acp_server.principals import BOOTSTRAP
from acp_server.principals.tokens import issue
from acp_server.store.tokens import TokenRecord
from tests.acp_http.server import request, running_acp_server
from tests.acp_http.wsclient import WsRejected, ws_connect
from tests.lmsp.server import envelope
from tests.principals.helpers import bearer, mint

pytestmark = pytest.mark.anyio
BOOT = "boot-s3cret"
PROMPT = {"prompt": [{"type": "text", "text": "hi"}]}


def serving(tmp_path: Path, **settings: object):
    return running_acp_server(tmp_path, token=BOOT, headers=bearer(BOOT), **settings)


def raw(client: httpx.AsyncClient, path: str) -> httpx.URL:
    """``path`` sent as it is (httpx would not send ``//tokens`` otherwise)."""
    return client.base_url.copy_with(raw_path=path.encode())


async def test_a_path_with_empty_segments_is_404_not_another_routes_access(
        tmp_path: Path) -> None:
    async with serving(tmp_path) as srv:
        c = srv.client
        reader = bearer(await mint(srv.server, "reader", "read"))
        alice = bearer(await mint(srv.server, "alice"))          # prompt + read
        assert (await c.get("/tokens", headers=reader)).status_code == 403
        for path in ("//tokens", "//audit", "/tokens//", "//tokens/", "/%2Ftokens"):
            answer = await c.get(raw(c, path), headers=reader)
            assert (answer.status_code, answer.json()) == (404, {"error": "Not Found"}), path
        for path in ("/./tokens", "/x/../tokens"):   # a client may resolve dots first
            answer = await c.get(raw(c, path), headers=reader)
            assert answer.status_code in (403, 404), path
        made = await c.post(raw(c, "//tokens"), headers=alice,
                            json={"name": "mine", "scopes": ["admin"]})
        assert made.status_code == 404
        gone = await c.delete(raw(c, "//tokens/reader"), headers=alice)
        assert gone.status_code == 404
        # each door answers in its own shape; no credential is still a 401 first
        lmsp = await c.get(raw(c, "/lmsp/v1//tasks"), headers=alice)
        assert lmsp.status_code == 404 and lmsp.json()["code"] == "not_found"
        assert lmsp.headers["content-type"].startswith("application/problem+json")
        acp = await c.post(raw(c, "/acp/"), headers=alice, json={})
        assert acp.status_code != 404   # /acp/ is /acp (the message is refused there)
        bare = await c.get(raw(c, "//tokens"), headers={"Authorization": ""})
        assert bare.status_code == 401
        listed = await c.get("/tokens")
        assert {t["name"] for t in listed.json()["tokens"]} == {"reader", "alice"}


async def test_a_trailing_slash_is_the_same_route_and_rate_class(tmp_path: Path) -> None:
    async with serving(tmp_path, rate_limit_prompt=1) as srv:
        c = srv.client
        ci = bearer(await mint(srv.server, "ci"))
        sid = (await c.post("/session", json={"sessionScope": "thread"},
                            headers=ci)).json()["sessionId"]
        assert (await c.post(f"/session/{sid}/prompt", json=PROMPT,
                             headers=ci)).status_code == 202
        for path in (f"/session/{sid}/prompt/", f"/session/{sid}/prompt%2F",
                     f"/session/{sid}%2Fprompt"):
            answer = await c.post(raw(c, path), json=PROMPT, headers=ci)
            assert (answer.status_code, answer.json()["code"]) == (429, "rate_limit_exceeded")
        for path in ("/lmsp/v1/tasks/", "/lmsp/v1/tasks%2F"):
            task = await c.post(raw(c, path), json=envelope("x"), headers=ci)
            assert task.status_code == 429, path
        # the same route: a status read with a trailing slash answers as without
        status = await c.get(f"/session/{sid}/status/", headers=ci)
        assert status.status_code == 200 and status.json()["sessionId"] == sid


INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}


async def test_a_recreated_token_name_does_not_inherit_the_old_tokens_connection(
        tmp_path: Path) -> None:
    async with serving(tmp_path) as srv:
        c = srv.client
        bob = bearer(await mint(srv.server, "bob"))
        sid = (await c.post("/session", json={"sessionScope": "thread"},
                            headers=bob)).json()["sessionId"]
        old = bearer((await c.post("/tokens", json={"name": "rot", "scopes": ["admin"]})
                      ).json()["token"])
        cid = (await c.post("/acp", json=INIT, headers=old)).headers["acp-connection-id"]
        assert (await c.delete("/tokens/rot")).status_code == 200
        new = bearer((await c.post("/tokens", json={"name": "rot", "scopes": ["prompt", "read"]})
                      ).json()["token"])
        on_old = {**new, "Acp-Connection-Id": cid}
        for method, params in (("session/cancel", {"sessionId": sid}), ("session/list", {})):
            answer = await c.post("/acp", headers=on_old, json={
                "jsonrpc": "2.0", "id": 1, "method": method, "params": params})
            assert answer.status_code == 404, (method, answer.text)
            assert answer.json()["error"]["message"] == "Unknown Acp-Connection-Id"
        stream = await c.get("/acp", headers={**on_old, "Accept": "text/event-stream"})
        assert stream.status_code == 404
        await srv.server.gate.audit.flush()
        records = (await c.get("/audit?principal=rot&action=session.cancelled")).json()
        assert records["records"] == []


async def test_unknown_agent_names_pin_no_lock_and_are_not_echoed_whole(
        tmp_path: Path) -> None:
    async with serving(tmp_path) as srv:
        alice = bearer(await mint(srv.server, "alice", unlimited=True))
        name = "nope-" + "x" * 100_000
        for i in range(20):
            answer = await srv.client.post("/session", json={"agent": f"{i}{name}"},
                                           headers=alice)
            assert (answer.status_code, answer.json()["code"]) == (400, "agent_not_found")
            assert len(answer.content) < 1_000
        assert srv.server.gate.sessions._locks == {}
        made = await srv.client.post("/session", json={}, headers=alice)
        again = await srv.client.post("/session", json={}, headers=alice)
        assert made.status_code == again.status_code == 200
        assert made.json()["sessionId"] == again.json()["sessionId"]   # one default
        assert srv.server.gate.sessions._locks == {}


async def test_a_live_session_nobody_owns_is_not_loaded_by_a_non_admin(
        tmp_path: Path) -> None:
    async with serving(tmp_path) as srv:
        c = srv.client
        alice = bearer(await mint(srv.server, "alice"))
        mallory = bearer(await mint(srv.server, "mallory", unlimited=True))
        bridge = srv.server.bridge
        task = await c.post("/lmsp/v1/tasks", headers=alice,
                            json=envelope("/sleep 60s alice's private text"))
        assert task.status_code == 202, task.text
        with anyio.fail_after(20):   # the runner's session, live and ownerless
            while not [s for s in bridge.list_sessions()
                       if bridge.session_owner(s.session_id) is None]:
                await anyio.sleep(0.02)
        sid = next(s.session_id for s in bridge.list_sessions()
                   if bridge.session_owner(s.session_id) is None)
        for path, body in ((f"/session/{sid}/load", {}), (f"/session/{sid}/resume", {}),
                           ("/session", {"sessionId": sid})):
            answer = await c.post(path, json=body, headers=mallory)
            assert (answer.status_code, answer.json()["code"]) == (404, "session_not_found"), path
            assert "private" not in answer.text
        assert (await c.get(f"/session/{sid}/status", headers=mallory)).status_code == 404
        assert srv.server.gate.sessions.owner(sid) is None
        admin = await c.post(f"/session/{sid}/load", json={})   # the bootstrap admin sees it
        assert admin.status_code == 200 and "private" in admin.text
        assert srv.server.gate.sessions.owner(sid) is None      # attached: not claimed
        await c.post(f"/lmsp/v1/tasks/{task.json()['id']}/cancel", headers=alice)


async def test_head_acp_closes_nothing(tmp_path: Path) -> None:
    async with serving(tmp_path) as srv:
        c = srv.client
        alice = bearer(await mint(srv.server, "alice"))
        cid = (await c.post("/acp", json=INIT, headers=alice)).headers["acp-connection-id"]
        on_conn = {**alice, "Acp-Connection-Id": cid}
        head = await c.head("/acp", headers=on_conn)
        assert head.status_code == 405 and head.headers["allow"] == "GET, POST, DELETE"
        after = await c.post("/acp", headers=on_conn, json={
            "jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}})
        assert after.status_code == 202
        prompt_only = bearer(await mint(srv.server, "bot", "prompt"))
        assert (await c.head("/acp", headers=prompt_only)).status_code == 403
        assert (await c.delete("/acp", headers=on_conn)).status_code == 202


async def test_a_huge_expiry_is_refused_and_an_old_huge_row_lists(tmp_path: Path) -> None:
    async with serving(tmp_path) as srv:
        c = srv.client
        for expires in ("99999999999999d", "1" * 400 + "s", "101y", "36501d"):
            made = await c.post("/tokens", json={"name": "forever", "expires": expires})
            assert (made.status_code, made.json()["code"]) == (400, "invalid_token_request")
            assert len(made.text) < 300
        assert (await c.post("/tokens", json={"name": "long", "expires": "36500d"})
                ).status_code == 201
        # a row stored before the cap: listed, revoked and listed again without a 500
        await srv.server.gate._store.create_token(TokenRecord(
            id="0123456789abcdef", name="old", secret_sha256="0" * 64, scopes=("read",),
            rate_class="default", created_at=1.0, created_by="bootstrap", expires_at=1e300))
        listed = await c.get("/tokens")
        assert listed.status_code == 200
        old = next(t for t in listed.json()["tokens"] if t["name"] == "old")
        assert old["expiresAt"] == "9999-12-31T23:59:59Z"
        assert (await c.delete("/tokens/old")).status_code == 200
        assert (await c.get("/tokens?all=true")).status_code == 200


async def test_a_trailing_newline_fails_the_name_check(tmp_path: Path) -> None:
    async with serving(tmp_path) as srv:
        for name in ("bootstrap\n", "ci\n", "local\n"):
            made = await srv.client.post("/tokens", json={"name": name})
            assert (made.status_code, made.json()["code"]) == (400, "invalid_token_request")
        assert (await srv.client.get("/tokens")).json()["tokens"] == []



def _protocol(token: str) -> str:
    return "qwen-bearer." + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


async def test_a_websocket_handshake_reads_the_store_for_its_first_bearer_entry_only(
        tmp_path: Path) -> None:
    async with serving(tmp_path) as srv:
        alice = await mint(srv.server, "alice")
        store = srv.server.gate.authenticator.store
        reads: list[str] = []
        read = store.get_token

        async def counted(token_id: str) -> Any:
            reads.append(token_id)
            return await read(token_id)

        store.get_token = counted
        junk = [_protocol(f"acps_{i:016x}_x") for i in range(100)]
        with pytest.raises(WsRejected) as refused:
            async with ws_connect(srv.base_url, subprotocols=[*junk, _protocol(alice)]):
                pass
        assert refused.value.status == 401 and len(reads) <= 1
        reads.clear()
        async with ws_connect(srv.base_url, subprotocols=[_protocol(alice), *junk]) as ws:
            assert ws.subprotocol is None   # the credential is never echoed back
            await ws.send_json(INIT)
            assert "result" in await ws.receive_json()
        assert len(reads) <= 1



@pytest.mark.parametrize("where", ["this instance", "another process"])
async def test_local_sockets_end_when_a_first_credential_is_configured(
        tmp_path: Path, where: str) -> None:
    async with running_acp_server(tmp_path) as srv:   # no credential: loopback is local
        gate = srv.server.gate
        async with ws_connect(srv.base_url) as one, ws_connect(srv.base_url) as two:
            for ws in (one, two):
                await ws.send_json(INIT)
                assert "result" in await ws.receive_json()
            if where == "this instance":
                await gate.create_token(gate.caller(BOOTSTRAP), "first")
            else:   # the store alone: the periodic check sees it (every 0.5 s)
                await gate._store.create_token(issue("first", by="cli", now=time.time()).record)
            assert await one.wait_closed() == 1008
            assert await two.wait_closed() == 1008
        with pytest.raises(WsRejected) as refused:
            async with ws_connect(srv.base_url):
                pass
        assert refused.value.status == 401


async def test_local_event_streams_end_when_a_first_credential_is_configured(
        tmp_path: Path) -> None:
    async with running_acp_server(tmp_path) as srv:
        c = srv.client
        sid = (await c.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
        async with c.stream("GET", f"/session/{sid}/events") as events:
            assert events.status_code == 200
            made = await c.post("/tokens", json={"name": "first"})   # local, the admin
            assert made.status_code == 201
            with anyio.fail_after(30):
                async for _ in events.aiter_raw():
                    pass   # ends: the stream was cut
        assert (await c.get("/capabilities")).status_code == 401


async def test_a_local_streamed_post_answer_ends_when_a_first_credential_is_configured(
        tmp_path: Path) -> None:
    """An LMSP ``stream: true`` response the local principal opened while no
    credential existed ends once one is made, like its GET streams (review9)."""
    async with running_acp_server(tmp_path) as srv:
        c = srv.client
        async with c.stream("POST", "/lmsp/v1/responses", json={
                "model": "reference", "input": "/sleep 600s hold", "stream": True}) as answer:
            assert answer.status_code == 200
            lines = answer.aiter_lines()
            with anyio.fail_after(10):
                async for line in lines:   # the stream runs: its first event came
                    if line.startswith("data: "):
                        break
            made = await c.post("/tokens", json={"name": "first"})   # local, the admin
            assert made.status_code == 201, made.text
            with anyio.fail_after(30):
                async for _ in lines:
                    pass   # ends: the answer was cut
        assert (await c.get("/capabilities")).status_code == 401


async def test_a_closed_session_forgotten_past_the_owner_caches_stays_its_makers(
        tmp_path: Path) -> None:
    """review8's 15: the makers of closed sessions are cached (50,000 each in the
    bridge and the gate); past that, a cold ``/load`` (REST, ``/acp``) or a create
    naming the id reads the maker from the journal's record: another principal gets
    404 and never becomes the owner; the maker loads it."""
    async with serving(tmp_path) as srv:
        c, bridge, owners = srv.client, srv.server.bridge, srv.server.gate.sessions
        alice = bearer(await mint(srv.server, "alice"))
        mallory = bearer(await mint(srv.server, "mallory", unlimited=True))
        made = await c.post("/session", json={"sessionScope": "thread"}, headers=alice)
        sid = made.json()["sessionId"]
        sent = await c.post(f"/session/{sid}/prompt", headers=alice, json={
            "prompt": [{"type": "text", "text": "alice's private text"}]})
        assert sent.status_code == 202
        with anyio.fail_after(10):
            while bridge.session_status(sid).pending_prompts:
                await anyio.sleep(0.02)
        await bridge.close_session(sid, reason="idle")   # closed, its journal kept
        bridge._closed_owners.clear()   # both caches forgot it (50,000 closed since)
        owners._owners.clear()
        for path, body in ((f"/session/{sid}/load", {}), (f"/session/{sid}/resume", {}),
                           ("/session", {"sessionId": sid})):
            answer = await c.post(path, json=body, headers=mallory)
            assert (answer.status_code, answer.json()["code"]) == (404, "session_not_found"), \
                (path, answer.text)
            assert "private" not in answer.text
        m_headers = mallory
        conn, _ = await srv.initialize(**m_headers)
        async with srv.stream(conn, **m_headers) as stream:
            for rpc_id, method in enumerate(("session/load", "session/resume"), start=1):
                bridge._closed_owners.clear()
                owners._owners.clear()
                sent = await srv.post(conn, request(rpc_id, method, {
                    "sessionId": sid, "cwd": srv.workspace, "mcpServers": []}), **m_headers)
                assert sent.status_code == 202
                reply = await stream.wait_for_id(rpc_id)
                assert reply["error"]["code"] == -32602, (method, reply)
        assert not bridge.has_session(sid)          # nothing was restored for mallory
        assert owners.owner(sid) == "alice"
        mine = await c.post(f"/session/{sid}/load", json={}, headers=alice)
        assert mine.status_code == 200, mine.text
        assert "private" in mine.text
