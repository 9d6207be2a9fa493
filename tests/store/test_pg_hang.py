"""A PostgreSQL that hangs rather than fails does not hang the server (a real
``acp-server serve`` on a cluster of the test's own, every process of it paused with
SIGSTOP: its connections stay open, a statement on them never returns, no timeout of the
server's fires, and the kernel still accepts new connections).

* Requests while it hangs: ``POST /session``, an LMSP create and an ``/acp``
  ``session/new`` answer 503 ``store_unavailable`` in their door's shape (each waited
  for the store as long as it hung: the writer's statement never returned and every
  later write queued behind it). Once resumed (SIGCONT) the server serves again by
  itself, on new connections.
* SIGTERM while it hangs: the process exits (its last commits and the lease release
  waited for ever). Resumed and started again on the same state, what was acknowledged
  before the pause is there: the session is restored with its prompt, the task is
  found.

Each ``fail_after`` is a guard against a hang, never a timing: the server gives up on a
statement ``--store-busy-timeout-ms`` plus 0.5 s (at least 2 s) after sending it
(``acp_server.store.pg_answers``).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.acp_http.wsclient import ws_connect
from tests.harness import ServeProcess
from tests.lmsp.server import envelope
from tests.ops.test_hung_store import paused
from tests.store.test_outage_processes import own_cluster  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
GUARD_S = 60   # against a hang, never a timing (the bound here is 2 s)
BUSY = ("--store-busy-timeout-ms", "500")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only; the server is its own process


async def _acp_session_new(base_url: str, cwd: Path) -> dict[str, Any]:
    """``/acp`` ``session/new`` over a WebSocket: its answer."""
    async with ws_connect(base_url) as ws:
        await ws.send_json({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                            "params": {"protocolVersion": 1}})
        await ws.wait_for(lambda m: m.get("id") == 0)
        await ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "session/new",
                            "params": {"cwd": str(cwd), "mcpServers": []}})
        return await ws.wait_for(lambda m: m.get("id") == 1)   # type: ignore[no-any-return]


async def _acknowledged(client: httpx.AsyncClient) -> tuple[str, str, str]:
    """A session made, a prompt accepted in it, a task created: (ids)."""
    made = await client.post("/session", json={"sessionScope": "thread"})
    assert made.status_code == 200, made.text
    sid = made.json()["sessionId"]
    prompt = await client.post(f"/session/{sid}/prompt",
                               json={"prompt": [{"type": "text", "text": "before"}]})
    assert prompt.status_code == 202, prompt.text
    task = await client.post("/lmsp/v1/tasks", json=envelope("before"))
    assert task.status_code == 202, task.text
    return sid, prompt.json()["promptId"], task.json()["id"]


def _is_503(answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 503, answer.text
    return answer.json()   # type: ignore[no-any-return]


async def test_requests_while_postgresql_hangs_answer_503_then_resume(
        tmp_path: Path, own_cluster: Path) -> None:  # noqa: F811
    url = os.environ["_ACP_OWN_PG"]
    async with ServeProcess(tmp_path, "--store", url, *BUSY) as daemon, \
            httpx.AsyncClient(base_url=daemon.base_url, timeout=GUARD_S * 2) as client:
        sid, _, task = await _acknowledged(client)
        with paused(own_cluster):
            with anyio.fail_after(GUARD_S):
                rest = _is_503(await client.post("/session", json={"sessionScope": "thread"}))
                assert rest["code"] == "store_unavailable"
                lmsp = await client.post("/lmsp/v1/tasks", json=envelope("while paused"))
                assert lmsp.headers["content-type"] == "application/problem+json"
                assert _is_503(lmsp)["code"] == "store_unavailable"
                acp = await _acp_session_new(daemon.base_url, tmp_path)
                assert acp["error"]["data"]["errorKind"] == "store_unavailable", acp
                deep = await client.get("/health", params={"deep": "1"})
                assert _is_503(deep)["store"]["status"] == "down"
        with anyio.fail_after(GUARD_S):   # resumed: the server serves again by itself
            while (again := await client.post(
                    "/session", json={"sessionScope": "thread"})).status_code != 200:
                assert again.json()["code"] == "store_unavailable"
                await anyio.sleep(0.05)
            while (await client.get("/health", params={"deep": "1"})).status_code != 200:
                await anyio.sleep(0.05)
        created = await client.post("/lmsp/v1/tasks", json=envelope("after"))
        assert created.status_code == 202, created.text
        assert (await client.get(f"/lmsp/v1/tasks/{task}")).status_code == 200
        assert (await client.get(f"/session/{sid}/status")).status_code == 200
        assert daemon.returncode is None
    assert "Traceback" not in daemon.stderr_text()


async def test_sigterm_while_postgresql_hangs_exits_and_nothing_acknowledged_is_lost(
        tmp_path: Path, own_cluster: Path) -> None:  # noqa: F811
    url = os.environ["_ACP_OWN_PG"]
    daemon = ServeProcess(tmp_path, "--store", url, *BUSY)
    await anyio.to_thread.run_sync(daemon.start)
    try:
        async with httpx.AsyncClient(base_url=daemon.base_url, timeout=GUARD_S) as client:
            sid, prompt_id, task = await _acknowledged(client)
        with paused(own_cluster):
            assert daemon.process is not None
            daemon.process.send_signal(signal.SIGTERM)
            with anyio.fail_after(GUARD_S):
                while daemon.returncode is None:
                    await anyio.sleep(0.05)
    finally:
        daemon.kill()
    assert "Traceback" not in daemon.stderr_text()
    # resumed: a new start on the same state has everything acknowledged before
    async with ServeProcess(tmp_path, "--store", url, *BUSY) as again, \
            httpx.AsyncClient(base_url=again.base_url, timeout=GUARD_S) as client:
        with anyio.fail_after(GUARD_S):
            while (found := await client.get(f"/lmsp/v1/tasks/{task}")).status_code != 200:
                assert found.status_code == 503, found.text
                await anyio.sleep(0.05)
        loaded = await client.post(f"/session/{sid}/load", json={})
        assert loaded.status_code == 200, loaded.text
        prompts = {t["promptId"] for t in loaded.json()["promptTerminals"]}
        assert prompt_id in prompts, loaded.text
