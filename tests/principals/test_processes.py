"""Principals with real processes: two instances on one PostgreSQL store (a token
revoked on one is dropped by the other on the store's notice, at once, its open stream
ended: the "within a second" of the contract, whose fallback, the 0.5 s cache and the
streams' re-read, is tested on an injected clock in ``test_units``), and
``acp-server token`` / ``audit`` on the store beside a running server (SQLite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest

from acp_server.rest.workspace import workspace_id
from tests.harness import ServeProcess
from tests.harness.process import ROOT
from tests.lmsp import stores
from tests.principals.helpers import bearer

pytestmark = pytest.mark.anyio
BOOT = "boot-s3cret"


def acp_server(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``acp-server ARGS`` as a child process (this checkout)."""
    full_env = {**{k: v for k, v in os.environ.items() if k != "ACP_SERVER_TOKEN"},
                "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "acp_server", *args], capture_output=True,
                          text=True, env=full_env, timeout=60)


async def _stream_until_closed(client: httpx.AsyncClient, path: str, headers: dict[str, str],
                               opened: anyio.Event, ended: list[float]) -> None:
    async with client.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200
        opened.set()
        async for _ in response.aiter_bytes():
            pass
    ended.append(time.monotonic())


@pytest.mark.parametrize("anyio_backend", ["trio"])   # the servers are child processes
async def test_a_token_revoked_on_one_instance_is_refused_on_another_on_its_notice(
        tmp_path: Path) -> None:
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    url = stores.postgres_url_for(tmp_path, "principals")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with ServeProcess(tmp_path / "a", "--store", url, "--token", BOOT) as a, \
            ServeProcess(tmp_path / "b", "--store", url, "--token", BOOT) as b:
        created = await a.client.post("/tokens", json={"name": "ci"})
        assert created.status_code == 201, created.text
        ci = bearer(created.json()["token"])
        # B learns the token from the store, and caches it
        with anyio.fail_after(30):
            while (await b.client.get("/capabilities", headers=ci)).status_code != 200:
                await anyio.sleep(0.05)
        sid = (await b.client.post("/session", json={"sessionScope": "thread"},
                                   headers=ci)).json()["sessionId"]
        opened, ended = anyio.Event(), []
        async with anyio.create_task_group() as tg:
            tg.start_soon(_stream_until_closed, b.client, f"/session/{sid}/events", ci,
                          opened, ended)
            await opened.wait()
            assert (await b.client.get("/capabilities", headers=ci)).status_code == 200
            revoked = await a.client.delete("/tokens/ci")
            assert revoked.status_code == 200
            revoked_at = time.monotonic()
            status = 200
            with anyio.move_on_after(10):   # a bound, not the contract: see the log below
                while status != 401:
                    status = (await b.client.get("/capabilities", headers=ci)).status_code
                    if status != 401:
                        await anyio.sleep(0.02)
            refused_at = time.monotonic()
            with anyio.move_on_after(10):
                while not ended:
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
        assert status == 401
        print(f"refused after {refused_at - revoked_at:.3f} s, stream ended after "
              f"{(ended[0] if ended else float('nan')) - revoked_at:.3f} s")
        assert ended, "the revoked token's stream did not end"
        # A's notice reaches B, which re-reads the token and says so: no clock
        # involved. (The refusal above and the stream's end may come first from the
        # cache's lifetime and the streams' periodic re-read, whichever ran first on a
        # loaded machine; the notice is waited for, not raced.)
        with anyio.fail_after(30):
            while "tokens revoked elsewhere" not in b.stderr_text():
                await anyio.sleep(0.05)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the servers are child processes
async def test_the_token_cli_works_on_the_store_beside_a_running_server(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with ServeProcess(tmp_path, "--token", BOOT) as server:
        created = acp_server("token", "create", "ci", "--scope", "read", "--expires", "1h",
                             "--state-dir", str(state))
        assert created.returncode == 0, created.stderr
        token = created.stdout.strip()
        assert token.startswith("acps_") and "\n" not in token
        assert "shown once" in created.stderr and f"sqlite:///{state}" in created.stderr
        taken = acp_server("token", "create", "ci", "--state-dir", str(state))
        assert taken.returncode == 1 and "exists already" in taken.stderr
        bad = acp_server("token", "create", "-x", "--state-dir", str(state))
        assert bad.returncode == 2
        # the server sees the new token within its cache lifetime
        with anyio.fail_after(30):
            while (await server.client.get("/capabilities", headers=bearer(token))).status_code \
                    != 200:
                await anyio.sleep(0.05)
        assert (await server.client.post("/session", json={},
                                         headers=bearer(token))).status_code == 403
        listed = acp_server("token", "list", "--json", "--state-dir", str(state))
        rows = json.loads(listed.stdout)["tokens"]
        assert [(r["name"], r["scopes"]) for r in rows] == [("ci", ["read"])]
        assert token not in listed.stdout and token.split("_", 2)[2] not in listed.stdout
        table = acp_server("token", "list", "--state-dir", str(state)).stdout
        assert table.splitlines()[0].split() == ["NAME", "ID", "SCOPES", "CREATED", "LAST",
                                                 "USED", "EXPIRES", "REVOKED"]
        revoked = acp_server("token", "revoke", "ci", "--state-dir", str(state))
        assert revoked.returncode == 0 and "revoked 'ci'" in revoked.stdout
        with anyio.fail_after(30):   # SQLite has no notices: the cache lifetime (0.5 s)
            while (await server.client.get("/capabilities",
                                           headers=bearer(token))).status_code != 401:
                await anyio.sleep(0.05)
        assert acp_server("token", "revoke", "ci", "--state-dir", str(state)).returncode == 1
        # over HTTP, with the bootstrap admin; a non-admin is told why
        over = acp_server("token", "create", "ops", "--url", server.base_url,
                          env={"ACP_SERVER_TOKEN": BOOT})
        assert over.returncode == 0, over.stderr
        ops = over.stdout.strip()
        refused = acp_server("token", "list", "--url", server.base_url, "--token", ops)
        assert refused.returncode == 1 and "admin scope" in refused.stderr
        wrong = acp_server("token", "list", "--url", server.base_url, "--token", "nope")
        assert wrong.returncode == 1 and "401" in wrong.stderr
        audit = acp_server("audit", "--json", "--state-dir", str(state))
        actions = [(r["principal"], r["action"], r["target"])
                   for r in json.loads(audit.stdout)["records"] if r["action"] != "auth.failed"]
        user = actions[0][0]
        assert user.startswith("cli")
        assert actions == [(user, "token.created", "ci"),
                           ("ci", "access.denied", None),    # its POST /session: 403
                           (user, "token.revoked", "ci"),
                           ("bootstrap", "token.created", "ops"),
                           ("ops", "access.denied", None)]   # its list: no admin scope
        over_http = acp_server("audit", "--url", server.base_url, "--token", BOOT,
                               "--action", "token.revoked")
        assert over_http.returncode == 0 and len(over_http.stdout.splitlines()) == 1
        for secret in (token, ops, BOOT):
            assert secret not in server.stderr_text()


@pytest.mark.parametrize("anyio_backend", ["trio"])   # the servers are child processes
async def test_tokens_are_never_logged_in_metrics_or_given_to_agents(tmp_path: Path) -> None:
    """The bootstrap token (from the environment) and a stored token, used and misused:
    none appears in the request log (text and JSON), in /metrics, or in the
    environment of the stdio agent the server starts."""
    env_file = tmp_path / "agent.env"
    agent = (f"sh -c 'env > {env_file}; exec {sys.executable} -m bridge.agents.reference'")
    async with ServeProcess(tmp_path, "--agent", agent, "--log-format", "json",
                            env={"ACP_SERVER_TOKEN": BOOT}) as server:
        boot = bearer(BOOT)
        token = (await server.client.post("/tokens", json={"name": "ci"},
                                          headers=boot)).json()["token"]
        ci = bearer(token)
        sid = (await server.client.post("/session", json={"sessionScope": "thread"},
                                        headers=ci)).json()["sessionId"]
        assert (await server.client.post(f"/session/{sid}/prompt", headers=ci, json={
            "prompt": [{"type": "text", "text": "hello"}]})).status_code == 202
        for wrong in (token[:-2] + "xx", "acps_" + token[5:21] + "_nope", BOOT + "x"):
            assert (await server.client.get("/capabilities",
                                            headers=bearer(wrong))).status_code == 401
        await server.client.get(f"/session/{sid}/status?token={token[:3]}", headers=ci)
        metrics = (await server.client.get("/metrics", headers=boot)).text
        audit = (await server.client.get("/audit", headers=boot)).text
        with anyio.fail_after(10):
            while not env_file.exists() or "PATH=" not in env_file.read_text():
                await anyio.sleep(0.05)
    secret = token.split("_", 2)[2]
    log = server.stderr_text()
    assert "GET /capabilities 401" in log or '"status": 401' in log or '"status":401' in log
    for text, where in ((log, "the log"), (metrics, "/metrics"), (audit, "/audit"),
                        (env_file.read_text(), "the agent's environment")):
        for value in (BOOT, token, secret, token[:-2] + "xx"):
            assert value not in text, (value, where)
    assert "ACP_SERVER_TOKEN" not in env_file.read_text()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the servers are child processes
async def test_who_made_a_session_survives_a_kill_9(tmp_path: Path) -> None:
    """The owner is journaled with the session: after a SIGKILL and a start on the same
    state, the restored session is still its maker's (others get 404; admins see it
    with its owner)."""
    state = tmp_path / "state"
    minted = {name: acp_server("token", "create", name, "--scope", "prompt", "--scope",
                               "read", "--state-dir", str(state)) for name in ("alice", "bob")}
    assert all(m.returncode == 0 for m in minted.values()), minted
    alice, bob = (bearer(m.stdout.strip()) for m in minted.values())
    admin = bearer(BOOT)
    child = ServeProcess(tmp_path, "--token", BOOT).start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            made = await client.post("/session", json={"sessionScope": "thread"}, headers=alice)
            assert made.status_code == 200, made.text
            sid = made.json()["sessionId"]
        child.kill()   # SIGKILL: the owner must come back from the journal alone
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            assert (await client.get(f"/session/{sid}/status", headers=alice)).status_code == 200
            for path in (f"/session/{sid}/status", f"/session/{sid}/events"):
                refused = await client.get(path, headers=bob)
                assert refused.status_code == 404, (path, refused.text)
                assert refused.json()["code"] == "session_not_found"
            prompt = {"prompt": [{"type": "text", "text": "hello"}]}
            assert (await client.post(f"/session/{sid}/prompt", json=prompt,
                                      headers=bob)).status_code == 404
            assert (await client.post(f"/session/{sid}/load", json={},
                                      headers=bob)).status_code == 404
            assert (await client.post(f"/session/{sid}/prompt", json=prompt,
                                      headers=alice)).status_code == 202
            sessions = f"/workspace/{workspace_id(str(tmp_path))}/sessions"
            mine = (await client.get(sessions, headers=alice)).json()["sessions"]
            assert [s["sessionId"] for s in mine] == [sid]
            assert (await client.get(sessions, headers=bob)).json()["sessions"] == []
            everyone = (await client.get(sessions, headers=admin)).json()["sessions"]
            assert [(s["sessionId"], s["owner"]) for s in everyone] == [(sid, "alice")]
    finally:
        child.stop()


@pytest.mark.parametrize("anyio_backend", ["trio"])   # the server is a child process
async def test_the_token_cli_over_http_sends_no_path_or_header_it_was_not_meant_to(
        tmp_path: Path) -> None:
    """``token revoke NAME --url``: the name went into the path as it was, so
    ``../session/ID`` was ``DELETE /session/ID`` with the admin token (the session
    closed; then a traceback on its empty answer), and ``x?all=1`` revoked ``x``. A
    ``--token`` with CR LF was quoted back whole in httpx's error, a non-ASCII one a
    traceback. Now each is one line and exit 2, nothing sent, the token not shown."""
    async with ServeProcess(tmp_path, "--token", BOOT) as server:
        sid = (await server.client.post("/session", json={"sessionScope": "thread"}))\
            .json()["sessionId"]
        url = ["--url", server.base_url]
        for name in (f"../session/{sid}", "x?all=1", "a/b"):
            refused = acp_server("token", "revoke", name, *url, env={"ACP_SERVER_TOKEN": BOOT})
            assert refused.returncode == 2, refused
            assert refused.stderr.startswith("acp-server: Invalid token name"), refused.stderr
        assert (await server.client.get(f"/session/{sid}/status")).status_code == 200
        for token in ("s3cret\r\nX-Injected: 1", "s3crét"):
            for argv in (["token", "list"], ["audit"]):
                refused = acp_server(*argv, *url, env={"ACP_SERVER_TOKEN": token})
                assert refused.returncode == 2, refused
                assert "s3cr" not in refused.stderr + refused.stdout
                assert "Traceback" not in refused.stderr and "not shown" in refused.stderr
        listed = acp_server("token", "list", *url, env={"ACP_SERVER_TOKEN": f" {BOOT}\n"})
        assert listed.returncode == 0, listed.stderr
