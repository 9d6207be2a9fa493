"""The SSE route over real HTTP: headers, framing, heartbeat, replay cursors, limits,
stream end on close, and subscription release on client disconnect."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import anyio
import pytest

from bridge import BridgeOptions
from tests.rest.server import RunningServer, running_server

pytestmark = pytest.mark.anyio


async def test_headers_and_first_frame(server: RunningServer) -> None:
    created = await server.create_session()
    sid = created["sessionId"]
    async with server.client.stream("GET", f"/session/{sid}/events") as response:
        assert response.status_code == 200
        headers = response.headers
        assert headers["content-type"] == "text/event-stream"
        assert headers["cache-control"] == "no-cache, no-transform"
        assert headers["x-accel-buffering"] == "no"
        assert headers["x-qwen-event-epoch"] == created["eventEpoch"]
        assert len(headers["x-qwen-sse-stream-id"]) == 36
        async with aclosing(response.aiter_raw()) as chunks:
            first = await chunks.__anext__()
        assert first.startswith(b"retry: 3000\n")
        assert not first.startswith(b"retry: 3000\n\n")  # never a frame without data


async def test_frame_shape(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    accepted = (await server.prompt(sid, "hi")).json()
    bus = server.bridge.get_session(sid).bus
    with anyio.fail_after(30):   # the echo is journaled (readers see committed events)
        while bus.released_id < 1:
            await anyio.sleep(0.01)
    raw = b""
    with anyio.fail_after(30):
        async with server.client.stream("GET", f"/session/{sid}/events",
                                        headers={"Last-Event-ID": "0"}) as response:
            async with aclosing(response.aiter_raw()) as chunks:
                async for chunk in chunks:
                    raw += chunk
                    if b"event: replay_complete" in raw:
                        break
    frames = raw.split(b"\n\n")
    assert frames[0].startswith(b"retry: 3000\nid: 1\nevent: session_update\ndata: {")
    assert all(b"\ndata: " in f or f.startswith(b"data: ") for f in frames[:-1])
    assert any(f.startswith(b"event: replay_complete\ndata: ") for f in frames)  # no id line
    assert accepted["promptId"].encode() in frames[0]


async def test_heartbeat(tmp_path: Path) -> None:
    async with running_server(tmp_path, heartbeat_s=0.1) as srv:
        sid = (await srv.create_session())["sessionId"]
        raw = b""
        with anyio.fail_after(30):
            async with srv.client.stream("GET", f"/session/{sid}/events") as response:
                async with aclosing(response.aiter_raw()) as chunks:
                    async for chunk in chunks:
                        raw += chunk
                        if raw.count(b": heartbeat\n") >= 2:
                            break
        # comment lines, never a blank line: they prefix the next frame
        assert raw.startswith(b"retry: 3000\n: heartbeat\n: heartbeat\n")


@pytest.mark.parametrize("value", ["15", "2049", "abc", "-1", "16.5"])
async def test_invalid_max_queued(server: RunningServer, value: str) -> None:
    sid = (await server.create_session())["sessionId"]
    response = await server.client.get(f"/session/{sid}/events", params={"maxQueued": value})
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_max_queued"


async def test_valid_max_queued(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    for value in ("16", "2048"):
        async with server.client.stream("GET", f"/session/{sid}/events",
                                        params={"maxQueued": value}) as response:
            assert response.status_code == 200


async def test_subscriber_limit(tmp_path: Path) -> None:
    async with running_server(tmp_path, options=BridgeOptions(max_subscribers_per_session=1)) as srv:
        sid = (await srv.create_session())["sessionId"]
        async with srv.client.stream("GET", f"/session/{sid}/events") as first:
            assert first.status_code == 200
            response = await srv.client.get(f"/session/{sid}/events")
            assert response.status_code == 429
            assert response.headers["retry-after"] == "5"
            body = response.json()
            assert body["code"] == "subscriber_limit_exceeded"
            assert body["limit"] == 1
            assert set(body) == {"error", "code", "limit"}


async def test_epoch_mismatch_resync(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    await server.prompt(sid, "hi")
    await server.events_until(sid, "turn_complete", last_event_id=0)
    frames = await server.events_until(sid, "replay_complete", last_event_id=3,
                                       epoch="stale-epoch")
    kind, data = frames[0]
    assert kind == "state_resync_required"
    assert data["data"]["reason"] == "epoch_reset"
    assert data["data"]["detail"] == "epoch_mismatch"
    assert "id" not in data
    assert frames[1][1]["id"] == 1  # then the whole ring


async def test_bad_cursor_headers_are_ignored(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    await server.prompt(sid, "earlier")
    await server.events_until(sid, "turn_complete", last_event_id=0)
    before = server.bridge.get_session(sid).bus.last_event_id

    async def prompt() -> None:
        await server.prompt(sid, "later")

    frames = await server.events_until(sid, "turn_complete", on_open=prompt,
                                       headers={"Last-Event-ID": "abc",
                                                "X-Qwen-Event-Epoch": "bad epoch!"})
    assert all(kind != "replay_complete" for kind, _ in frames)
    assert frames[0][1]["id"] == before + 1


@pytest.mark.parametrize("client_id", ["bad id", "client_unknown"])
async def test_client_id_is_not_checked_on_a_stream(server: RunningServer,
                                                    client_id: str) -> None:
    """``X-Qwen-Client-Id`` on a stream, malformed or not issued for the session, is
    ignored, as the peer reads it there (a hint); a prompt still checks it."""
    sid = (await server.create_session())["sessionId"]
    await server.prompt(sid, "hello")
    frames = await server.events_until(sid, "turn_complete", last_event_id=0,
                                       headers={"X-Qwen-Client-Id": client_id})
    assert frames[-1][0] == "turn_complete"
    refused = await server.prompt(sid, "again", **{"X-Qwen-Client-Id": client_id})
    assert (refused.status_code, refused.json()["code"]) == (400, "invalid_client_id")


async def test_stream_ends_when_session_closes(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]

    async def close() -> None:
        assert (await server.client.delete(f"/session/{sid}")).status_code == 204

    frames = await server.events_until(sid, lambda kind, _: False, on_open=close)
    assert frames[-1][0] == "session_closed"
    assert frames[-1][1]["data"] == {"sessionId": sid, "reason": "client_close"}


async def test_disconnect_releases_subscription(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    bus = server.bridge.get_session(sid).bus
    async with server.client.stream("GET", f"/session/{sid}/events") as response:
        async with aclosing(response.aiter_raw()) as chunks:
            await chunks.__anext__()
        assert bus.subscriber_count == 1
    with anyio.fail_after(30):
        while bus.subscriber_count:
            await anyio.sleep(0.02)
    # The bus still serves new subscribers and events afterwards.
    await server.prompt(sid, "still alive")
    frames = await server.events_until(sid, "turn_complete", last_event_id=0)
    assert frames[-1][1]["data"]["stopReason"] == "end_turn"
