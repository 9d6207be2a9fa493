"""DELETE and reaping: permission requests cancelled, turns stopped, the sessions a
connection made closed unless another connection attached them.

Grace periods run on a ``FakeClock`` the tests advance; every wait is on a condition.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acp_http.server import FakeClock, RunningAcpServer, request, running_acp_server
from tests.bridge.helpers import wait_until

pytestmark = pytest.mark.anyio

GRACE_S = 10.0


async def _waiting_on_permission(srv: RunningAcpServer, conn_id: str, conn_stream, sid: str,
                                 session_stream) -> None:
    await srv.prompt(conn_id, sid, 2, "/permission please")
    await session_stream.wait_for(lambda m: m.get("method") == "session/request_permission")
    assert srv.bridge.permissions.pending_count == 1


async def _settled(srv: RunningAcpServer, sid: str) -> None:
    """The permission request is cancelled and the session the connection made is
    closed."""
    await wait_until(lambda: not srv.bridge.permissions.pending_count
                     and not srv.bridge.has_session(sid), timeout=30)


async def _streams_gone(srv: RunningAcpServer, clock: FakeClock, conn_id: str) -> None:
    """The server saw every stream of the connection end, and a grace wait started."""
    conn = srv.registry.get(conn_id)
    assert conn is not None
    await wait_until(lambda: conn.open_streams == 0 and clock.sleepers > 0)


async def test_delete_cleans_up(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as session_stream:
            await _waiting_on_permission(server, conn_id, conn_stream, sid, session_stream)
            response = await server.client.delete("/acp", headers={"Acp-Connection-Id": conn_id})
            assert response.status_code == 202
            await session_stream.wait_for_end()
        await conn_stream.wait_for_end()
    await _settled(server, sid)
    assert server.registry.get(conn_id) is None


async def test_delete_keeps_a_session_another_connection_attached(
        server: RunningAcpServer) -> None:
    maker, _ = await server.initialize()
    other, _ = await server.initialize()
    async with server.stream(maker) as maker_stream, server.stream(other) as other_stream:
        sid = await server.new_session(maker, maker_stream)
        response = await server.post(other, request(7, "session/load", {
            "sessionId": sid, "cwd": server.workspace, "mcpServers": []}))
        assert response.status_code == 202
        await other_stream.wait_for_id(7)
        assert (await server.client.delete("/acp", headers={"Acp-Connection-Id": maker})
                ).status_code == 202
        await maker_stream.wait_for_end()
        assert server.bridge.has_session(sid)          # attached elsewhere: kept
        assert (await server.client.delete("/acp", headers={"Acp-Connection-Id": other})
                ).status_code == 202
    await wait_until(lambda: not server.bridge.has_session(sid))   # the last one out


async def test_dropped_streams_reaped_after_grace(tmp_path: Path) -> None:
    clock = FakeClock()
    async with running_acp_server(tmp_path, grace_s=GRACE_S, clock=clock) as srv:
        conn_id, _ = await srv.initialize()
        async with srv.stream(conn_id) as conn_stream:
            sid = await srv.new_session(conn_id, conn_stream)
            async with srv.stream(conn_id, sid) as session_stream:
                await _waiting_on_permission(srv, conn_id, conn_stream, sid, session_stream)
        await _streams_gone(srv, clock, conn_id)
        # Streams gone: nothing happens within the grace period ...
        clock.advance(GRACE_S / 2)
        assert srv.registry.sweep() == []
        assert srv.registry.get(conn_id) is not None
        assert srv.bridge.permissions.pending_count == 1
        # ... and the connection is reaped after it, with no request to trigger it.
        clock.advance(GRACE_S / 2)
        await wait_until(lambda: srv.registry.get(conn_id) is None)
        await _settled(srv, sid)
        assert srv.registry.reaped == 1


async def test_reopened_stream_keeps_connection(tmp_path: Path) -> None:
    clock = FakeClock()
    async with running_acp_server(tmp_path, grace_s=GRACE_S, clock=clock) as srv:
        conn_id, _ = await srv.initialize()
        async with srv.stream(conn_id):
            pass
        await _streams_gone(srv, clock, conn_id)
        async with srv.stream(conn_id):
            clock.advance(2 * GRACE_S)
            await wait_until(lambda: clock.sleepers == 0)   # the grace waits swept
            assert srv.registry.sweep() == []
            assert srv.registry.get(conn_id) is not None
            assert srv.registry.reaped == 0


async def test_never_streamed_connection_reaped(tmp_path: Path) -> None:
    clock = FakeClock()
    async with running_acp_server(tmp_path, grace_s=GRACE_S, max_connections=1,
                                  clock=clock) as srv:
        await srv.initialize()
        clock.advance(GRACE_S)
        await srv.initialize()         # the cap frees the idle one first
        assert srv.registry.reaped == 1
