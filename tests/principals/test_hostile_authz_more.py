"""The hostile authorization pass, continued (``test_hostile_authz``: the helpers and
the doors' routes): ended sessions and their cursors, a restore raced by another
principal, several instances, an expiring token, the per-workspace mounts, the shipped
daemon's path spellings, forged forwarding headers, and a web page against the local
admin. Each test is one attack, asserted on what the attacker's client sees."""

from __future__ import annotations

import base64
import json
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from acp_server.http import ended_cursor
from bridge.agents.reference import ReferenceAgentFactory
from bridge.agents.reference_agent import SessionStore
from tests.acp_http.server import request, text
from tests.acp_http.wsclient import WsRejected, ws_connect
from tests.harness import ServeProcess
from tests.harness.local import local_server
from tests.lmsp.server import envelope
from tests.lmsp import stores
from tests.principals.helpers import bearer, mint
from tests.rest.server import text_prompt
from tests.principals.test_hostile_authz import (BOOT, INIT, PERMISSION, Doors, Headers,
                                                 _thread, _workspace, assert_same_refusal, raw,
                                                 serving)

pytestmark = pytest.mark.anyio


# -- ended sessions -----------------------------------------------------------------------
async def _ended_acp_sessions(srv: Doors, headers: Headers, count: int) -> list[str]:
    """``count`` sessions made over ``/acp`` and ended (kept by the journal) by the
    deletion of their connection, one connection each, so each ends apart."""
    made = []
    for _ in range(count):
        conn, _ = await srv.initialize(**headers)
        async with srv.stream(conn, **headers) as stream:
            assert (await srv.post(conn, request(1, "session/new", {
                "cwd": srv.workspace, "mcpServers": []}), **headers)).status_code == 202
            made.append((await stream.wait_for_id(1))["result"]["sessionId"])
        gone = await srv.client.request("DELETE", "/acp",
                                        headers={"Acp-Connection-Id": conn, **headers})
        assert gone.status_code == 202
    return made


async def _ended_walk(srv: Doors, wid: str, headers: Headers,
                      cursor: str | None = None) -> tuple[list[str], list[str]]:
    """Every session of the ended listing, and every cursor it handed out."""
    seen: list[str] = []
    cursors: list[str] = []
    while True:
        page = await srv.client.get(f"/workspace/{wid}/ended-sessions", headers=headers,
                                    params={"size": 1, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200, page.text
        seen += [s["sessionId"] for s in page.json()["sessions"]]
        cursor = page.json().get("nextCursor")
        if cursor is None:
            return seen, cursors
        cursors.append(cursor)


async def _ended_committed(srv: Doors, wid: str, expected: set[str]) -> None:
    """Once the admin lists exactly ``expected`` (a close is journaled behind its answer)."""
    with anyio.fail_after(30):
        while set((await _ended_walk(srv, wid, bearer(BOOT)))[0]) != expected:
            await anyio.sleep(0.01)


@pytest.mark.usefixtures("store_name")
async def test_ended_sessions_of_another_are_not_listed_loaded_or_deleted(
        tmp_path: Path) -> None:
    async with serving(tmp_path) as (srv, who):
        alice, bob = who["alice"], who["bob"]
        c = srv.client
        wid = await _workspace(srv)
        hers = await _ended_acp_sessions(srv, alice, 2)
        his = await _ended_acp_sessions(srv, bob, 1)
        await _ended_committed(srv, wid, {*hers, *his})
        assert (await _ended_walk(srv, wid, bob))[0] == his
        assert sorted((await _ended_walk(srv, wid, alice))[0]) == sorted(hers)
        # a hand-made cursor just before the newest of hers and his (whatever the time
        # between them): still bob's own only
        ends = []
        for caller in (alice, bob):
            page = (await c.get(f"/workspace/{wid}/ended-sessions", headers=caller)).json()
            ends.append(time.mktime(time.strptime(page["sessions"][0]["endedAt"][:19],
                                                  "%Y-%m-%dT%H:%M:%S")) - time.timezone)
        at = max(ends) + 1.0
        forged = ended_cursor.encode((at, "f" * 36))
        assert (await _ended_walk(srv, wid, bob, forged))[0] == his
        unknown = str(uuid.uuid4())
        for sid in hers:
            for method, path, body in (("DELETE", "/session/{}", None),
                                       ("POST", "/session/{}/load", {}),
                                       ("POST", "/session/{}/resume", {}),
                                       ("GET", "/session/{}/status", None),
                                       ("GET", "/session/{}/events", None)):
                sent = {"json": body} if body is not None else {}
                mine = await c.request(method, path.format(sid), headers=bob, **sent)
                none = await c.request(method, path.format(unknown), headers=bob, **sent)
                assert mine.status_code == 404, (path, mine.text)
                assert_same_refusal(mine, none, sid, unknown)
            async with ws_connect(srv.base_url, headers=bob) as ws:
                await ws.send_json(INIT)
                assert "result" in await ws.receive_json()
                await ws.send_json(request(1, "session/load", {
                    "sessionId": sid, "cwd": srv.workspace, "mcpServers": []}))
                assert (await ws.wait_for(lambda m: m.get("id") == 1))["error"]["code"] \
                    == -32602
                await ws.send_json(request(2, "session/delete", {"sessionId": sid}))
                assert "error" in await ws.wait_for(lambda m: m.get("id") == 2)
                await ws.send_json(request(3, "session/list", {}))
                listed = await ws.wait_for(lambda m: m.get("id") == 3)
                assert sid not in json.dumps(listed)
        # all of hers are kept, and hers to load
        assert sorted((await _ended_walk(srv, wid, alice))[0]) == sorted(hers)
        loaded = await c.post(f"/session/{hers[0]}/load", json={}, headers=alice)
        assert loaded.status_code == 200, loaded.text


@pytest.mark.usefixtures("store_name")
async def test_an_ended_listing_cut_by_its_scan_bound_names_none_of_anothers_sessions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page that stops at ``MAX_SCAN`` rows among sessions bob does not see hands
    him a cursor: it must not carry the id (nor the end) of one of alice's."""
    monkeypatch.setattr(ended_cursor, "BATCH", 1)
    monkeypatch.setattr(ended_cursor, "MAX_SCAN", 2)
    async with serving(tmp_path) as (srv, who):
        alice, bob = who["alice"], who["bob"]
        wid = await _workspace(srv)
        his = await _ended_acp_sessions(srv, bob, 1)       # the oldest end
        hers = await _ended_acp_sessions(srv, alice, 5)    # then alice's, newer
        await _ended_committed(srv, wid, {*hers, *his})
        seen, cursors = await _ended_walk(srv, wid, bob)
        assert seen == his
        assert cursors, "the scan bound was not reached"
        # the same walk over /acp session/list (after the live sessions: none)
        async with ws_connect(srv.base_url, headers=bob) as ws:
            await ws.send_json(INIT)
            assert "result" in await ws.receive_json()
            cursor, rpc_id, listed = None, 1, []
            while True:
                await ws.send_json(request(rpc_id, "session/list",
                                           {"cursor": cursor} if cursor else {}))
                reply = (await ws.wait_for(lambda m, i=rpc_id: m.get("id") == i))["result"]
                listed += [s["sessionId"] for s in reply["sessions"]]
                cursor, rpc_id = reply.get("nextCursor"), rpc_id + 1
                if cursor is None:
                    break
                cursors.append(cursor)
        assert listed == his
        for cursor in cursors:
            decoded = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            assert not any(sid.encode() in decoded for sid in hers), cursor
        # and alice's own walk is whole
        assert sorted((await _ended_walk(srv, wid, alice))[0]) == sorted(hers)


# -- a restore raced by another principal --------------------------------------------------
class _HeldStart:
    """The in-process reference agent (its sessions in ``store``), its ``initialize``
    held until ``release()``: the first requests that need the agent wait for it to
    start exactly as long as the test needs."""

    name = "reference"

    def __init__(self, store: SessionStore) -> None:
        self.inner = ReferenceAgentFactory(store=store)
        self.starting = anyio.Event()
        self._gate = anyio.Event()

    def release(self) -> None:
        self._gate.set()

    async def connect(self, client: Any, task_group: Any) -> Any:
        inner = await self.inner.connect(client, task_group)
        agent = self

        class Held:
            closed = property(lambda _self: inner.closed)

            async def request(self, method: str, params: Any) -> Any:
                if method == "initialize":
                    agent.starting.set()
                    await agent._gate.wait()
                return await inner.request(method, params)

            async def notify(self, method: str, params: Any) -> None:
                await inner.notify(method, params)

            async def aclose(self) -> None:
                await inner.aclose()

        return Held()


@pytest.mark.parametrize("door", ["acp", "rest"])
async def test_a_load_racing_anothers_restore_does_not_share_it(tmp_path: Path,
                                                                door: str) -> None:
    """A session only the agent keeps (on storage shared between instances, say) is its
    restorer's. Two loads of it by alice and bob, both sent while the agent starts:
    both passed the ownership check (nobody owned it yet), one restored it and the
    other attached to what that one made. Over ``/acp`` both got the session (its
    history, its events); REST answered the loser 404 (``rest.owners.claim``). Now
    each door gives it to one of them, and to the other an unknown session."""
    store = SessionStore()
    sid = str(uuid.uuid4())
    store.create(sid, str(tmp_path), [("user", "the maker's own words"), ("agent", "noted")])
    agent = _HeldStart(store)
    async with serving(tmp_path, agent_factory=agent) as (srv, who):
        slot = next(iter(srv.server.bridge.agents._slots.values()))

        async def both_waiting_for_the_agent() -> None:
            with anyio.fail_after(30):
                await agent.starting.wait()     # the first load waits for the agent
                while slot.lock.statistics().tasks_waiting < 1:   # the second too,
                    await anyio.sleep(0.01)                       # checked already
            agent.release()

        won: list[str] = []
        history: dict[str, str] = {}

        async def one_has_it() -> None:
            assert len(won) == 1, history
            lost = "bob" if won == ["alice"] else "alice"
            assert "the maker's own words" not in history[lost]
            assert (await srv.client.get(f"/session/{sid}/status", headers=who[lost])
                    ).status_code == 404
            assert (await srv.client.get(f"/session/{sid}/status", headers=who[won[0]])
                    ).status_code == 200
        if door == "rest":
            async def rest_load(name: str) -> None:
                answer = await srv.client.post(f"/session/{sid}/load", json={},
                                               headers=who[name])
                history[name] = answer.text
                if answer.status_code == 200:
                    won.append(name)
                else:
                    assert answer.status_code == 404, answer.text

            async with anyio.create_task_group() as tg:
                tg.start_soon(rest_load, "alice")
                await agent.starting.wait()
                tg.start_soon(rest_load, "bob")
                await both_waiting_for_the_agent()
        else:
            load = request(1, "session/load", {"sessionId": sid, "cwd": srv.workspace,
                                               "mcpServers": []})
            async with ws_connect(srv.base_url, headers=who["alice"]) as alice, \
                    ws_connect(srv.base_url, headers=who["bob"]) as bob:
                for ws in (alice, bob):
                    await ws.send_json(INIT)
                    assert "result" in await ws.receive_json()
                await alice.send_json(load)
                await agent.starting.wait()
                await bob.send_json(load)
                await both_waiting_for_the_agent()
                for name, ws in (("alice", alice), ("bob", bob)):
                    frames: list[dict[str, Any]] = []

                    def answered(message: dict[str, Any],
                                 frames: list[dict[str, Any]] = frames) -> bool:
                        frames.append(message)
                        return message.get("id") == 1

                    reply = await ws.wait_for(answered)
                    history[name] = json.dumps(frames)
                    if "result" in reply:
                        won.append(name)
                    else:
                        assert reply["error"]["code"] == -32602, reply
                await one_has_it()   # while the sockets are open (their sessions live)
        if door == "rest":
            await one_has_it()


# -- several instances ----------------------------------------------------------------------
async def test_another_instance_neither_forwards_nor_reads_out_anothers_session(
        tmp_path: Path) -> None:
    """Two instances on one PostgreSQL store: alice's session runs on ``a``; bob asks
    ``b``, which answers reads from the journal and forwards the rest to ``a``, with
    and without the forward marker a client may send itself: every answer is the one
    an unknown id gets, on both doors, and nothing reaches her session."""
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    flags = {"store": stores.postgres_url_for(tmp_path, "fleet"), "token": BOOT,
             "headers": bearer(BOOT), "kind": Doors}
    async with local_server(tmp_path, state_dir=tmp_path / "a", **flags) as a, \
            local_server(tmp_path, state_dir=tmp_path / "b", **flags) as b:
        alice = bearer(await mint(a.server, "alice", unlimited=True))
        bob = bearer(await mint(a.server, "bob", unlimited=True))
        sid = await _thread(a, alice)
        asked = await a.client.post(f"/session/{sid}/prompt", json=text_prompt(PERMISSION),
                                    headers=alice)
        assert asked.status_code == 202
        frames = await a.events_until(sid, "permission_request", headers=alice,
                                      last_event_id=asked.json()["lastEventId"])
        request_id = frames[-1][1]["data"]["requestId"]
        assert not b.bridge.has_session(sid)
        mine_on_b = await b.client.get(f"/session/{sid}/status", headers=alice)
        assert mine_on_b.status_code == 200, mine_on_b.text   # b answers alice from the journal
        unknown = str(uuid.uuid4())
        vote = {"outcome": {"outcome": "selected", "optionId": "allow_once"}}
        marker = {"x-acp-forwarded-by": a.server.leases.instance}   # type: ignore[union-attr]
        for extra in ({}, marker):
            for method, template, body in (
                    ("GET", "/session/{}/status", None),
                    ("GET", "/session/{}/pending-prompts", None),
                    ("GET", "/session/{}/events", None),
                    ("POST", "/session/{}/load", {}),
                    ("POST", "/session/{}/resume", {}),
                    ("POST", "/session/{}/prompt", text_prompt("mine now")),
                    ("POST", "/session/{}/cancel", None),
                    ("POST", "/session/{}/branch", {}),
                    ("POST", "/session/{}/permission/" + request_id, vote),
                    ("DELETE", "/session/{}", None)):
                sent = {"json": body} if body is not None else {}
                theirs = await b.client.request(method, template.format(sid),
                                                headers={**bob, **extra}, **sent)
                none = await b.client.request(method, template.format(unknown),
                                              headers={**bob, **extra}, **sent)
                assert theirs.status_code == 404, (extra, template, theirs.text)
                assert_same_refusal(theirs, none, sid, unknown)
        fleet = b.server.fleet
        assert fleet.stats.forwards and fleet.stats.journal_reads   # type: ignore[union-attr]
        async with ws_connect(b.base_url, headers=bob) as ws:
            await ws.send_json(INIT)
            assert "result" in await ws.receive_json()
            await ws.send_json(request(1, "session/load", {
                "sessionId": sid, "cwd": b.workspace, "mcpServers": []}))
            assert (await ws.wait_for(lambda m: m.get("id") == 1))["error"]["code"] == -32602
            await ws.send_json(request(2, "session/list", {}))
            assert sid not in json.dumps(await ws.wait_for(lambda m: m.get("id") == 2))
        status = (await a.client.get(f"/session/{sid}/status", headers=alice)).json()
        assert status["pendingInteractionCount"] == 1 and a.bridge.has_session(sid)
        assert not b.bridge.has_session(sid)


async def test_with_require_auth_metrics_are_for_admins_and_health_for_any_credential(
        tmp_path: Path) -> None:
    async with serving(tmp_path, require_auth=True) as (srv, who):
        c = srv.client
        sid = await _thread(srv, who["alice"])
        nobody = {"Authorization": ""}
        for path in ("/metrics", "/metrics/", "/health", "/health?deep=1"):
            assert (await c.get(path, headers=nobody)).status_code == 401, path
        for name in ("alice", "reader", "prompter"):
            metrics = await c.get("/metrics", headers=who[name])
            assert (metrics.status_code, metrics.json()["requiredScope"]) == (403, "admin")
            assert (await c.get("/health", headers=who[name])).status_code == 200
        shown = await c.get("/metrics", headers=who["ops"])
        assert shown.status_code == 200 and sid not in shown.text
        # the console's files stay public, and carry nothing of anyone
        page = await c.get("/", headers=nobody)
        assert page.status_code == 200 and sid not in page.text
        assert (await c.get("/web/../tokens", headers=nobody)).status_code in (401, 404)
        assert (await c.get(raw(c, "/web/%2E%2E/tokens"), headers=nobody)).status_code \
            in (401, 404)


async def test_a_token_that_expires_while_in_use_is_refused_and_its_streams_end(
        tmp_path: Path) -> None:
    """The credential cache checks the expiry on every request (no grace while the
    cached entry is fresh), and the re-check of tokens with open streams ends them.
    (The wall clock the principals read is moved in the process: no test waits a
    token's lifetime out.)"""
    now = [time.time()]
    async with serving(tmp_path) as (srv, who):
        srv.server.gate.authenticator.clock = lambda: now[0]
        soon = bearer(await mint(srv.server, "soon", expires="60s"))
        sid = await _thread(srv, soon)
        assert (await srv.client.get("/whoami", headers=soon)).status_code == 200
        ended = anyio.Event()

        async def follow() -> None:
            async with httpx.AsyncClient(base_url=srv.base_url, headers=soon,
                                         timeout=30) as c:
                async with c.stream("GET", f"/session/{sid}/events") as response:
                    assert response.status_code == 200
                    opened.set()
                    async for _ in response.aiter_bytes():
                        pass
            ended.set()

        opened = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await opened.wait()
            async with ws_connect(srv.base_url, headers=soon) as ws:
                await ws.send_json(INIT)
                assert "result" in await ws.receive_json()
                now[0] = time.time() + 61   # past its expiry
                assert (await srv.client.get("/whoami", headers=soon)).status_code == 401
                assert await ws.wait_closed() == 1008
            with anyio.fail_after(30):
                await ended.wait()
        assert (await srv.client.get(f"/session/{sid}/status", headers=soon)).status_code \
            == 401


async def test_the_per_workspace_mounts_carry_their_targets_access_and_ownership(
        tmp_path: Path) -> None:
    """``/workspaces/{ws}/sessions`` and ``/workspaces/{ws}/acp`` (``{ws}`` the id or
    the absolute path URL-encoded, dots and doubled slashes included) are the listing
    and ``/acp`` themselves: the same scopes, the same owner's view."""
    async with serving(tmp_path) as (srv, who):
        c = srv.client
        a = await _thread(srv, who["alice"])
        b = await _thread(srv, who["bob"])
        wid = await _workspace(srv)
        encoded = srv.workspace.replace("/", "%2F")
        dotted = (srv.workspace + "/../" + srv.workspace.rsplit("/", 1)[1]).replace("/", "%2F")
        for ws in (wid, encoded, encoded + "%2F", dotted, "%2F%2F" + encoded[3:]):
            listed = await c.get(raw(c, f"/workspaces/{ws}/sessions"), headers=who["bob"])
            assert listed.status_code == 200, (ws, listed.text)
            assert [s["sessionId"] for s in listed.json()["sessions"]] == [b], ws
            refused = await c.get(raw(c, f"/workspaces/{ws}/sessions"),
                                  headers=who["prompter"])
            assert refused.status_code == 403, (ws, refused.text)
            posted = await c.post(raw(c, f"/workspaces/{ws}/acp"), headers=who["reader"],
                                  json=request(1, "session/new", {"cwd": srv.workspace,
                                                                  "mcpServers": []}))
            assert posted.status_code == 403, (ws, posted.text)
        async with ws_connect(srv.base_url, f"/workspaces/{encoded}/acp",
                              headers=who["bob"]) as sock:
            await sock.send_json(INIT)
            assert "result" in await sock.receive_json()
            await sock.send_json(request(1, "session/list", {}))
            listed = await sock.wait_for(lambda m: m.get("id") == 1)
            assert [s["sessionId"] for s in listed["result"]["sessions"]] == [b]
            await sock.send_json(request(2, "session/prompt", {"sessionId": a,
                                                               "prompt": text("hi")}))
            assert (await sock.wait_for(lambda m: m.get("id") == 2))["error"]["code"] \
                == -32602
        # the session header standing for params.sessionId names alice's: still hers
        conn, _ = await srv.initialize(**who["bob"])
        async with srv.stream(conn, **who["bob"]) as stream:
            sent = await srv.post(conn, request(3, "session/prompt", {"prompt": text("hi")}),
                                  a, **who["bob"])
            assert sent.status_code == 202
            assert (await stream.wait_for_id(3))["error"]["code"] == -32602
        status = (await c.get(f"/session/{a}/status", headers=who["alice"])).json()
        assert not status["hasActivePrompt"] and status["pendingPrompts"] == 0


async def test_a_refused_request_adopts_no_client_id_into_anothers_session(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With several instances, a request for a live session that carries
    ``X-Qwen-Client-Id`` makes the session adopt that id (one another instance issued).
    Bob's requests for alice's session are 404, and must change nothing of it: it
    adopted every id he sent all the same (its ``clientCount``, which alice and the
    console read, grew with each; the set is bounded, so his ids pushed out older
    ones)."""
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    from bridge import session as bridge_session
    monkeypatch.setattr(bridge_session, "MAX_TRACKED_CLIENTS", 4)
    flags = {"store": stores.postgres_url_for(tmp_path, "fleet"), "token": BOOT,
             "headers": bearer(BOOT), "kind": Doors}
    async with local_server(tmp_path, state_dir=tmp_path / "a", **flags) as a:
        assert a.server.fleet is not None
        alice = bearer(await mint(a.server, "alice", unlimited=True))
        bob = bearer(await mint(a.server, "bob", unlimited=True))
        made = await a.client.post("/session", json={"sessionScope": "thread"}, headers=alice)
        sid, client_id = made.json()["sessionId"], made.json()["clientId"]
        before = (await a.client.get(f"/session/{sid}/status", headers=alice)).json()
        for n in range(8):
            forged = {**bob, "X-Qwen-Client-Id": f"client_{uuid.uuid4()}"}
            for answer in (await a.client.post(f"/session/{sid}/heartbeat", headers=forged),
                           await a.client.get(f"/session/{sid}/status", headers=forged)):
                assert answer.status_code == 404, answer.text
        after = (await a.client.get(f"/session/{sid}/status", headers=alice)).json()
        assert after["clientCount"] == before["clientCount"]
        beat = await a.client.post(f"/session/{sid}/heartbeat",
                                   headers={**alice, "X-Qwen-Client-Id": client_id})
        assert beat.status_code == 200, beat.text



# -- the shipped daemon (granian) -----------------------------------------------------------
# Only the client side runs in the test's event loop (the server is a child process):
# one backend is enough.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("server", ["granian", "uvicorn"])
async def test_the_shipped_daemon_reads_every_spelling_as_the_router_does(
        tmp_path: Path, server: str) -> None:
    """The path spellings of the attacks above against ``acp-server serve`` as shipped
    (its HTTP servers decode paths their own way): an admin route spelled otherwise is
    never served to a non-admin, another's session never to its non-owner."""
    async with ServeProcess(tmp_path, "--token", BOOT, "--http-server", server) as daemon:
        c = daemon.client
        made = {}
        for name in ("alice", "bob"):
            created = await c.post("/tokens", json={"name": name, "rateClass": "unlimited"})
            assert created.status_code == 201, created.text
            made[name] = bearer(created.json()["token"])
        alice, bob = made["alice"], made["bob"]
        a = (await c.post("/session", json={"sessionScope": "thread"},
                          headers=alice)).json()["sessionId"]
        for method, path in (("GET", "/tokens"), ("GET", "/tokens/"), ("GET", "/tokens%2F"),
                             ("GET", "/%74okens"), ("GET", "/%2Ftokens"), ("GET", "//tokens"),
                             ("GET", "/TOKENS"), ("GET", "/tokens/%2E%2E/tokens"),
                             ("GET", "/x/%2E%2E/tokens"), ("DELETE", "/tokens%2Fbob"),
                             ("DELETE", "/tokens/bob/"), ("GET", "/audit%3Fx"),
                             ("GET", "/audit;x"), ("GET", "/audit%00")):
            answer = await c.request(method, raw(c, path), headers=alice)
            assert answer.status_code in (400, 403, 404), (server, method, path, answer.text)
        for method, path in (("GET", f"/session/{a}/status"), ("GET", f"/session/{a}%2Fstatus"),
                             ("GET", f"/session/{a}/status/"), ("GET", f"/session%2F{a}/status"),
                             ("POST", f"/session/{a}%2Fprompt"), ("POST", f"/session/{a}/prompt/"),
                             ("GET", f"/session/{a.upper()}/status"),
                             ("GET", f"/session/%20{a}/status"),
                             ("DELETE", f"/session/{a}"), ("DELETE", f"/session/{a}%2F")):
            sent = {"json": text_prompt("mine now")} if method == "POST" else {}
            answer = await c.request(method, raw(c, path), headers=bob, **sent)
            assert answer.status_code == 404, (server, method, path, answer.text)
        listed = await c.get("/tokens")
        assert {t["name"] for t in listed.json()["tokens"]} == {"alice", "bob"}
        status = (await c.get(f"/session/{a}/status", headers=alice)).json()
        assert status["pendingPrompts"] == 0 and not status["hasActivePrompt"]


@pytest.mark.usefixtures("store_name")
async def test_forwarding_headers_from_a_client_prove_nothing(tmp_path: Path) -> None:
    """``X-Forwarded-For`` without ``--trusted-proxy``, and the fleet's forwarding
    headers with a proof the client made up (on PostgreSQL the fleet's secret exists),
    change neither who the client is in the audit log nor what it may reach."""
    async with serving(tmp_path) as (srv, who):
        a = await _thread(srv, who["alice"])
        leases = srv.server.leases   # PostgreSQL: a fleet of one, with its secret
        instance = leases.instance if leases is not None else "elsewhere"
        forged = {"X-Forwarded-For": "10.1.2.3", "x-acp-forwarded-by": instance,
                  "x-acp-forwarded-for": "10.9.8.7", "x-acp-forwarded-proof": "0" * 64,
                  "Forwarded": "for=10.4.4.4"}
        elsewhere = httpx.AsyncHTTPTransport(local_address="127.0.0.9")
        async with httpx.AsyncClient(base_url=srv.base_url, transport=elsewhere) as c:
            mine = await c.post("/session", json={"sessionScope": "thread"},
                                headers={**who["bob"], **forged})
            assert mine.status_code == 200, mine.text
            theirs = await c.get(f"/session/{a}/status", headers={**who["bob"], **forged})
            assert theirs.status_code == 404
            bad = await c.get("/whoami", headers={**forged, "Authorization": "Bearer nope"})
            assert bad.status_code == 401
        await srv.server.gate.audit.flush()
        records = (await srv.client.get("/audit", params={"principal": "bob"})).json()
        assert [(r["action"], r["client"]) for r in records["records"]] == [
            ("session.created", "127.0.0.9"), ("access.denied", "127.0.0.9")]   # its 404
        failed = (await srv.client.get("/audit", params={"action": "auth.failed"})).json()
        assert [r["client"] for r in failed["records"]] == ["127.0.0.9"]


async def test_a_web_page_cannot_act_as_the_local_admin(tmp_path: Path) -> None:
    """No credential configured: every loopback client is the ``local`` admin, so a web
    page in the user's browser is the attacker. Its requests carry its ``Origin`` (a
    foreign site, another local port, a sandboxed ``null``) or a rebound ``Host``: each
    is refused, on HTTP and on the WebSocket handshake, before anything runs."""
    async with local_server(tmp_path, kind=Doors) as srv:
        port = srv.base_url.rsplit(":", 1)[1]
        c = srv.client
        assert (await c.get("/whoami")).json()["name"] == "local"
        for origin in ("https://evil.example", "null", "http://127.0.0.1:1",
                       f"http://127.0.0.1.evil.example:{port}", f"http://localhost:{port}.x"):
            for method, path, body in (("POST", "/session", {"sessionScope": "thread"}),
                                       ("POST", "/tokens", {"name": "mine"}),
                                       ("GET", "/workspace/x/sessions", None),
                                       ("POST", "/acp", INIT),
                                       ("POST", "/lmsp/v1/tasks", envelope("x"))):
                sent = {"json": body} if body is not None else {}
                answer = await c.request(method, path, headers={"Origin": origin}, **sent)
                assert answer.status_code == 403, (origin, path, answer.text)
            with pytest.raises(WsRejected) as refused:
                async with ws_connect(srv.base_url, headers={"Origin": origin}):
                    pass
            assert refused.value.status == 403, origin
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.nip.io"):
            answer = await c.post("/session", json={}, headers={"Host": host})
            assert answer.status_code == 421, (host, answer.text)
        # the server's own page (its own origin) is served, and nothing was made meanwhile
        own = await c.get("/whoami", headers={"Origin": f"http://127.0.0.1:{port}"})
        assert own.status_code == 200
        assert (await c.get("/tokens")).json()["tokens"] == []
        assert srv.bridge.sessions() == []
