"""DELETE and reaping: sessions detached, permission requests cancelled, turns stopped."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.acp_http.server import RunningAcpServer, running_acp_server

pytestmark = pytest.mark.anyio


async def _waiting_on_permission(srv: RunningAcpServer, conn_id: str, conn_stream, sid: str,
                                 session_stream) -> None:
    await srv.prompt(conn_id, sid, 2, "/permission please")
    await session_stream.wait_for(lambda m: m.get("method") == "session/request_permission")
    assert srv.bridge.permissions.pending_count == 1


async def _settled(srv: RunningAcpServer, sid: str) -> None:
    with anyio.fail_after(3):
        while srv.bridge.permissions.pending_count or srv.bridge.get_session(sid).active:
            await anyio.sleep(0.02)


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
    assert server.bridge.get_session(sid).pending_count == 0   # detached, still alive
    assert server.registry.get(conn_id) is None


async def test_dropped_streams_reaped_after_grace(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path, grace_s=0.3) as srv:
        conn_id, _ = await srv.initialize()
        async with srv.stream(conn_id) as conn_stream:
            sid = await srv.new_session(conn_id, conn_stream)
            async with srv.stream(conn_id, sid) as session_stream:
                await _waiting_on_permission(srv, conn_id, conn_stream, sid, session_stream)
        # Streams gone: nothing happens within the grace period ...
        await anyio.sleep(0.1)
        assert srv.registry.get(conn_id) is not None
        assert srv.bridge.permissions.pending_count == 1
        # ... and the connection is reaped after it, with no request to trigger it.
        await _settled(srv, sid)
        assert srv.registry.get(conn_id) is None
        assert srv.registry.reaped == 1


async def test_reopened_stream_keeps_connection(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path, grace_s=0.3) as srv:
        conn_id, _ = await srv.initialize()
        async with srv.stream(conn_id):
            pass
        async with srv.stream(conn_id):
            await anyio.sleep(0.5)
            srv.registry.sweep()
            assert srv.registry.get(conn_id) is not None


async def test_never_streamed_connection_reaped(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path, grace_s=0.1, max_connections=1) as srv:
        await srv.initialize()
        await anyio.sleep(0.15)
        await srv.initialize()         # the cap frees the idle one first
        assert srv.registry.reaped == 1
