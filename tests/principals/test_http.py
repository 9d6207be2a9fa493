"""Principals over real loopback HTTP: tokens, scopes and rate limits in each door's
shape, the audit log's route, revocation of open streams."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest

from acp_server.principals import LOCAL, admin
from tests.acp_http.server import request, running_acp_server
from tests.acp_http.wsclient import ws_connect
from tests.lmsp.server import envelope
from tests.principals.helpers import bearer, mint

pytestmark = pytest.mark.anyio
BOOT = "boot-s3cret"
TASK = envelope("hello")


class Frozen:
    """A monotonic clock that does not move: rate-limit buckets never refill."""

    def __call__(self) -> float:
        return 100.0


def serving(tmp_path: Path, **settings: object):
    return running_acp_server(tmp_path, token=BOOT, headers=bearer(BOOT), **settings)


async def test_tokens_over_http_for_admins_only(tmp_path: Path) -> None:
    async with serving(tmp_path) as srv:
        created = await srv.client.post("/tokens", json={"name": "ci", "scopes": ["read"],
                                                         "expires": "1h"})
        assert created.status_code == 201, created.text
        body = created.json()
        token = body.pop("token")
        assert token.startswith("acps_" + body["id"] + "_")
        assert body["name"] == "ci" and body["scopes"] == ["read"] and body["expiresAt"]
        assert body["createdBy"] == "bootstrap" and body["revokedAt"] is None
        again = await srv.client.post("/tokens", json={"name": "ci"})
        assert (again.status_code, again.json()["code"]) == (409, "token_exists")
        for bad in ({"name": "bad name"}, {"name": "x", "scopes": ["write"]},
                    {"name": "x", "expires": "soon"}, {"name": "x", "rateClass": "vip"}):
            answer = await srv.client.post("/tokens", json=bad)
            assert (answer.status_code, answer.json()["code"]) == (400, "invalid_token_request")
        assert (await srv.client.get("/capabilities", headers=bearer(token))).status_code == 200
        listed = (await srv.client.get("/tokens")).json()["tokens"]
        assert [t["name"] for t in listed] == ["ci"] and token not in json.dumps(listed)
        assert listed[0]["lastUsedAt"] is not None
        refused = await srv.client.get("/tokens", headers=bearer(token))
        assert refused.status_code == 403
        assert refused.json() == {"error": "This credential lacks the 'admin' scope.",
                                  "code": "forbidden", "requiredScope": "admin"}
        revoked = await srv.client.delete("/tokens/ci")
        assert revoked.status_code == 200 and revoked.json()["revoked"][0]["revokedBy"] == "bootstrap"
        assert (await srv.client.delete("/tokens/ci")).json()["code"] == "token_not_found"
        assert (await srv.client.get("/capabilities", headers=bearer(token))).status_code == 401
        assert len((await srv.client.get("/tokens", params={"all": "true"})).json()["tokens"]) == 1


async def test_a_missing_scope_is_403_in_each_doors_shape(tmp_path: Path) -> None:
    async with serving(tmp_path) as srv:
        reader = bearer(await mint(srv.server, "reader", "read"))
        rest = await srv.client.post("/session", json={}, headers=reader)
        assert rest.status_code == 403
        assert rest.json() == {"error": "This credential lacks the 'prompt' scope.",
                               "code": "forbidden", "requiredScope": "prompt"}
        lmsp = await srv.client.post("/lmsp/v1/tasks", json=TASK, headers=reader)
        assert lmsp.status_code == 403
        assert lmsp.headers["content-type"] == "application/problem+json"
        assert (lmsp.json()["code"], lmsp.json()["required_scope"]) == ("forbidden", "prompt")
        conn_id, _ = await srv.initialize(**reader)   # initialize needs no particular scope
        acp = await srv.post(conn_id, request(1, "session/new", {"cwd": srv.workspace,
                                                                 "mcpServers": []}), **reader)
        assert acp.status_code == 403
        assert acp.json() == {"jsonrpc": "2.0", "id": 1, "error": {
            "code": -32600, "message": "This credential lacks the 'prompt' scope.",
            "data": {"errorKind": "forbidden", "requiredScope": "prompt"}}}
        listed = await srv.post(conn_id, request(2, "session/list", {}), **reader)
        assert listed.status_code == 202
        prompter = bearer(await mint(srv.server, "prompter", "prompt"))
        assert (await srv.client.get("/session/x/status", headers=prompter)).status_code == 403
        async with ws_connect(srv.base_url, headers=reader) as ws:
            await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
            assert "result" in await ws.receive_json()
            await ws.send_json(request(1, "session/new", {"cwd": srv.workspace,
                                                          "mcpServers": []}))
            frame = await ws.receive_json()
            assert frame["id"] == 1 and frame["error"]["data"]["errorKind"] == "forbidden"
            await ws.send_json(request(2, "session/list", {}))   # the socket stays open
            assert "result" in await ws.wait_for(lambda m: m.get("id") == 2)


async def test_rate_limits_per_class_in_each_doors_shape(tmp_path: Path) -> None:
    async with serving(tmp_path, principals_clock=Frozen(), rate_limit_prompt=2,
                       rate_limit_mutation=3, rate_limit_read=4) as srv:
        ci = bearer(await mint(srv.server, "ci"))
        free = bearer(await mint(srv.server, "free", unlimited=True))
        sid = (await srv.client.post("/session", json={"sessionScope": "thread"},
                                     headers=ci)).json()["sessionId"]   # mutation 1
        prompt = {"prompt": [{"type": "text", "text": "hi"}]}
        for _ in range(2):
            assert (await srv.client.post(f"/session/{sid}/prompt", json=prompt,
                                          headers=ci)).status_code == 202
        refused = await srv.client.post(f"/session/{sid}/prompt", json=prompt, headers=ci)
        assert refused.status_code == 429
        assert refused.json() == {"error": "Rate limit exceeded", "code": "rate_limit_exceeded",
                                  "tier": "prompt", "retryAfterMs": 30000}
        assert refused.headers["retry-after"] == "30"
        assert refused.headers["x-ratelimit-limit"] == "2"
        assert refused.headers["x-ratelimit-remaining"] == "0"
        lmsp = await srv.client.post("/lmsp/v1/tasks", json=TASK, headers=ci)   # prompt tier
        assert lmsp.status_code == 429 and lmsp.json()["code"] == "rate_limit_exceeded"
        assert lmsp.headers["content-type"] == "application/problem+json"
        assert (lmsp.json()["tier"], lmsp.json()["retry_after_ms"]) == ("prompt", 30000)
        for _ in range(4):   # reads: their own tier
            assert (await srv.client.get(f"/session/{sid}/status", headers=ci)).status_code == 200
        assert (await srv.client.get(f"/session/{sid}/status", headers=ci)).status_code == 429
        # heartbeats and /health are never counted
        for _ in range(10):
            assert (await srv.client.post(f"/session/{sid}/heartbeat", headers=ci)).status_code \
                in (200, 404)
            assert (await srv.client.get("/health", headers=ci)).status_code == 200
        # the /acp door: initialize is a read (refused now), per message
        acp = await srv.client.post("/acp", json=request(0, "initialize", {}), headers=ci)
        assert acp.status_code == 429 and acp.headers["retry-after"] == "15"
        assert acp.json()["error"]["data"] == {"errorKind": "rate_limit_exceeded",
                                               "tier": "read", "retryAfterMs": 15000}
        # per principal: an unlimited token, the bootstrap token (reads of their own)
        for headers in (free, bearer(BOOT)):
            for _ in range(6):
                assert (await srv.client.get("/capabilities",
                                             headers=headers)).status_code == 200
        assert srv.server.gate.limiter.refused["prompt"] == 2


async def test_the_prompt_queue_503_stays_admission(tmp_path: Path) -> None:
    """A full queue answers 503 prompt_queue_full whatever the rate limits say."""
    from bridge import BridgeOptions

    async with serving(tmp_path, options=BridgeOptions(max_pending_prompts_per_session=1),
                       rate_limit_prompt=1000) as srv:
        ci = bearer(await mint(srv.server, "ci"))
        sid = (await srv.client.post("/session", json={"sessionScope": "thread"},
                                     headers=ci)).json()["sessionId"]
        hold = {"prompt": [{"type": "text", "text": "/sleep 30s"}]}
        assert (await srv.client.post(f"/session/{sid}/prompt", json=hold,
                                      headers=ci)).status_code == 202
        full = await srv.client.post(f"/session/{sid}/prompt", json=hold, headers=ci)
        assert (full.status_code, full.json()["code"]) == (503, "prompt_queue_full")
        assert full.headers["retry-after"] == "5"
        await srv.client.post(f"/session/{sid}/cancel", headers=ci)


async def test_a_callers_answers_do_not_stick_across_requests(tmp_path: Path) -> None:
    """An unlimited read-only token's caller is shared and remembers what it passed:
    reads stay 200 and prompts 403, alternately. A limited token on the hot 503 path is
    charged per request: 202, 503 x3, then 429 (4 prompts a minute, a frozen clock)."""
    from bridge import BridgeOptions

    async with serving(tmp_path, principals_clock=Frozen(), rate_limit_prompt=4,
                       options=BridgeOptions(max_pending_prompts_per_session=1)) as srv:
        ci = bearer(await mint(srv.server, "ci"))
        sid = (await srv.client.post("/session", json={"sessionScope": "thread"},
                                     headers=ci)).json()["sessionId"]
        prompt = {"prompt": [{"type": "text", "text": "/sleep 30s hold"}]}
        reader = bearer(await mint(srv.server, "reader", "read", unlimited=True))
        answers = []
        for _ in range(3):
            answers.append((await srv.client.get("/capabilities", headers=reader)).status_code)
            answers.append((await srv.client.post(f"/session/{sid}/prompt", json=prompt,
                                                  headers=reader)).status_code)
        assert answers == [200, 403] * 3
        answers = [(await srv.client.post(f"/session/{sid}/prompt", json=prompt,
                                          headers=ci)).status_code for _ in range(6)]
        assert answers == [202, 503, 503, 503, 429, 429]
        await srv.client.post(f"/session/{sid}/cancel", headers=ci)


async def test_revoking_ends_the_tokens_open_streams(tmp_path: Path) -> None:
    async with serving(tmp_path) as srv:
        token = await mint(srv.server, "ci")
        ci = bearer(token)
        sid = (await srv.client.post("/session", json={"sessionScope": "thread"},
                                     headers=ci)).json()["sessionId"]
        created = await srv.client.post("/lmsp/v1/tasks", json=envelope("/sleep 30s"),
                                        headers=ci)
        assert created.status_code == 202, created.text
        task = created.json()
        ended: list[str] = []

        async def follow(path: str) -> None:
            async with httpx.AsyncClient(base_url=srv.base_url, headers=ci, timeout=10) as c:
                async with c.stream("GET", path) as response:
                    assert response.status_code == 200
                    opened.set()
                    async for _ in response.aiter_bytes():
                        pass
            ended.append(path)

        async with anyio.create_task_group() as tg:
            for path in (f"/session/{sid}/events", f"/lmsp/v1/tasks/{task['id']}/events"):
                opened = anyio.Event()
                tg.start_soon(follow, path)
                await opened.wait()
            async with ws_connect(srv.base_url, headers=ci) as ws:
                await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
                await ws.receive_json()
                gate = srv.server.gate
                with anyio.fail_after(30):
                    while gate.streams.count(gate.authenticator.cached(
                            token.encode()).token_id) < 3:  # type: ignore[union-attr]
                        await anyio.sleep(0.01)
                assert (await srv.client.delete("/tokens/ci")).status_code == 200
                assert await ws.wait_closed() == 1008
        assert sorted(ended) == sorted([f"/session/{sid}/events",
                                        f"/lmsp/v1/tasks/{task['id']}/events"])
        assert (await srv.client.get(f"/session/{sid}/status", headers=ci)).status_code == 401
        await srv.client.post(f"/lmsp/v1/tasks/{task['id']}/cancel")


async def test_the_audit_route_pages_and_filters(tmp_path: Path) -> None:
    async with serving(tmp_path) as srv:
        for name in ("a", "b", "c"):
            await mint(srv.server, name)
        await srv.client.get("/capabilities", headers=bearer("wrong"))
        page = (await srv.client.get("/audit", params={"limit": 2})).json()
        assert [(r["principal"], r["action"], r["target"]) for r in page["records"]] == [
            ("bootstrap", "token.created", "a"), ("bootstrap", "token.created", "b")]
        rest = (await srv.client.get("/audit", params={"after": page["nextCursor"]})).json()
        assert [(r["action"], r["target"]) for r in rest["records"]] == [
            ("token.created", "c"), ("auth.failed", None)]
        assert rest["nextCursor"] is None
        failed = rest["records"][-1]
        assert failed["principal"] == "-" and failed["client"] == "127.0.0.1"
        assert failed["detail"] == {"reason": "invalid_credential", "path": "/capabilities"}
        only = (await srv.client.get("/audit", params={"action": "auth.failed"})).json()
        assert len(only["records"]) == 1
        first = page["records"][0]["at"]
        later = (await srv.client.get("/audit", params={"since": first + 3600})).json()
        assert later["records"] == []
        iso = (await srv.client.get("/audit", params={"until": "2000-01-01T00:00:00Z"})).json()
        assert iso["records"] == []
        for bad in ({"limit": "0"}, {"after": "x"}, {"since": "yesterday"}):
            answer = await srv.client.get("/audit", params=bad)
            assert (answer.status_code, answer.json()["code"]) == (400, "invalid_audit_query")


async def test_without_credentials_the_loopback_rule_stays_until_a_token_exists(
        tmp_path: Path) -> None:
    async with running_acp_server(tmp_path) as srv:
        assert (await srv.client.get("/tokens")).status_code == 200   # the local admin
        token = (await srv.client.post("/tokens", json={"name": "ci"})).json()["token"]
        # from now on every request needs a credential, on loopback too
        assert (await srv.client.get("/capabilities")).status_code == 401
        assert (await srv.client.get("/capabilities", headers=bearer(token))).status_code == 200
        assert (await srv.client.delete("/tokens/ci", headers=bearer(token))).status_code == 403
        gate = srv.server.gate
        await gate.revoke_token(gate.caller(LOCAL), "ci")
        # revoking the last token does not reopen the server
        assert (await srv.client.get("/capabilities")).status_code == 401


async def test_a_lookup_racing_many_requests_reads_the_store_once(tmp_path: Path) -> None:
    async with serving(tmp_path) as srv:
        token = await mint(srv.server, "ci")
        reads = 0
        store = srv.server.gate.authenticator.store
        original = store.get_token  # type: ignore[union-attr]

        async def counted(token_id: str):  # noqa: ANN202
            nonlocal reads
            reads += 1
            return await original(token_id)

        store.get_token = counted  # type: ignore[union-attr,method-assign]
        # the cache's clock stands still: on a loaded machine the eight requests may
        # come apart by more than its lifetime (0.5 s), and a second read is then right
        srv.server.gate.authenticator.monotonic = lambda: 0.0  # type: ignore[method-assign]
        # and the gate's periodic check (every ttl_s, real time) re-reads the tokens
        # whose requests are in flight: a tick among the eight was the second read of
        # a CI failure, right but not what is counted here
        async def no_revalidation(token_ids: object) -> list[str]:
            return []

        srv.server.gate.authenticator.revalidate = no_revalidation  # type: ignore[method-assign]
        srv.server.gate.authenticator.forget([token.split("_")[1]])
        statuses: list[int] = []

        async def get() -> None:
            statuses.append((await srv.client.get("/capabilities",
                                                  headers=bearer(token))).status_code)

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(get)
        assert statuses == [200] * 8 and reads == 1



async def test_the_first_token_made_while_the_server_runs_is_its_own_from_its_first_use(
        tmp_path: Path) -> None:
    """``acp-server token create`` writes the store's first token while the server runs
    with no credential required; the server sees it at its next check (``TTL_S``).
    Before, a request offering that token meanwhile was ``local``: the session it made
    was owned by ``local``, and the token's own prompts to it got 404 a moment later
    (helper-newuser's walk). Now an offered stored token is looked up even when none is
    required, and a token found makes credentials required at once."""
    async with running_acp_server(tmp_path) as srv:
        gate = srv.server.gate

        async def not_yet() -> None:   # the server's check has not come round yet
            return None

        gate.authenticator.refresh = not_yet  # type: ignore[method-assign]
        # offered while no token exists: ignored (local), a bogus one and a token-shaped one
        for offered in ("nonsense", "acps_0123456789abcdef_nope"):
            answer = await srv.client.get("/tokens", headers=bearer(offered))
            assert answer.status_code == 200, answer.text   # the local admin
        issued = await admin.create_token(gate.authenticator.store, gate.audit,  # type: ignore[arg-type]
                                          by="cli", name="ci", scopes=["prompt", "read"])
        assert not gate.authenticator.required
        made = await srv.client.post("/session", json={"sessionScope": "thread"},
                                     headers=bearer(issued.token))
        assert made.status_code == 200, made.text
        sid = made.json()["sessionId"]
        assert gate.authenticator.required   # the token was found: required at once
        assert (await srv.client.get("/capabilities")).status_code == 401
        prompt = await srv.client.post(f"/session/{sid}/prompt", headers=bearer(issued.token),
                                       json={"prompt": [{"type": "text", "text": "hi"}]})
        assert prompt.status_code == 202, prompt.text   # its own session, not local's
        caps = (await srv.client.get("/capabilities", headers=bearer(issued.token))).json()
        listed = (await srv.client.get(f"/workspace/{caps['workspaces'][0]['id']}/sessions",
                                       headers=bearer(issued.token))).json()["sessions"]
        assert [(s["sessionId"], s["owner"]) for s in listed] == [(sid, "ci")]
