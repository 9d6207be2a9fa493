"""A load or resume of a session another instance runs, while PostgreSQL is down for
real (``pg_ctl stop``), between two ``acp-server serve`` processes on one cluster:
``Fleet.claim`` cannot read who owns the session, so the answer is a retryable 503 in
the door's own shape (REST ``store_unavailable`` with ``Retry-After``, ``/acp`` a
JSON-RPC error whose ``errorKind`` says so), never a 404 for a session that exists nor
a fresh session over its journal; both processes stay up, the owner still serves the
session from memory. With PostgreSQL back the same load is answered by itself: the
idle session is handed over, its history whole."""

from __future__ import annotations

import os
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.acp_http.wsclient import ws_connect
from tests.harness import ServeProcess
from tests.lmsp import stores
from tests.store.test_outage_processes import PG_SCRIPT, own_cluster  # noqa: F401 - fixture
from tests.store.test_session_restart import read_events

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def _pg(command: str, directory: Path, *args: str) -> None:
    subprocess.run(["bash", str(PG_SCRIPT), command, str(directory), *args], check=True,
                   capture_output=True)


async def _idle(client: httpx.AsyncClient, sid: str) -> None:
    with anyio.fail_after(30):
        while (await client.get(f"/session/{sid}/status")).json()["pendingPrompts"]:
            await anyio.sleep(0.02)


async def _acp_load(base_url: str, workspace: Path, sid: str) -> dict[str, Any]:
    async with ws_connect(base_url) as ws:
        await ws.send_json({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                            "params": {"protocolVersion": 1}})
        await ws.receive_json()
        await ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "session/load", "params": {
            "sessionId": sid, "cwd": str(workspace), "mcpServers": []}})
        return await ws.wait_for(lambda m: m.get("id") == 1, timeout=30)  # type: ignore[no-any-return]


async def test_a_claim_while_postgresql_is_down_is_503_then_a_hand_off(
        tmp_path: Path, own_cluster: Path) -> None:  # noqa: F811 - the fixture
    url = os.environ["_ACP_OWN_PG"]
    port = str(urllib.parse.urlsplit(url).port)
    workspace = tmp_path / "ws"   # one workspace folder, as a team host has
    workspace.mkdir()
    flags = ["--store", url, *stores.lease_flags()]
    a = ServeProcess(workspace, *flags, state_dir="state-a").start()
    b = ServeProcess(workspace, *flags, state_dir="state-b").start()
    try:
        async with httpx.AsyncClient(base_url=a.base_url, timeout=30) as on_a, \
                httpx.AsyncClient(base_url=b.base_url, timeout=30) as on_b:
            sid = (await on_a.post("/session", json={"sessionScope": "thread"})).json()[
                "sessionId"]
            turn = await on_a.post(f"/session/{sid}/prompt", json={
                "prompt": [{"type": "text", "text": "/chunks 3 before the outage"}]})
            assert turn.status_code == 202, turn.text
            await _idle(on_a, sid)
            _pg("stop", own_cluster)

            for path in (f"/session/{sid}/load", f"/session/{sid}/resume"):
                refused = await on_b.post(path, json={})
                assert refused.status_code == 503, (path, refused.text)
                assert refused.json()["code"] == "store_unavailable", refused.text
                assert int(refused.headers["retry-after"]) > 0
            over_acp = await _acp_load(b.base_url, workspace, sid)
            assert over_acp["error"]["data"]["errorKind"] == "store_unavailable", over_acp
            assert over_acp["error"]["data"].get("retryable") is True, over_acp
            # the owner serves its live session from memory; nobody made it anew
            assert (await on_a.get(f"/session/{sid}/status")).status_code == 200
            assert a.returncode is None and b.returncode is None

            _pg("start", own_cluster, port)
            with anyio.fail_after(60):   # the store is back: so is the load, handed over
                while True:
                    loaded = await on_b.post(f"/session/{sid}/load", json={})
                    if loaded.status_code == 200:
                        break
                    assert loaded.status_code == 503, loaded.text
                    await anyio.sleep(0.1)
            history = await read_events(on_b, sid, lambda e: e.get("type") == "turn_complete",
                                        last_event_id=0)
            ids = [e["id"] for e in history if e.get("id") is not None]
            assert ids == list(range(1, ids[-1] + 1))   # every event once, in order
            assert "before the outage" in str(history)
            after = await on_b.post(f"/session/{sid}/prompt", json={
                "prompt": [{"type": "text", "text": "after"}]})
            assert after.status_code == 202, after.text
            await _idle(on_b, sid)
        assert a.returncode is None and b.returncode is None
        assert "Traceback" not in a.stderr_text() + b.stderr_text()
    finally:
        a.kill()
        b.kill()
