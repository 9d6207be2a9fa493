"""Sessions come and go through every door; what the server keeps for them goes with
them. Each test drives one cycle many times against the in-process server (real
loopback HTTP, the reference agent, the durable SQLite session journal), brings the
server back to idle and compares what it holds with the baseline taken after one
warm-up cycle.

    async with running_acp_server(tmp_path, clock=clock) as srv:
        ...   # N connections each loading an unknown session id
        assert len(srv.bridge._held) == baseline
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acp_http.server import FakeClock, request, running_acp_server
from tests.bridge.helpers import wait_until
from tests.rest.server import running_server

pytestmark = pytest.mark.anyio

CYCLES = 200


async def test_failed_loads_hold_nothing_rest(tmp_path: Path) -> None:
    """``POST /session/{id}/load`` of ids the agent does not know: each is a session
    registered for the load and undone when the agent refuses; its event bus is not
    held for the journal afterwards."""
    async with running_server(tmp_path) as srv:
        before = len(srv.bridge._held)
        for n in range(CYCLES):
            response = await srv.client.post(f"/session/unknown-{n}/load", json={})
            assert response.status_code == 404, response.text
        assert srv.bridge.stats().sessions == 0
        assert len(srv.bridge._held) == before


async def test_failed_loads_hold_nothing_acp(tmp_path: Path) -> None:
    """``session/load`` of unknown ids over ``/acp``, from connections that then go away
    without a DELETE (reaped after the grace): nothing of them stays."""
    clock = FakeClock()
    async with running_acp_server(tmp_path, clock=clock) as srv:
        before = len(srv.bridge._held), len(srv.registry.connections)
        for n in range(CYCLES // 4):
            conn_id, _ = await srv.initialize()
            async with srv.stream(conn_id) as conn_stream:
                for k in range(4):
                    rpc_id = 10 + k
                    await srv.post(conn_id, request(rpc_id, "session/load", {
                        "sessionId": f"unknown-{n}-{k}", "cwd": srv.workspace,
                        "mcpServers": []}))
                    reply = await conn_stream.wait_for_id(rpc_id)
                    assert "error" in reply, reply
            conn = srv.registry.get(conn_id)
            assert conn is not None
            await wait_until(lambda: conn.open_streams == 0 and clock.sleepers > 0)
            clock.advance(3600)
            await wait_until(lambda: srv.registry.get(conn_id) is None)
        assert srv.bridge.stats().sessions == 0
        assert (len(srv.bridge._held), len(srv.registry.connections)) == before
