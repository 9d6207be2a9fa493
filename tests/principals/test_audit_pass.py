"""A hostile pass over credentials and the audit log, over real loopback HTTP and
WebSocket (``docs/security.md``, "Principals"): a request offering two credentials is
one 401 whatever their order and the cache's state, and a refused scope or rate limit
is in the audit log with its principal, sampled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.acp_http.server import request, running_acp_server
from tests.acp_http.wsclient import WsRejected, ws_connect
from tests.lmsp.server import envelope
from tests.principals.helpers import bearer, mint

pytestmark = pytest.mark.anyio
BOOT = "boot-s3cret"
UNKNOWN = "acps_0123456789abcdef_" + "x" * 43   # shaped as a stored token, on no row


class Frozen:
    """A monotonic clock that does not move: rate-limit buckets never refill."""

    def __call__(self) -> float:
        return 100.0


def serving(tmp_path: Path, **settings: object):
    return running_acp_server(tmp_path, token=BOOT, headers=bearer(BOOT), **settings)


def _two(first: str, second: str) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {first}"), ("Authorization", f"Bearer {second}")]


class _Fields(list[tuple[str, str]]):
    """Header fields, repeated names kept, where the WebSocket client wants a dict."""

    def items(self) -> list[tuple[str, str]]:
        return list(self)


async def _audit(srv: Any, action: str) -> list[dict[str, Any]]:
    page = await srv.client.get("/audit", params={"action": action, "limit": 1000})
    assert page.status_code == 200, page.text
    return list(page.json()["records"])


async def test_two_authorization_headers_are_one_401_in_any_order(tmp_path: Path) -> None:
    """Before, the guard's fast path took the last ``Authorization`` field and the store
    lookup tried each: a request naming alice's and bob's tokens was served as bob or as
    alice by their order, and a valid token beside an unknown one passed or got 401 by
    which of them the cache knew."""
    async with serving(tmp_path) as srv:
        alice = (await mint(srv.server, "alice", unlimited=True))
        bob = (await mint(srv.server, "bob", unlimited=True))
        for token in (alice, bob):   # each alone: known to the cache from here
            assert (await srv.client.get("/whoami", headers=bearer(token))).status_code == 200
        pairs = [(alice, bob), (bob, alice), (alice, "junk"), ("junk", alice),
                 (alice, UNKNOWN), (UNKNOWN, alice), (alice, alice)]
        for first, second in pairs:
            for method, path in (("GET", "/whoami"), ("GET", "/lmsp/v1/tasks"),
                                 ("POST", "/acp")):
                answer = await srv.client.request(
                    method, path, headers=_two(first, second),
                    json=request(0, "initialize", {"protocolVersion": 1})
                    if path == "/acp" else None)
                assert answer.status_code == 401, (first[:12], second[:12], path, answer.text)
        # on a WebSocket handshake too
        with pytest.raises(WsRejected) as rejected:
            async with ws_connect(srv.base_url, headers=_Fields(_two(alice, bob))):  # type: ignore[arg-type]
                pass
        assert rejected.value.status == 401
        # /health needs no credential on a loopback bind: two are not a refusal there
        assert (await srv.client.get("/health", headers=_two(alice, bob))).status_code == 200
        failed = await _audit(srv, "auth.failed")
        assert failed and failed[0]["detail"]["reason"] == "repeated_credential"
        assert alice not in str(failed) and bob not in str(failed)


async def test_refused_scopes_and_rates_are_audited_with_their_principal(
        tmp_path: Path) -> None:
    """Before, only a failed credential was recorded: a read-only token asking for
    ``/tokens`` or a prompt, on any door, and a token over its rate left no trace."""
    async with serving(tmp_path, principals_clock=Frozen(), rate_limit_prompt=1) as srv:
        reader = bearer(await mint(srv.server, "reader", "read"))
        ci = bearer(await mint(srv.server, "ci"))
        for _ in range(3):   # sampled: one record, the next one says how many were not
            assert (await srv.client.post("/tokens", json={"name": "x"},
                                          headers=reader)).status_code == 403
        assert (await srv.client.post("/lmsp/v1/tasks", json=envelope("hi"),
                                      headers=reader)).status_code == 403
        async with ws_connect(srv.base_url, headers=reader) as ws:
            await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
            await ws.wait_for(lambda m: m.get("id") == 0)
            await ws.send_json(request(1, "session/new", {"cwd": str(tmp_path),
                                                          "mcpServers": []}))
            refused = await ws.wait_for(lambda m: m.get("id") == 1)
            assert refused["error"]["data"]["errorKind"] == "forbidden"
        sid = (await srv.client.post("/session", json={"sessionScope": "thread"},
                                     headers=ci)).json()["sessionId"]
        prompt = {"prompt": [{"type": "text", "text": "hi"}]}
        codes = [(await srv.client.post(f"/session/{sid}/prompt", json=prompt,
                                        headers=ci)).status_code for _ in range(3)]
        assert codes == [202, 429, 429]
        denied = await _audit(srv, "access.denied")
        seen = [(r["principal"], r["detail"]["reason"], r["detail"]["request"],
                 r["detail"].get("required_scope"), r["detail"].get("tier"))
                for r in denied]
        assert seen == [
            ("reader", "missing_scope", "POST /tokens", "admin", None),
            ("ci", "rate_limited", f"POST /session/{sid}/prompt", None, "prompt"),
        ], seen
        assert all(r["client"] == "127.0.0.1" for r in denied)
        # what was not recorded is counted: 2 more /tokens, the task, the socket's message
        srv.server.gate.audit.failure_window_s = 0.0
        assert (await srv.client.get("/tokens", headers=reader)).status_code == 403
        last = (await _audit(srv, "access.denied"))[-1]
        assert (last["principal"], last["detail"]["suppressed"]) == ("reader", 4)


async def test_deleting_a_response_and_dropping_a_prompt_are_audited(tmp_path: Path) -> None:
    """Before, an LMSP response deleted (an admin deleting another's, too) and a
    pending prompt dropped left no record: they are ``task.deleted`` and
    ``prompt.removed``, with who did it."""
    async with serving(tmp_path) as srv:
        alice = bearer(await mint(srv.server, "alice", unlimited=True))
        ops = bearer(await mint(srv.server, "ops", "admin", unlimited=True))
        made = await srv.client.post("/lmsp/v1/responses",
                                     json={"model": "reference", "input": "hello"},
                                     headers=alice)
        assert made.status_code == 200 and made.json()["status"] == "completed", made.text
        response_id = made.json()["id"]
        assert (await srv.client.delete(f"/lmsp/v1/responses/{response_id}",
                                        headers=ops)).status_code == 200
        sid = (await srv.client.post("/session", json={"sessionScope": "thread"},
                                     headers=alice)).json()["sessionId"]
        asked = await srv.client.post(   # the reference agent waits for a permission
            f"/session/{sid}/prompt", headers=alice,
            json={"prompt": [{"type": "text", "text": "/permission please"}]})
        assert asked.status_code == 202, asked.text
        prompt_id = asked.json()["promptId"]
        dropped = await srv.client.delete(f"/session/{sid}/pending-prompts/{prompt_id}",
                                          headers=alice)
        assert dropped.json() == {"removed": True}
        again = await srv.client.delete(f"/session/{sid}/pending-prompts/{prompt_id}",
                                        headers=alice)
        assert again.json() == {"removed": False}   # nothing removed: nothing recorded
        deleted = await _audit(srv, "task.deleted")
        assert [(r["principal"], r["detail"]["response_id"]) for r in deleted] == \
            [("ops", response_id)]
        removed = await _audit(srv, "prompt.removed")
        assert [(r["principal"], r["target"], r["detail"]) for r in removed] == \
            [("alice", sid, {"prompt_id": prompt_id})]


async def test_naming_anothers_session_or_task_is_audited_and_still_a_404(
        tmp_path: Path) -> None:
    """Before, bob probing alice's session, task or response left no record (the 404
    rightly told him nothing, but told the operator nothing either): each is an
    ``access.denied`` record of reason ``not_owner`` with the id as its target; an
    id nobody has records nothing (and both answers stay the same)."""
    async with serving(tmp_path) as srv:
        srv.server.gate.audit.failure_window_s = 0.0   # every one recorded, for the test
        alice = bearer(await mint(srv.server, "alice", unlimited=True))
        bob = bearer(await mint(srv.server, "bob", unlimited=True))
        sid = (await srv.client.post("/session", json={"sessionScope": "thread"},
                                     headers=alice)).json()["sessionId"]
        task = (await srv.client.post("/lmsp/v1/tasks", json=envelope("hi"),
                                      headers=alice)).json()["id"]
        response = (await srv.client.post("/lmsp/v1/responses", headers=alice,
                                          json={"model": "reference", "input": "hi"})
                    ).json()["id"]
        unknown = "00000000-0000-4000-8000-000000000000"
        for target in (sid, unknown):
            answer = await srv.client.get(f"/session/{target}/status", headers=bob)
            assert answer.status_code == 404
            load = await srv.client.post(f"/session/{target}/load", headers=bob,
                                         json={"cwd": str(tmp_path)})
            assert load.status_code == 404, load.text
        assert (await srv.client.get(f"/lmsp/v1/tasks/{task}", headers=bob)).status_code == 404
        assert (await srv.client.get(f"/lmsp/v1/responses/{response}",
                                     headers=bob)).status_code == 404
        async with ws_connect(srv.base_url, headers=bob) as ws:
            await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
            await ws.wait_for(lambda m: m.get("id") == 0)
            await ws.send_json(request(1, "session/prompt", {
                "sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}))
            refused = await ws.wait_for(lambda m: m.get("id") == 1)
            assert refused["error"]["code"] == -32602
        denied = await _audit(srv, "access.denied")
        seen = [(r["principal"], r["detail"]["reason"], r["detail"]["request"], r["target"])
                for r in denied]
        assert seen == [
            ("bob", "not_owner", f"GET /session/{sid}/status", sid),
            ("bob", "not_owner", f"POST /session/{sid}/load", sid),
            ("bob", "not_owner", f"/lmsp/v1/tasks/{task}", task),
            ("bob", "not_owner", f"/lmsp/v1/responses/{response}", seen[3][3]),
            ("bob", "not_owner", "/acp session/prompt", sid),
        ], seen


async def test_the_setters_are_audited_with_the_old_and_new_value(tmp_path: Path) -> None:
    """Before, a session's mode, model or option changed (REST's qwen setters, ``/acp``'s
    ``session/set_*``) left no record: each the agent accepted is ``setting.changed``
    with who did it, the setting, its value before and after, and the door; one the
    agent refused records nothing."""
    async with serving(tmp_path) as srv:
        alice = bearer(await mint(srv.server, "alice", unlimited=True))
        sid = (await srv.client.post("/session", json={"sessionScope": "thread"},
                                     headers=alice)).json()["sessionId"]
        for route, body in (("approval-mode", {"mode": "plan"}),
                            ("model", {"modelId": "reference-large"}),
                            ("config-option", {"configId": "reasoning_effort", "value": "high"})):
            answer = await srv.client.post(f"/session/{sid}/{route}", json=body, headers=alice)
            assert answer.status_code == 200, answer.text
        refused = await srv.client.post(f"/session/{sid}/model", json={"modelId": "gpt-9"},
                                        headers=alice)
        assert refused.status_code == 400
        async with ws_connect(srv.base_url, headers=alice) as ws:
            await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
            await ws.wait_for(lambda m: m.get("id") == 0)
            await ws.send_json(request(1, "session/new", {"cwd": str(tmp_path),
                                                          "mcpServers": []}))
            acp_sid = (await ws.wait_for(lambda m: m.get("id") == 1))["result"]["sessionId"]
            await ws.send_json(request(2, "session/set_mode",
                                       {"sessionId": acp_sid, "modeId": "yolo"}))
            assert "result" in await ws.wait_for(lambda m: m.get("id") == 2)
        changed = await _audit(srv, "setting.changed")
        assert [(r["principal"], r["target"], r["detail"]) for r in changed] == [
            ("alice", sid, {"setting": "mode", "old": "default", "new": "plan", "door": "rest"}),
            ("alice", sid, {"setting": "model", "old": "reference", "new": "reference-large",
                            "door": "rest"}),
            ("alice", sid, {"setting": "config:reasoning_effort", "old": "default",
                            "new": "high", "door": "rest"}),
            ("alice", acp_sid, {"setting": "mode", "old": "default", "new": "yolo",
                                "door": "acp"})]
