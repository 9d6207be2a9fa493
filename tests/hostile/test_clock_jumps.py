"""The wall clock jumps (an NTP step, a VM restored from a snapshot, a wrong date set by
hand) under a running server, with the injected clocks of ``open_server``: the LMSP
task store's (``LmspConfig.clock``: created / finished times, retention, the purge) and
the session journal's (``session_clock``: the closes it records, its retention).

A jump, backwards or far forwards between two reads, never purges a live task or a
live session, never fails a request and never hangs: retention is judged by the clock
only for what has ended (a forward jump ends the retention of what had finished, as
that much time passing would; a backward one lengthens it). See
``docs/operations.md``, "Faults of the machine".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from acp_server.lmsp import LmspConfig
from tests.lmsp.server import FakeClock, LmspServer, running_lmsp

pytestmark = pytest.mark.anyio
YEARS_10 = 10 * 365 * 24 * 3600.0
RETENTION_S = 3600.0


async def live_and_ended(srv: LmspServer) -> dict[str, str]:
    """A running task (its agent sleeps), a finished one, a live session that ran a
    prompt and a closed session; their ids."""
    running = await srv.create("/sleep 120s")
    await srv.wait(running["id"], {"running"})
    finished = await srv.create("done")
    await srv.wait(finished["id"])
    live = (await srv.client.post("/session", json={"sessionScope": "thread"})).json()
    prompt = await srv.client.post(f"/session/{live['sessionId']}/prompt", json={
        "prompt": [{"type": "text", "text": "before the jump"}]})
    assert prompt.status_code == 202, prompt.text
    closed = (await srv.client.post("/session", json={"sessionScope": "thread"})).json()
    await srv.bridge.close_session(closed["sessionId"], reason="idle_timeout")   # kept
    return {"running": running["id"], "finished": finished["id"],
            "live": live["sessionId"], "closed": closed["sessionId"]}


async def still_served(srv: LmspServer, ids: dict[str, str]) -> None:
    """The live task and session are there, and new work is accepted and runs."""
    assert (await srv.get(ids["running"]))["status"] == "running"
    status = await srv.client.get(f"/session/{ids['live']}/status")
    assert status.status_code == 200, status.text
    again = await srv.client.post(f"/session/{ids['live']}/prompt", json={
        "prompt": [{"type": "text", "text": "after the jump"}]})
    assert again.status_code == 202, again.text
    fresh = await srv.create("after the jump")
    assert (await srv.wait(fresh["id"]))["status"] == "succeeded"
    listed = await srv.client.get("/lmsp/v1/tasks", params={"limit": "100"})
    assert listed.status_code == 200
    assert ids["running"] in {task["id"] for task in listed.json()["data"]}


async def purge(srv: LmspServer) -> tuple[int, int]:
    return await srv.service.purge_once(), await srv.server.purge_sessions()


def settings(clock: FakeClock) -> dict[str, Any]:
    return {"config": LmspConfig(clock=clock, task_retention_s=RETENTION_S,
                                 event_retention_s=RETENTION_S),
            "session_clock": clock, "session_retention_ms": int(RETENTION_S * 1000)}


async def test_a_clock_that_jumps_back_purges_nothing_and_serves(tmp_path: Path) -> None:
    clock = FakeClock()
    async with running_lmsp(tmp_path, **settings(clock)) as srv:
        ids = await live_and_ended(srv)
        clock.advance(-YEARS_10)   # what ended now ended "in the future"
        assert await purge(srv) == (0, 0)
        await still_served(srv, ids)
        assert (await srv.get(ids["finished"]))["status"] == "succeeded"
        clock.advance(YEARS_10 + RETENTION_S + 1)   # back, and past the retention
        tasks, sessions = await purge(srv)
        assert tasks >= 1 and sessions == 1   # what had ended, only
        await still_served(srv, ids)
        await srv.service.cancel(ids["running"])


async def test_a_clock_that_jumps_far_forward_purges_only_what_ended(tmp_path: Path) -> None:
    clock = FakeClock()
    async with running_lmsp(tmp_path, **settings(clock)) as srv:
        ids = await live_and_ended(srv)
        clock.advance(YEARS_10)
        tasks, sessions = await purge(srv)
        assert tasks >= 1 and sessions == 1
        gone = await srv.client.get(f"/lmsp/v1/tasks/{ids['finished']}")
        assert gone.status_code == 404   # its retention is over, by this clock
        await still_served(srv, ids)
        clock.advance(-YEARS_10)   # and back again: the later work is not lost either
        assert await purge(srv) == (0, 0)
        await still_served(srv, ids)
        await srv.service.cancel(ids["running"])
