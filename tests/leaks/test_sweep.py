"""A whole server, walked: after many cycles of REST and ``/acp`` work brought back to
idle, no container the server holds grew by half an entry a cycle or more, except
the caches named in ``BOUNDED`` (each capped by its own module, and checked there).
It is the net under the targeted tests of this folder: a structure nobody thought of
that keeps something per session, prompt, connection or request fails it.

    before = await _idle_sizes(srv)
    ...   # CYCLES cycles, then idle again
    assert per_cycle(before, await _idle_sizes(srv)) == {}
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from tests.acp_http.server import FakeClock, request, running_acp_server
from tests.bridge.helpers import wait_until
from tests.harness import LocalServer
from tests.leaks.sizes import container_sizes, grown
from tests.rest.server import running_server

pytestmark = pytest.mark.anyio

CYCLES = 100
# Caches with a fixed cap, filled one entry a cycle until it: the closed sessions'
# owners and terminals (bridge.bridge), the owners map (principals.ownership), the
# front layer's hot paths (http.front), the reference agent's own session histories.
BOUNDED = ("._closed_owners", "._closed_terminals", "._owners", "._hot_seen",
           "factory.store._sessions", "._store._sessions")


def per_cycle(before: dict[str, int], after: dict[str, int]) -> dict[str, tuple[int, int]]:
    """What grew by half an entry a cycle or more, outside ``BOUNDED``."""
    return {path: sizes for path, sizes in grown(before, after, slack=CYCLES // 2).items()
            if not any(cache in path for cache in BOUNDED)}


async def _idle_sizes(srv: LocalServer) -> dict[str, int]:
    """Sizes once every session is gone and the journal committed what they wrote
    (their buses are held until then)."""
    await wait_until(lambda: srv.bridge.stats().sessions == 0 and not srv.bridge._held)
    gc.collect()
    return container_sizes(srv.server)


async def test_rest_cycles_leave_nothing_per_cycle(tmp_path: Path) -> None:
    async with running_server(tmp_path) as srv:
        async def cycle(n: int) -> None:
            created = await srv.create_session(sessionScope="thread")
            sid, client = created["sessionId"], {"X-Qwen-Client-Id": created["clientId"]}
            accepted = (await srv.prompt(sid, "/chunks 20 hello", **client)).json()
            async with srv.client.stream("GET", f"/session/{sid}/events",
                                         headers={"Last-Event-ID": "0"}) as stream:
                async for _chunk in stream.aiter_bytes():
                    break   # a reader that goes away mid-stream
            await srv.events_until(sid, "turn_complete", last_event_id=accepted["lastEventId"])
            asked = (await srv.prompt(sid, "/permission")).json()
            await srv.events_until(sid, "permission_request", last_event_id=asked["lastEventId"])
            await srv.client.post(f"/session/{sid}/cancel", json={})
            await srv.events_until(sid, "turn_complete", last_event_id=asked["lastEventId"])
            branch = (await srv.client.post(f"/session/{sid}/branch", json={})).json()
            await srv.client.post(f"/session/unknown-{n}/load", json={})
            await srv.client.get(f"/nowhere/{n}")
            assert (await srv.client.delete(f"/session/{branch['sessionId']}")).status_code == 204
            assert (await srv.client.delete(f"/session/{sid}")).status_code == 204

        await cycle(-1)
        before = await _idle_sizes(srv)
        for n in range(CYCLES):
            await cycle(n)
        assert per_cycle(before, await _idle_sizes(srv)) == {}


async def test_acp_cycles_leave_nothing_per_cycle(tmp_path: Path) -> None:
    clock = FakeClock()
    async with running_acp_server(tmp_path, clock=clock) as srv:
        async def cycle(n: int) -> None:
            conn_id, _ = await srv.initialize()
            async with srv.stream(conn_id) as conn_stream:
                sid = await srv.new_session(conn_id, conn_stream)
                async with srv.stream(conn_id, sid) as session_stream:
                    await srv.prompt(conn_id, sid, 2, "/permission")
                    await session_stream.wait_for(
                        lambda m: m.get("method") == "session/request_permission")
                    await srv.prompt(conn_id, sid, 3, "/sleep 10s")   # abandoned
                    await srv.post(conn_id, request(4, "session/load", {
                        "sessionId": f"unknown-{n}", "cwd": srv.workspace, "mcpServers": []}))
                    await conn_stream.wait_for_id(4)
            conn = srv.registry.get(conn_id)
            assert conn is not None
            await wait_until(lambda: conn.open_streams == 0 and clock.sleepers > 0)
            clock.advance(3600)   # gone without a DELETE: reaped after the grace
            await wait_until(lambda: srv.registry.get(conn_id) is None
                             and not srv.bridge.has_session(sid))

        await cycle(-1)
        before = await _idle_sizes(srv)
        for n in range(CYCLES):
            await cycle(n)
        assert per_cycle(before, await _idle_sizes(srv)) == {}
