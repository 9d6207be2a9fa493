"""Abandoned ``/acp`` connections do not fill the session cap (#21 item 7), over real
HTTP with the real ``acp-server serve``.

1,000 ``initialize`` + ``DELETE`` cycles, every fourth with a ``session/new`` (which
runs after its 202, so the DELETE may come before or after the session exists), leave
no live session and no slot in flight: an LMSP response still runs at once.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.harness import ServeProcess
from tests.hostile.test_hung_agents import runtime, wait_for

pytestmark = pytest.mark.anyio

CYCLES = 1000


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the servers are child processes
async def test_deleted_connections_close_the_sessions_they_made(tmp_path: Path) -> None:
    async with ServeProcess(tmp_path) as daemon:
        client = daemon.client
        for cycle in range(CYCLES):
            init = await client.post("/acp", json={"jsonrpc": "2.0", "id": 0,
                                                   "method": "initialize",
                                                   "params": {"protocolVersion": 1}})
            assert init.status_code == 200, init.text
            headers = {"Acp-Connection-Id": init.headers["acp-connection-id"]}
            if cycle % 4 == 0:
                posted = await client.post("/acp", headers=headers, json={
                    "jsonrpc": "2.0", "id": 1, "method": "session/new",
                    "params": {"cwd": str(tmp_path), "mcpServers": []}})
                assert posted.status_code == 202, posted.text
                if cycle % 8 == 0:   # half of them: DELETE once the session exists
                    await wait_for(daemon, lambda r: r["sessions"]["active"] == 1)
            deleted = await client.delete("/acp", headers=headers)
            assert deleted.status_code == 202, deleted.text
        done = await wait_for(daemon, lambda r: r["sessions"]["active"] == 0
                              and r["sessions"]["admissionInFlight"] == 0)
        assert done["activity"]["pendingPrompts"] == 0
        with anyio.fail_after(30):
            answer = await client.post("/lmsp/v1/responses", json={
                "model": "reference", "input": "room left", "store": False})
        assert answer.status_code == 200 and answer.json()["status"] == "completed", answer.text
        assert (await runtime(daemon))["sessions"]["active"] == 0
