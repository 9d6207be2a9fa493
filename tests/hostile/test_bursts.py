"""Bursts: a reader at full speed is never evicted, a stopped one still is; prompts
are capped in content blocks and echoed in slices (REST SSE over real HTTP)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import anyio
import h11
import pytest

from acp_server.http.body import MAX_JSON_CONTAINERS
from bridge import BridgeOptions
from tests.rest.server import RunningServer, running_server, text_prompt

pytestmark = pytest.mark.anyio


@pytest.fixture
async def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    async with running_server(tmp_path) as srv:
        yield srv


def _kinds(frames: list[tuple[str, Any]]) -> list[str]:
    return [kind for kind, _data in frames]


def _updates(frames: list[tuple[str, Any]], kind: str) -> list[Any]:
    return [data["data"]["update"] for k, data in frames
            if k == "session_update" and data["data"]["update"]["sessionUpdate"] == kind]


async def test_full_speed_reader_gets_every_chunk(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    # The publisher waits for a lagging reader or a slow commit at most ``flow_wait_s``
    # (0.5 s) before it goes on without; on a loaded machine a commit or the reader's
    # turn can take longer, and the flood that follows warns a reader that kept up.
    # A hang bound instead: what is tested is the flow control, not the machine's pace.
    server.bridge.get_session(sid).bus.flow_wait_s = 60.0

    async def send() -> None:
        assert (await server.prompt(sid, "/chunks 5000 go")).status_code == 202

    frames = await server.events_until(sid, "turn_complete", on_open=send, timeout=60)
    assert "client_evicted" not in _kinds(frames) and "slow_client_warning" not in _kinds(frames)
    assert len(_updates(frames, "agent_message_chunk")) == 5000


async def test_large_prompt_evicts_no_reader(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    big = "x" * (3 * 1024 * 1024)

    async def send() -> None:
        response = await server.client.post(f"/session/{sid}/prompt", json=text_prompt(big))
        assert response.status_code == 202

    frames = await server.events_until(sid, "turn_complete", on_open=send, timeout=60)
    assert "client_evicted" not in _kinds(frames)
    [echo] = _updates(frames, "user_message_chunk")
    assert echo["content"]["text"] == big


async def test_stopped_reader_is_still_evicted(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    port = int(server.base_url.rsplit(":", 1)[1])
    stalled = await anyio.connect_tcp("127.0.0.1", port)
    await stalled.send(f"GET /session/{sid}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    bus = server.bridge.get_session(sid).bus
    with anyio.fail_after(10):
        while bus.subscriber_count < 1:
            await anyio.sleep(0.01)

    async def send() -> None:
        assert (await server.prompt(sid, "/chunks 20000 " + "y" * 2000)).status_code == 202

    frames = await server.events_until(sid, "turn_complete", on_open=send, timeout=120)
    assert "client_evicted" not in _kinds(frames)          # the reader that reads
    assert len(_updates(frames, "agent_message_chunk")) == 20000
    with anyio.fail_after(10):
        while bus.subscriber_count > 0:                     # the one that stopped: evicted
            await anyio.sleep(0.01)
    await stalled.aclose()


def _read_sse(sock: socket.socket) -> list[tuple[str, Any]]:
    """Every frame of one SSE answer, read to its end (h11 undoes the chunking)."""
    conn, body = h11.Connection(h11.CLIENT), bytearray()
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())   # the request was sent by hand: h11 only reads
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(sock.recv(65536))
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            break
    frames = []
    for block in body.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            frames.append((fields["event"], json.loads(fields["data"])))
    return frames


async def test_stalled_reader_of_a_journaled_session_is_warned_then_evicted(
        tmp_path: Path) -> None:
    """The session journal holds the bus (readers are fed from the ring as they read):
    a reader that stops reading still gets one ``slow_client_warning`` before
    ``client_evicted``, as on the in-memory journal. A small ring (evicted 200 events
    behind), a 5 MB prompt echoed (the kernel's buffers hold 4 MB) and a thousand 5 KB
    chunks."""
    async with running_server(tmp_path, options=BridgeOptions(event_ring_size=200)) as server:
        await _stall_until_evicted(server)


async def _stall_until_evicted(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    bus = server.bridge.get_session(sid).bus
    assert bus.hold
    port = int(server.base_url.rsplit(":", 1)[1])
    # A plain blocking socket, read by nobody until the end (an anyio stream on asyncio
    # would read the kernel's buffer eagerly into its own), with a small window.
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.settimeout(60)
    await anyio.to_thread.run_sync(stalled.connect, ("127.0.0.1", port))
    request = f"GET /session/{sid}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    await anyio.to_thread.run_sync(stalled.sendall, request)
    with anyio.fail_after(10):
        while bus.subscriber_count < 1:
            await anyio.sleep(0.01)
    assert (await server.prompt(sid, "/chunks 1000 " + "y" * 5_000_000)).status_code == 202
    with anyio.fail_after(120):
        while bus.subscriber_count > 0:                     # the reader that stopped
            await anyio.sleep(0.01)
    with stalled:
        frames = await anyio.to_thread.run_sync(_read_sse, stalled)
    kinds = _kinds(frames)
    assert kinds.count("slow_client_warning") == 1 and kinds[-1] == "client_evicted"
    warning = frames[kinds.index("slow_client_warning")][1]["data"]
    assert warning["threshold"] == "frames" and warning["queueSize"] * 4 >= warning["maxQueued"] * 3
    evicted = frames[-1][1]["data"]
    assert evicted["reason"] == "queue_overflow"
    assert warning["lastEventId"] <= evicted["droppedAfter"]


async def test_content_block_cap_and_sliced_echo(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    limit = server.bridge.options.max_prompt_blocks
    over = {"prompt": [{"type": "text", "text": ""}] * (limit + 1)}
    response = await server.client.post(f"/session/{sid}/prompt", json=over)
    assert response.status_code == 400
    assert response.json()["code"] == "too_many_content_blocks"
    assert response.json()["limit"] == limit
    burst = b'{"prompt":[' + b",".join([b"{}"] * 3_000_000) + b"]}"
    response = await server.client.post(f"/session/{sid}/prompt", content=burst,
                                        headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert str(MAX_JSON_CONTAINERS) in response.json()["error"]
    at_cap = {"prompt": [{"type": "text", "text": f"b{i}"} for i in range(limit)]}

    async def send() -> None:
        r = await server.client.post(f"/session/{sid}/prompt", json=at_cap)
        assert r.status_code == 202, r.text

    frames = await server.events_until(sid, "turn_complete", on_open=send, timeout=60)
    assert "client_evicted" not in _kinds(frames)
    echoed = [u["content"]["text"] for u in _updates(frames, "user_message_chunk")]
    assert echoed == [f"b{i}" for i in range(limit)]
    assert (await server.client.get("/health")).json() == {"status": "ok"}

