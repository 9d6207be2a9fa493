"""The durable start through a real PostgreSQL outage and a ``kill -9`` (issue #23: an
acknowledged prompt runs once). A real ``acp-server serve`` on a throwaway cluster, a
real stdio agent (``tests.agents.fixture_agent``) that records every prompt it is
handed in a file: a prompt whose turn starts while PostgreSQL is stopped is not handed
to the agent before its start is committed, so after the crash and the restart it
runs once, not twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.harness import ServeProcess, free_port
from tests.lmsp import stores
from tests.store.test_outage_processes import PG_SCRIPT, own_cluster  # noqa: F401 (fixture)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only; the server is its own process


def _recording_agent(folder: Path, record: Path) -> Path:
    script = folder / "recording-agent"
    script.write_text(f"#!/bin/sh\nPYTHONPATH={Path(__file__).resolve().parents[2]} exec "
                      f"{sys.executable} -m tests.agents.fixture_agent --name rec "
                      f"--record-prompts {record}\n")
    script.chmod(0o755)
    return script


def _handed(record: Path) -> list[str]:
    return record.read_text().splitlines() if record.exists() else []


def _body(text: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": text}]}


async def _until(predicate: Any, what: str, timeout: float = 60) -> None:
    """Polls ``predicate`` (a condition, bounded only against a hang)."""
    with anyio.move_on_after(timeout):
        while not await predicate():
            await anyio.sleep(0.05)
        return
    raise AssertionError(what)


def _pg(action: str, cluster: Path, port: int | None = None) -> None:
    args = ["bash", str(PG_SCRIPT), action, str(cluster)] + ([str(port)] if port else [])
    subprocess.run(args, check=True, capture_output=True)


async def test_a_turn_started_while_postgresql_is_down_runs_once_across_a_kill(
        tmp_path: Path, own_cluster: Path) -> None:  # noqa: F811 (the fixture)
    url = os.environ["_ACP_OWN_PG"]
    pg_port = urllib.parse.urlsplit(url).port
    record = tmp_path / "handed.txt"
    child = ServeProcess(tmp_path, "--store", url, *stores.lease_flags(), "--port",
                         str(free_port()), "--agent",
                         str(_recording_agent(tmp_path, record))).start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=30) as client:
            sid = (await client.post("/session", json={"sessionScope": "thread"})
                   ).json()["sessionId"]
            first = await client.post(f"/session/{sid}/prompt", json=_body("hold"))
            queued = await client.post(f"/session/{sid}/prompt", json=_body("once only"))
            assert first.status_code == queued.status_code == 202   # both committed
            queued_id = queued.json()["promptId"]

            async def holding() -> bool:
                return _handed(record) == ["hold"]
            await _until(holding, "the agent never got the first prompt")
            await anyio.to_thread.run_sync(_pg, "stop", own_cluster)
            # the running turn is cancelled: the queued one starts in the outage
            assert (await client.post(f"/session/{sid}/cancel")).status_code == 204

            async def waiting() -> bool:   # or handed over: the failure asserted below
                activity = (await client.get("/daemon/status")).json()["runtime"]["activity"]
                return activity == {"activePrompts": 1, "pendingPrompts": 1,
                                    "queuedPrompts": 0} or len(_handed(record)) > 1
            await _until(waiting, "the queued prompt never started")
            assert _handed(record) == ["hold"]   # echoed, not committed: not handed over
            # its readers saw neither the first turn's end nor this start: the
            # session's status says what they saw, the first prompt running
            status = (await client.get(f"/session/{sid}/status")).json()
            assert status["activePromptId"] == first.json()["promptId"]
            assert (status["pendingPrompts"], status["queuedPrompts"]) == (2, 1)
        child.kill()   # its start never committed: after the restart it is still to run
        await anyio.to_thread.run_sync(_pg, "start", own_cluster, pg_port)
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=30) as client:
            async def ended() -> bool:
                loaded = await client.post(f"/session/{sid}/load", json={})
                if loaded.status_code != 200:
                    return False
                return any(t["promptId"] == queued_id
                           for t in loaded.json()["promptTerminals"])
            await _until(ended, "the queued prompt never ran after the restart")
            loaded = (await client.post(f"/session/{sid}/load", json={})).json()
            terminals = {t["promptId"]: t["terminal"] for t in loaded["promptTerminals"]}
            assert terminals[queued_id] == "completed", terminals
        assert _handed(record) == ["hold", "once only"]   # each handed over once
    finally:
        child.stop()
