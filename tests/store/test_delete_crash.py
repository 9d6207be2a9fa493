"""A ``DELETE /session/{id}`` is answered only once the session's removal is committed
(issue #23: nothing is acknowledged before it is committed), found by the seeded crash
test (``test_crash_consistency.py``, seeds 20 and 21): the 204 went out while the
removal was still queued, so a ``kill -9`` right after it brought the session back.

A real ``acp-server serve`` whose journal commit is held back by another connection
(PostgreSQL: a lock on ``sessions``; SQLite: an exclusive transaction) is killed with
SIGKILL and started again on the same store::

    DELETE while the commit is held  ->  no answer (PostgreSQL) or 503 store_unavailable
    kill -9, restart                 ->  the session is back, whole (nothing was answered)
    DELETE again, answered 204       ->  kill -9, restart: it stays deleted

and in process, with the fault-injecting store: both doors' deletions (REST, ``/acp``
``session/close``) refused in their shape while the store is down.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from acp_server.rest.workspace import workspace_id
from tests.acp_http.server import request, running_acp_server
from tests.harness import ServeProcess, local_server
from tests.lmsp import stores
from tests.store.faults import faulty
from tests.store.test_fork_crash import _until
from tests.store.test_session_restart import _flags, _is, _prompt, read_events

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only; the server is its own process


async def _session_with_a_turn(client: httpx.AsyncClient) -> dict[str, Any]:
    created = (await client.post("/session", json={"sessionScope": "thread"})).json()
    sid = created["sessionId"]
    accepted = (await client.post(f"/session/{sid}/prompt", json=_prompt("hello"))).json()
    await read_events(client, sid, _is("turn_complete", accepted["promptId"]), last_event_id=0)
    return dict(created)


async def _listed(child: ServeProcess) -> list[str]:
    async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
        body = (await client.get(f"/workspace/{workspace_id(str(child.workspace))}/sessions"
                                 )).json()
        return [s["sessionId"] for s in body["sessions"]]


async def _back_whole(child: ServeProcess, created: dict[str, Any]) -> None:
    """Not deleted: listed, loadable under its epoch with its history."""
    sid = created["sessionId"]
    assert await _listed(child) == [sid]
    async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
        loaded = (await client.post(f"/session/{sid}/load", json={})).json()
        assert loaded["eventEpoch"] == created["eventEpoch"]
        assert [t["terminal"] for t in loaded["promptTerminals"]] == ["completed"]


async def _delete_then_kill_9(child: ServeProcess, sid: str) -> None:
    """A DELETE answered 204, then SIGKILL and a restart: the session stays deleted."""
    async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
        assert (await client.delete(f"/session/{sid}")).status_code == 204
    await anyio.to_thread.run_sync(child.kill)
    await anyio.to_thread.run_sync(child.start)
    assert sid not in await _listed(child)
    async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
        assert (await client.get(f"/session/{sid}/status")).status_code == 404
        assert (await client.post(f"/session/{sid}/load", json={})).status_code == 404


async def test_a_delete_is_not_answered_before_its_removal_commits_postgres(
        tmp_path: Path) -> None:
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    import psycopg

    child = ServeProcess(tmp_path, *_flags(tmp_path, "postgres"))
    url = child.flags[child.flags.index("--store") + 1]
    await anyio.to_thread.run_sync(child.start)
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
            created = await _session_with_a_turn(client)
        sid = created["sessionId"]
        answered: list[int] = []
        with psycopg.connect(url, autocommit=True) as watch, psycopg.connect(url) as lock:
            def held_back() -> bool:   # the removal's DELETE waits for the lock
                return bool(watch.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE 'DELETE FROM sessions%%'").fetchone())

            lock.execute("LOCK TABLE sessions IN SHARE MODE")   # blocks the removal only
            async with httpx.AsyncClient(base_url=child.base_url, timeout=60) as client:
                async with anyio.create_task_group() as tg:
                    async def delete() -> None:
                        try:
                            answered.append((await client.delete(f"/session/{sid}")).status_code)
                        except httpx.TransportError:
                            pass   # the server died under it

                    tg.start_soon(delete)
                    await _until(held_back)
                    assert answered == [], "DELETE answered before its removal committed"
                    await anyio.to_thread.run_sync(child.kill)
            lock.rollback()   # the dead server's transaction is rolled back, never committed
        await anyio.to_thread.run_sync(child.start)
        await _back_whole(child, created)
        await _delete_then_kill_9(child, sid)
    finally:
        await anyio.to_thread.run_sync(child.stop)


async def test_a_delete_while_sqlite_is_locked_is_503_and_lands_later(tmp_path: Path) -> None:
    """The removal cannot commit: 503 ``store_unavailable`` (the session is closed here
    all the same: a retry is 404); killed meanwhile, the session is back. Once the store
    is back the queued removal commits, and the session stays deleted across a kill."""
    child = ServeProcess(tmp_path, "--store-busy-timeout-ms", "300")
    await anyio.to_thread.run_sync(child.start)
    db = tmp_path / "state" / "lmsp.sqlite3"
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
            created = await _session_with_a_turn(client)
            sid = created["sessionId"]
            holder = sqlite3.connect(db, isolation_level=None, timeout=5)
            holder.execute("BEGIN EXCLUSIVE")   # the writer waits 0.3 s, then gives up
            try:
                refused = await client.delete(f"/session/{sid}")
                assert refused.status_code == 503, refused.text
                assert refused.json()["code"] == "store_unavailable"
                assert (await client.delete(f"/session/{sid}")).status_code == 404
                await anyio.to_thread.run_sync(child.kill)
            finally:
                holder.execute("ROLLBACK")
                holder.close()
        await anyio.to_thread.run_sync(child.start)
        await _back_whole(child, created)   # nothing was acknowledged

        async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
            holder = sqlite3.connect(db, isolation_level=None, timeout=5)
            holder.execute("BEGIN EXCLUSIVE")
            try:
                refused = await client.delete(f"/session/{sid}")
                assert refused.status_code == 503, refused.text
            finally:
                holder.execute("ROLLBACK")
                holder.close()

        def removed() -> bool:   # the queued removal committed once the lock went
            with sqlite3.connect(db) as reader:
                return reader.execute("SELECT 1 FROM sessions WHERE id = ?",
                                      (sid,)).fetchone() is None

        await _until(removed)
        await anyio.to_thread.run_sync(child.kill)
        await anyio.to_thread.run_sync(child.start)
        assert sid not in await _listed(child)
    finally:
        await anyio.to_thread.run_sync(child.stop)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_deletion_while_the_store_is_down_is_refused_in_each_door(
        tmp_path: Path, store_name: str) -> None:
    """Both doors' deletions (REST ``DELETE``, ``/acp`` ``session/close``) while the
    journal cannot commit: 503 ``store_unavailable`` / the JSON-RPC error with
    ``data.errorKind``, never a success; the removals commit once the store is back, so
    the next start brings neither session back."""
    store = faulty(tmp_path)
    async with running_acp_server(tmp_path, lmsp_store=store) as srv:
        rest_sid = (await srv.client.post("/session", json={"sessionScope": "thread"})
                    ).json()["sessionId"]
        conn_id, _ = await srv.initialize()
        async with srv.stream(conn_id) as conn_stream:
            acp_sid = await srv.new_session(conn_id, conn_stream)
            journal = srv.bridge.journal
            await journal.wait(journal.appended)   # both sessions committed
            store.faults.on()
            refused = await srv.client.delete(f"/session/{rest_sid}")
            assert refused.status_code == 503, refused.text
            assert refused.json()["code"] == "store_unavailable"
            async with srv.stream(conn_id, acp_sid) as session_stream:
                await srv.post(conn_id, request(4, "session/close", {"sessionId": acp_sid}),
                               acp_sid)
                answer = await session_stream.wait_for_id(4)
            assert answer["error"]["data"]["errorKind"] == "store_unavailable", answer
            store.faults.off()
            await journal.wait(journal.appended)   # the removals land once it is back
    async with local_server(tmp_path, lmsp_store=faulty(tmp_path)) as srv:
        assert srv.bridge.list_sessions() == []
