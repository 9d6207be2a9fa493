"""The bounded write-behind window (``--session-write-behind``, ``acp_server.store.
write_behind``): its bookkeeping, and ``kill -9`` of a real server on both stores: a
session caught with its marker set resyncs (a new epoch, never a gap); a quiet one keeps
its epoch and its reader resumes exactly."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import httpx
import pytest

from acp_server.store.write_behind import MARKER_ID, WriteBehind
from tests.harness import ServeProcess
from tests.store.test_session_restart import _flags, _ids, _is, _prompt, read_events

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only; the server is its own process


def test_the_window_opens_after_the_marker_commits_and_closes_when_quiet() -> None:
    wb = WriteBehind(window=3)
    marker = wb.before_event("s", 1)
    assert marker is not None and marker.on
    assert wb.before_event("s", 2) is None          # one marker per arming
    assert not wb.early("s", 2)                      # held until the marker commits
    wb.marker_landed(marker)
    assert wb.early("s", 2) and wb.early("s", 3)
    assert not wb.early("s", 4)                      # past the window: waits for a commit
    wb.committed("s", 2)
    assert wb.early("s", 5) and not wb.early("s", 6)
    wb.prompt("s", 1)
    wb.committed("s", 2)
    assert wb.quiet({"s"}) == []                      # events uncommitted, a prompt open
    wb.before_event("s", 6)
    wb.committed("s", 6)
    assert wb.quiet({"s"}) == []                      # the prompt is still open
    wb.prompt("s", -1)
    [cleared] = wb.quiet({"s"})
    assert not cleared.on and cleared.session_id == "s"
    assert not wb.early("s", 7)                      # held again from the clear on
    again = wb.before_event("s", 7)
    assert again is not None and again.generation > marker.generation
    wb.marker_landed(marker)                          # a stale marker arms nothing
    assert not wb.early("s", 7)


def test_an_earlier_lifes_late_commit_counts_for_nothing_in_the_next() -> None:
    """A refused load's marker and events (bus ``old``) land after the id is loaded
    again (bus ``new``): the new life stays held until its own marker lands, and its
    window counts from its own committed events only."""
    wb = WriteBehind(window=2)
    old_marker = wb.before_event("s", 1, "old")
    assert old_marker is not None
    wb.before_event("s", 5, "old")
    wb.ended("s")                                     # the load undone; loaded again
    new_marker = wb.before_event("s", 1, "new")
    assert new_marker is not None and new_marker.generation != old_marker.generation
    wb.committed("s", 5, "old")                       # the late commit lands
    wb.marker_landed(old_marker)
    assert not wb.early("s", 1)                       # its own marker has not landed
    assert wb.quiet({"s"}) == []
    wb.marker_landed(new_marker)
    wb.before_event("s", 3, "new")
    assert wb.early("s", 2) and not wb.early("s", 3)  # counted from none committed
    wb.committed("s", 1, "new")
    assert wb.early("s", 3)


def _marker_set(store: str, sid: str) -> bool:
    if store.startswith("postgresql"):
        import psycopg

        with psycopg.connect(store) as conn:
            row = conn.execute("SELECT 1 FROM session_segments WHERE session_id = %s "
                               "AND last_id = %s",
                               (sid, MARKER_ID)).fetchone()
    else:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as conn:
            row = conn.execute("SELECT 1 FROM session_segments WHERE session_id = ? "
                               "AND last_id = ?",
                               (sid, MARKER_ID)).fetchone()
    return row is not None


async def _until_marker(store: str, sid: str, present: bool) -> None:
    """Wait (a condition, polled) until the session's marker row is (not) committed."""
    with anyio.fail_after(20):
        while await anyio.to_thread.run_sync(_marker_set, store, sid) != present:
            await anyio.sleep(0.02)


def _store_of(tmp_path: Path, flags: list[str]) -> str:
    if "--store" in flags:
        return flags[flags.index("--store") + 1]
    return str(tmp_path / "state" / "lmsp.sqlite3")


async def test_kill_9_resyncs_a_session_with_its_marker_set_and_keeps_a_quiet_one(
        tmp_path: Path, store_name: str) -> None:
    flags = [*_flags(tmp_path, store_name), "--session-write-behind", "64"]
    store = _store_of(tmp_path, flags)
    child = ServeProcess(tmp_path, *flags).start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            sessions = []
            for _ in range(2):
                created = (await client.post("/session", json={"sessionScope": "thread"})).json()
                sessions.append((created["sessionId"], created["eventEpoch"]))
            (quiet, quiet_epoch), (busy, busy_epoch) = sessions
            done = (await client.post(f"/session/{quiet}/prompt",
                                      json=_prompt("/chunks 50 hello"))).json()["promptId"]
            seen_quiet = await read_events(client, quiet, _is("turn_complete", done),
                                           last_event_id=0)
            await _until_marker(store, quiet, present=False)   # all committed: cleared
            long_id = (await client.post(f"/session/{busy}/prompt",
                                         json=_prompt("/sleep 30s long"))).json()["promptId"]
            seen_busy = await read_events(client, busy, lambda e: e.get("promptId") == long_id
                                          and e["type"] == "session_update", last_event_id=0)
            await _until_marker(store, busy, present=True)     # a prompt open: set
        child.kill()   # SIGKILL: no drain, no clean stop
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            cursor = _ids(seen_quiet)[-1]
            follow = (await client.post(f"/session/{quiet}/prompt",
                                        json=_prompt("after"))).json()["promptId"]
            after = await read_events(client, quiet, _is("turn_complete", follow),
                                      last_event_id=cursor, epoch=quiet_epoch)
            assert not [e for e in after if e["type"] == "state_resync_required"]
            ids = _ids(after)
            assert ids == list(range(cursor + 1, cursor + 1 + len(ids)))   # no gap, no dup
            loaded = (await client.post(f"/session/{quiet}/load", json={})).json()
            assert loaded["eventEpoch"] == quiet_epoch

            resumed = await read_events(client, busy,
                                        lambda e: e["type"] == "state_resync_required",
                                        last_event_id=_ids(seen_busy)[-1], epoch=busy_epoch)
            assert resumed[-1]["data"]["reason"] == "epoch_reset"
            loaded = (await client.post(f"/session/{busy}/load", json={})).json()
            assert loaded["eventEpoch"] != busy_epoch
            terminals = {t["promptId"]: t for t in loaded["promptTerminals"]}
            assert terminals[long_id]["errorCode"] == "server_restarted"
    finally:
        child.stop()
