"""``acp_server.http.idle``: which connections the sweep shuts down, on real sockets of
this process (the daemon-level cases are ``tests/hostile/test_idle.py``)."""

from __future__ import annotations

import socket

import anyio
import pytest

from acp_server.http.idle import Activity, IdleConnections, Tracked, peer_key, survey

pytestmark = [pytest.mark.anyio,
              pytest.mark.skipif(not IdleConnections.supported(), reason="Linux only")]


def test_peer_key_names_both_sides_alike() -> None:
    assert peer_key(("127.0.0.1", 5)) == ("127.0.0.1", 5)
    assert peer_key(("::ffff:127.0.0.1", 5, 0, 0)) == ("127.0.0.1", 5)
    assert peer_key(("[::1]", 5)) == ("::1", 5)
    assert peer_key(None) is None and peer_key(("not an address", 5)) is None


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_only_connections_idle_at_two_sweeps_are_shut_down() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        pairs = []
        for _ in range(3):
            client = socket.create_connection(listener.getsockname())
            pairs.append((client, listener.accept()[0]))
        (idle_client, _), (busy_client, busy), (new_client, new) = pairs
        activity = Activity()
        seen = {c.peer: c for c in await anyio.to_thread.run_sync(survey, port)}
        assert len(seen) == 3
        activity.enter(peer_key(busy.getpeername()))            # a request in flight
        sweep = IdleConnections(port=port, timeout_s=0.0, activity=activity)
        assert await sweep.sweep() == 0                          # first sight: candidates
        activity.enter(peer_key(new.getpeername()))              # one starts meanwhile
        activity.leave(peer_key(new.getpeername()))
        assert await sweep.sweep() == 1                          # the idle one only
        idle_client.settimeout(5)
        assert idle_client.recv(1) == b""                        # shut down (its close resets)
        idle = pairs[0][1]
        assert idle.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER) != 0
        for client in (busy_client, new_client):
            client.setblocking(False)
            with pytest.raises(BlockingIOError):                 # still open
                client.recv(1)
        for a, b in pairs:
            a.close()
            b.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_tracked_counts_a_request_until_it_ends() -> None:
    activity = Activity()
    inside = []

    async def app(scope: dict, receive: object, send: object) -> None:
        inside.append(dict(activity.active))
        scope["client"] = ("10.0.0.9", 0)        # the front layer's forwarded caller

    await Tracked(app, activity)({"type": "http", "client": ("127.0.0.1", 7)}, None, None)
    assert inside == [{("127.0.0.1", 7): 1}]
    assert activity.active == {} and ("127.0.0.1", 7) in activity.ended
    assert activity.started == {("127.0.0.1", 7): 1}
