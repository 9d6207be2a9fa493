"""A crash during a branch (ACP ``session/fork``) leaves no half-made session (issue
#23): a real ``acp-server serve`` with a stdio agent fixture, killed with SIGKILL while
the agent holds the fork, and (on PostgreSQL, where another connection can hold the
commit back deterministically) after the agent answered but before the fork's record
committed. After the restart the list has the parent only, its history intact, and it
takes prompts."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from tests.agents import fixture_command
from tests.harness import ServeProcess
from tests.lmsp import stores
from tests.store.test_session_restart import _flags, _is, _prompt, read_events

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only; the server is its own process


async def _until(check: Any, timeout: float = 20) -> None:
    with anyio.fail_after(timeout):
        while not await anyio.to_thread.run_sync(check):
            await anyio.sleep(0.02)


async def _parent_with_a_turn(client: httpx.AsyncClient) -> str:
    sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
    accepted = (await client.post(f"/session/{sid}/prompt", json=_prompt("hello"))).json()
    await read_events(client, sid, _is("turn_complete", accepted["promptId"]), last_event_id=0)
    return sid


async def _branch_until_killed(child: ServeProcess, sid: str, ready: Any) -> None:
    """Ask for the branch; once ``ready()`` holds, ``kill -9`` the server under it."""
    async with httpx.AsyncClient(base_url=child.base_url, timeout=60) as client:
        async with anyio.create_task_group() as tg:
            async def branch() -> None:
                with pytest.raises(httpx.TransportError):   # the server died under it
                    await client.post(f"/session/{sid}/branch", json={})

            tg.start_soon(branch)
            await _until(ready)
            child.kill()


async def _parent_intact(child: ServeProcess, sid: str) -> None:
    async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
        listed = (await client.get(f"/workspace/{_workspace_id(child)}/sessions")).json()
        assert [s["sessionId"] for s in listed["sessions"]] == [sid]
        loaded = (await client.post(f"/session/{sid}/load", json={})).json()
        said = [e["data"]["update"]["content"]["text"] for e in loaded["compactedReplay"]
                if e["type"] == "session_update"]
        assert said == ["hello", "forky: hello"]
        assert [t["terminal"] for t in loaded["promptTerminals"]] == ["completed"]
        again = (await client.post(f"/session/{sid}/prompt", json=_prompt("again"))).json()
        done = await read_events(client, sid, _is("turn_complete", again["promptId"]),
                                 last_event_id=loaded["lastEventId"])
        assert done[-1]["data"]["stopReason"] == "end_turn"


def _workspace_id(child: ServeProcess) -> str:
    from acp_server.rest.workspace import workspace_id
    return workspace_id(str(child.workspace))


def _agent(mode: str) -> list[str]:
    return ["--agent", shlex.join(fixture_command("forky", "--fork", mode))]


async def test_a_crash_while_the_agent_forks(tmp_path: Path) -> None:
    child = ServeProcess(tmp_path, *_flags(tmp_path, "sqlite"), *_agent("hang"))
    await anyio.to_thread.run_sync(child.start)
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
            sid = await _parent_with_a_turn(client)
        await _branch_until_killed(child, sid, (tmp_path / "fork-asked").exists)
        await anyio.to_thread.run_sync(child.start)
        await _parent_intact(child, sid)
    finally:
        await anyio.to_thread.run_sync(child.stop)


async def test_a_crash_after_the_fork_answered_before_its_record_committed(
        tmp_path: Path) -> None:
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    import psycopg

    url = stores.postgres_url_for(tmp_path, "fork")
    child = ServeProcess(tmp_path, *_flags(tmp_path, "sqlite"), "--store", url,
                         *stores.lease_flags(), *_agent("answer"))
    await anyio.to_thread.run_sync(child.start)
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
            sid = await _parent_with_a_turn(client)
        with psycopg.connect(url, autocommit=True) as watch, psycopg.connect(url) as lock:
            def settled() -> bool:   # the parent's terminal is committed: nothing pending
                row = watch.execute("SELECT terminal IS NOT NULL FROM session_prompts "
                                    "WHERE session_id = %s", (sid,)).fetchone()
                return bool(row and row[0])

            def held_back() -> bool:   # the fork answered; its record's INSERT waits
                return (tmp_path / "fork-answered").exists() and bool(watch.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE 'INSERT INTO sessions%%'").fetchone())

            await _until(settled)
            # SHARE: blocks a new session's INSERT, lets every other journal write by
            lock.execute("LOCK TABLE sessions IN SHARE MODE")
            await _branch_until_killed(child, sid, held_back)
            lock.rollback()   # the dead server's transaction is rolled back, never committed
        await anyio.to_thread.run_sync(child.start)
        await _parent_intact(child, sid)
    finally:
        await anyio.to_thread.run_sync(child.stop)
