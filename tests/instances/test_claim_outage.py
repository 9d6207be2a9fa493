"""A load or resume of a session another instance runs, or ran before it was killed,
while PostgreSQL is down for real (``pg_ctl stop``), between two ``acp-server serve``
processes on one cluster.

* The owner alive: B cannot read who owns the session (REST: ``fleet.routing``;
  ``/acp``: ``Fleet.claim``), so the answer is a retryable 503 in the door's own shape
  (REST ``store_unavailable`` with ``Retry-After``, ``/acp`` ``session/load`` and
  ``session/resume`` a JSON-RPC error whose ``errorKind`` says so), never a 404 for a
  session that exists nor a fresh session over its journal; both processes stay up,
  ``/health`` answers, the owner still serves the session from memory. With
  PostgreSQL back the same loads are answered by themselves: REST's from the journal
  (the owner lives), ``/acp``'s by a hand-off of the idle session, its history whole
  (from ``Last-Event-ID`` 0 and from a cursor). Until the owner's ``LISTEN``
  connection is back a hand-off asked of it goes unheard: ``session_busy_elsewhere``,
  retryable, as for an owner that does not answer.
* The owner killed (``kill -9``) with a prompt running and one queued, and PostgreSQL
  stopped in the middle of the survivor's adoption: its orphan sweep has taken the
  lease (committed) and is held reading the session back (a test transaction locks
  ``session_prompts``; the wait is on ``pg_stat_activity``, never a sleep) when the
  cluster stops. A load sent over each door meanwhile, and every load and resume
  after, is the same 503, ``/health`` answering; with PostgreSQL
  back the survivor adopts the session by itself (the half-done adoption's lease is
  not renewed, it expires or is taken again), the load answers 200, every prompt
  acknowledged before the outage has its terminal (the running one
  ``server_restarted``, the queued one run), and a reader resuming by
  ``Last-Event-ID`` gets the events after its cursor, each once, in order.
* PostgreSQL crashing while REST's router reads a session's maker (before adopting a
  session whose owner's lease expired for another principal's caller): that caller
  gets the same 503 and nothing is adopted; with PostgreSQL back, its 404.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import psycopg
import pytest

from tests.acp_http.wsclient import WsClient, ws_connect
from tests.harness import ServeProcess, local_server
from tests.lmsp import stores
from tests.principals.helpers import bearer, mint
from tests.store.test_outage_processes import PG_SCRIPT, own_cluster  # noqa: F401 - fixture
from tests.store.test_session_restart import read_events

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def _pg(command: str, directory: Path, *args: str) -> None:
    subprocess.run(["bash", str(PG_SCRIPT), command, str(directory), *args], check=True,
                   capture_output=True)


def _prompt(text: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": text}]}


async def _idle(client: httpx.AsyncClient, sid: str) -> None:
    with anyio.fail_after(30):
        while (await client.get(f"/session/{sid}/status")).json()["pendingPrompts"]:
            await anyio.sleep(0.02)


@contextlib.asynccontextmanager
async def _acp_connection(base_url: str) -> AsyncIterator[WsClient]:
    """An initialized ``/acp`` WebSocket connection. A session it loads cold is its
    own: closed with it (the door's contract), so checks of that session run inside."""
    async with ws_connect(base_url) as ws:
        await ws.send_json({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                            "params": {"protocolVersion": 1}})
        await ws.receive_json()
        yield ws


async def _acp_call(ws: WsClient, workspace: Path, method: str, sid: str,
                    rpc_id: int = 1) -> dict[str, Any]:
    """``method`` (``session/load`` or ``session/resume``) of ``sid``: its answer."""
    await ws.send_json({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": {
        "sessionId": sid, "cwd": str(workspace), "mcpServers": []}})
    return await ws.wait_for(lambda m: m.get("id") == rpc_id, timeout=30)


async def _acp(base_url: str, workspace: Path, method: str, sid: str) -> dict[str, Any]:
    async with _acp_connection(base_url) as ws:
        return await _acp_call(ws, workspace, method, sid)


async def _acp_load_once_back(ws: WsClient, workspace: Path, sid: str) -> dict[str, Any]:
    """``session/load`` of ``sid`` on ``ws`` once PostgreSQL is back (``Fleet.claim``),
    its retryable errors retried: ``store_unavailable`` (the reconnection backoff) and
    ``session_busy_elsewhere`` (an owner whose ``LISTEN`` connection is not back yet
    never hears the hand-off asked of it: the asker gives up after two renewals)."""
    with anyio.fail_after(60):
        for rpc_id in itertools.count(1):
            answer = await _acp_call(ws, workspace, "session/load", sid, rpc_id)
            if "result" in answer:
                return answer
            data = answer["error"]["data"]
            assert data["errorKind"] in ("store_unavailable", "session_busy_elsewhere"), answer
            assert data["retryable"] is True, answer
            await anyio.sleep(0.1)
    raise AssertionError("unreachable")


async def _refused_while_down(on_b: httpx.AsyncClient, base_url: str, workspace: Path,
                              sid: str) -> None:
    """Every load and resume of ``sid`` on B, over both doors, is a retryable 503
    ``store_unavailable``, answered within bounded time; B's ``/health`` answers."""
    with anyio.fail_after(60):
        for path in (f"/session/{sid}/load", f"/session/{sid}/resume"):
            refused = await on_b.post(path, json={})
            assert refused.status_code == 503, (path, refused.text)
            assert refused.json()["code"] == "store_unavailable", refused.text
            assert refused.json()["error"], refused.text
            assert int(refused.headers["retry-after"]) > 0
        for method in ("session/load", "session/resume"):
            answer = await _acp(base_url, workspace, method, sid)
            assert "result" not in answer, (method, answer)
            data = answer["error"]["data"]
            assert data["errorKind"] == "store_unavailable", (method, answer)
            assert data.get("retryable") is True and data["retryAfterSeconds"] > 0, answer
        health = await on_b.get("/health")
        assert health.status_code == 200, health.text
        deep = await on_b.get("/health", params={"deep": "1"})
        assert deep.status_code == 503 and deep.json()["store"]["status"] == "down"


async def _load_once_back(on_b: httpx.AsyncClient, sid: str) -> httpx.Response:
    """The load of ``sid`` on B once PostgreSQL is back, its 503s (the store's
    reconnection backoff) retried."""
    with anyio.fail_after(60):
        while True:
            loaded = await on_b.post(f"/session/{sid}/load", json={})
            if loaded.status_code == 200:
                return loaded
            assert loaded.status_code == 503, loaded.text
            assert loaded.json()["code"] == "store_unavailable", loaded.text
            await anyio.sleep(0.1)


@pytest.mark.parametrize("anyio_backend", ["trio"])   # the servers are child processes
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
            turn = await on_a.post(f"/session/{sid}/prompt",
                                   json=_prompt("/chunks 3 before the outage"))
            assert turn.status_code == 202, turn.text
            await _idle(on_a, sid)
            # its end is committed once readers see it (the status says the committed id)
            await read_events(on_a, sid, lambda e: e["type"] == "turn_complete",
                              last_event_id=0)
            seen = (await on_a.get(f"/session/{sid}/status")).json()["lastEventId"]
            _pg("stop", own_cluster)

            await _refused_while_down(on_b, b.base_url, workspace, sid)
            # the owner serves its live session from memory; nobody made it anew
            assert (await on_a.get(f"/session/{sid}/status")).status_code == 200
            assert a.returncode is None and b.returncode is None

            _pg("start", own_cluster, port)
            # the store is back: a REST load is served from the journal (the owner lives)
            journal_read = await _load_once_back(on_b, sid)
            assert journal_read.json()["lastEventId"] == seen, journal_read.text
            async with _acp_connection(b.base_url) as ws:
                # and an /acp load is Fleet.claim's: the idle session is handed over
                assert "result" in await _acp_load_once_back(ws, workspace, sid)
                report = (await on_b.get("/daemon/status")).json()["runtime"]["instances"]
                assert report["handOffsTaken"] == 1 and report["sessionsOwned"] == 1, report
                history = await read_events(on_b, sid, lambda e: e.get("id") == seen,
                                            last_event_id=0)
                ids = [e["id"] for e in history if e.get("id") is not None]
                assert ids == list(range(1, seen + 1))   # every event once, in order
                assert "before the outage" in str(history)
                tail = await read_events(on_b, sid, lambda e: e.get("id") == seen,
                                         last_event_id=seen - 2)
                assert [e["id"] for e in tail if e.get("id") is not None] == [seen - 1, seen]
                after = await on_b.post(f"/session/{sid}/prompt", json=_prompt("after"))
                assert after.status_code == 202, after.text
                await _idle(on_b, sid)
        assert a.returncode is None and b.returncode is None
        assert "Traceback" not in a.stderr_text() + b.stderr_text()
    finally:
        a.kill()
        b.kill()


async def _terminals_with(client: httpx.AsyncClient, sid: str,
                          prompt_id: str) -> dict[str, dict[str, Any]]:
    """A load's ``promptTerminals`` by prompt id, once they list ``prompt_id`` (a load
    shows a terminal once it is committed)."""
    with anyio.fail_after(30):
        while True:
            loaded = await client.post(f"/session/{sid}/load", json={})
            terminals = {t["promptId"]: t for t in loaded.json()["promptTerminals"]}
            if prompt_id in terminals:
                return terminals
            await anyio.sleep(0.05)


async def _recovered(on_b: httpx.AsyncClient, url: str, sid: str, pids: list[str],
                     seen: int, epoch: str, b_id: str) -> None:
    """``sid`` runs on B (instance ``b_id``), nothing acknowledged before the outage
    lost: the first prompt completed, the one running at the kill ended
    ``server_restarted``, the queued one ran; a reader from ``seen`` (under ``epoch``)
    gets what followed, each event once, in order; from 0, everything."""
    await _load_once_back(on_b, sid)
    # the adoption's terminal shows once it is committed
    terminals = await _terminals_with(on_b, sid, pids[1])
    assert terminals[pids[0]]["terminal"] == "completed", terminals
    assert terminals[pids[1]]["terminal"] == "failed", terminals
    assert terminals[pids[1]]["errorCode"] == "server_restarted", terminals
    events = await read_events(
        on_b, sid, lambda e: e.get("type") == "turn_complete" and e.get("promptId") == pids[2],
        last_event_id=seen, epoch=epoch, timeout=60)
    ids = [e["id"] for e in events if e.get("id") is not None]
    assert ids == list(range(seen + 1, ids[-1] + 1)), ids   # after the cursor, once
    assert not any(e.get("type") == "state_resync_required" for e in events), events
    everything = await read_events(on_b, sid, lambda e: e.get("id") == ids[-1],
                                   last_event_id=0)
    assert [e["id"] for e in everything if e.get("id") is not None] == list(
        range(1, ids[-1] + 1))
    assert "before the outage" in str(everything)
    # its terminal is journaled just after its last event
    terminals = await _terminals_with(on_b, sid, pids[2])
    assert terminals[pids[2]]["terminal"] == "completed", terminals
    with psycopg.connect(url, autocommit=True) as db:
        lease = db.execute("SELECT instance FROM session_leases WHERE session_id = %s",
                           (sid,)).fetchone()
    assert lease == (b_id,)
    report = (await on_b.get("/daemon/status")).json()["runtime"]["instances"]
    assert report["sessionsOwned"] == 1 and report["leasesTakenOver"] >= 1, report


def _blocked_on_the_lock(watch: psycopg.Connection[Any]) -> bool:
    """Whether a backend waits for the test's lock of ``session_prompts``."""
    row = watch.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                        "'Lock' AND query ILIKE '%%session_prompts%%'").fetchone()
    return row is not None and row[0] > 0


@pytest.mark.parametrize(("recovery", "anyio_backend"), [("load", "asyncio"), ("sweep", "trio")])
async def test_postgresql_stops_during_the_adoption_of_a_killed_owners_session(
        tmp_path: Path, own_cluster: Path, recovery: str) -> None:  # noqa: F811 - the fixture
    """``recovery``: with PostgreSQL back, B is asked to load the session at once (its
    claim finds the lease its cut adoption took, and adopts), or nobody asks until B's
    orphan sweep has adopted the session and run its queued prompt by itself."""
    url = os.environ["_ACP_OWN_PG"]
    port = str(urllib.parse.urlsplit(url).port)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    flags = ["--store", url, *stores.lease_flags()]
    a = ServeProcess(workspace, *flags, state_dir="state-a").start()
    b = ServeProcess(workspace, *flags, state_dir="state-b").start()
    lock = psycopg.connect(url)   # a transaction of the test's: held open
    try:
        async with httpx.AsyncClient(base_url=a.base_url, timeout=30) as on_a, \
                httpx.AsyncClient(base_url=b.base_url, timeout=30) as on_b:
            with psycopg.connect(url, autocommit=True) as watch:
                b_id = (await on_b.get("/daemon/status")).json()["runtime"]["instances"][
                    "instance"]
                sid = (await on_a.post("/session", json={"sessionScope": "thread"})
                       ).json()["sessionId"]
                done = await on_a.post(f"/session/{sid}/prompt",
                                       json=_prompt("/chunks 3 before the outage"))
                await _idle(on_a, sid)
                running = await on_a.post(f"/session/{sid}/prompt",
                                          json=_prompt("/sleep 600s running at the kill"))
                queued = await on_a.post(f"/session/{sid}/prompt",
                                         json=_prompt("/chunks 2 queued at the kill"))
                for answer in (done, running, queued):
                    assert answer.status_code == 202, answer.text
                pids = [answer.json()["promptId"] for answer in (done, running, queued)]
                with anyio.fail_after(30):   # the turn runs, its events are all committed
                    while True:
                        status = (await on_a.get(f"/session/{sid}/status")).json()
                        row = watch.execute("SELECT max(last_id) FROM session_segments "
                                            "WHERE session_id = %s", (sid,)).fetchone()
                        if status["activePromptId"] == pids[1] and row is not None \
                                and row[0] == status["lastEventId"]:
                            break
                        await anyio.sleep(0.05)
                seen = status["lastEventId"]
                epoch = status["eventEpoch"]

                # B's adoption will take the lease, then wait to read the session back
                lock.execute("LOCK TABLE session_prompts IN ACCESS EXCLUSIVE MODE")
                a.kill()   # SIGKILL: no drain, no lease released
                with anyio.fail_after(60):
                    while True:
                        owner = watch.execute("SELECT instance FROM session_leases WHERE "
                                              "session_id = %s", (sid,)).fetchone()
                        if owner == (b_id,) and _blocked_on_the_lock(watch):
                            break
                        await anyio.sleep(0.05)
            # mid-adoption (the lease taken, the read cut), with a load over each door
            # sent meanwhile: before the stop it waits for that adoption, after it the
            # owner's lookup fails; either way a 503, never a wait past the outage. The
            # stop is immediate (a crash): a fast one ends the test's lock holder first,
            # and B's blocked read could then finish its adoption before its own
            # backend ended (a CI run saw the load answer 200)
            racing: dict[str, Any] = {}

            async def rest_load() -> None:
                racing["rest"] = await on_b.post(f"/session/{sid}/load", json={})

            async def acp_load() -> None:
                racing["acp"] = await _acp(b.base_url, workspace, "session/load", sid)

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(rest_load)
                    tg.start_soon(acp_load)
                    await anyio.to_thread.run_sync(_pg, "crash", own_cluster)
            assert racing["rest"].status_code == 503, racing["rest"].text
            assert racing["rest"].json()["code"] == "store_unavailable"
            assert racing["acp"]["error"]["data"]["errorKind"] == "store_unavailable", racing

            await _refused_while_down(on_b, b.base_url, workspace, sid)
            assert b.returncode is None

            _pg("start", own_cluster, port)
            async with contextlib.AsyncExitStack() as stack:
                if recovery == "load":   # Fleet.claim finds its cut adoption's lease
                    ws = await stack.enter_async_context(_acp_connection(b.base_url))
                    assert "result" in await _acp_load_once_back(ws, workspace, sid)
                else:   # nobody asks: B's orphan sweep adopts it and runs what was queued
                    with psycopg.connect(url, autocommit=True) as db, anyio.fail_after(60):
                        while db.execute("SELECT terminal FROM session_prompts WHERE "
                                         "session_id = %s AND prompt_id = %s",
                                         (sid, pids[2])).fetchone() == (None,):
                            await anyio.sleep(0.05)
                await _recovered(on_b, url, sid, pids, seen, epoch, b_id)
        assert b.returncode is None
        assert "the orphan sweep failed" in b.stderr_text()   # the outage cut the adoption
        assert "Traceback" not in b.stderr_text()
    finally:
        lock.close()
        a.kill()
        b.kill()


async def test_postgresql_stops_while_the_router_reads_whose_session_it_is(
        tmp_path: Path, own_cluster: Path) -> None:  # noqa: F811 - the fixture
    """REST's router, before adopting a session whose owner's lease expired for a
    caller of another principal, reads the session's maker from the journal
    (``Fleet.maker_seen``). PostgreSQL crashes during that read (held by the test's
    lock of ``session_prompts``; the wait is on ``pg_stat_activity``): the caller gets
    the retryable 503 ``store_unavailable``, nothing is adopted; with PostgreSQL back
    the same caller gets the 404 of a session it may not see, still nothing adopted,
    and the maker's own request adopts it. Two instances in process, on one injected
    clock, on a cluster of the test's own."""
    url = os.environ["_ACP_OWN_PG"]
    port = str(urllib.parse.urlsplit(url).port)
    now = [0.0]
    boot = "boot-" + "x" * 32
    flags = {"store": url, "lease_offset": lambda: now[0], "session_lease_ttl_ms": 60_000,
             "session_lease_renew_ms": 50_000, "token": boot}
    async with local_server(tmp_path, state_dir=tmp_path / "a", headers=bearer(boot),
                            **flags) as a, \
            local_server(tmp_path, state_dir=tmp_path / "b", headers=bearer(boot),
                         **flags) as b:
        alpha = await mint(a.server, "alpha", "prompt", "read")
        beta = await mint(a.server, "beta", "prompt", "read")
        sid = (await a.client.post("/session", json={"sessionScope": "thread"},
                                   headers=bearer(alpha))).json()["sessionId"]
        now[0] += 61   # a's lease expired: the next request b gets for it may adopt it
        lock = psycopg.connect(url)   # a transaction of the test's: held open
        try:
            lock.execute("LOCK TABLE session_prompts IN ACCESS EXCLUSIVE MODE")
            answers: list[httpx.Response] = []

            async def betas_read() -> None:
                answers.append(await b.client.get(f"/session/{sid}/status",
                                                  headers=bearer(beta)))

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(betas_read)
                    with psycopg.connect(url, autocommit=True) as watch:
                        while not _blocked_on_the_lock(watch):
                            await anyio.sleep(0.05)
                    await anyio.to_thread.run_sync(_pg, "crash", own_cluster)
        finally:
            lock.close()
        refused = answers[0]
        assert refused.status_code == 503, refused.text
        assert refused.json()["code"] == "store_unavailable", refused.text
        assert int(refused.headers["retry-after"]) > 0
        assert not b.bridge.has_session(sid) and b.server.fleet.stats.adoptions == 0

        _pg("start", own_cluster, port)
        with anyio.fail_after(60):   # 503s while the store reconnects, then beta's 404
            while True:
                again = await b.client.get(f"/session/{sid}/status", headers=bearer(beta))
                if again.status_code != 503:
                    break
                assert again.json()["code"] == "store_unavailable", again.text
                await anyio.sleep(0.1)
        assert again.status_code == 404, again.text
        assert again.json()["code"] == "session_not_found", again.text
        assert not b.bridge.has_session(sid) and b.server.fleet.stats.adoptions == 0
        mine = await b.client.get(f"/session/{sid}/status", headers=bearer(alpha))
        assert mine.status_code == 200, mine.text
        assert b.bridge.has_session(sid) and b.server.fleet.stats.adoptions == 1
