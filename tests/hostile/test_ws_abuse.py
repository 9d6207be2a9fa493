"""A hostile pass on ``/acp`` over WebSocket, against the server we ship (``acp-server
serve`` as a child process, on granian and on uvicorn: the framing is theirs), with
frames built by hand where a client library would not send them (``wsframes``).

    .venv/bin/python -m pytest -n 0 tests/hostile/test_ws_abuse.py -q

For each attack the house rule: the client sees a close code or a JSON-RPC error in
this door's shape, the process stays up, its RSS stays bounded (read from ``/proc``
before and after), and then a fresh, well-behaved WebSocket client creates a session
and completes a prompt. What is already covered elsewhere is not repeated here: every
malformed or wrong-typed message (``tests/acp_http/test_refusals.py``), deep JSON
(``test_input.py``), one frame over the cap in process (``test_buffers.py``), a
foreign ``Host`` (``test_heads.py``), the cap on ``/acp`` connections in process
(``tests/acp_http/test_websocket.py``).

Every test drives the child from the client side only, so it runs under asyncio alone
(``anyio_backend``): the server's event loop is the child's, never the test's.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterable, Iterator
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest

from tests.acp_http.wsclient import WsClient, ws_connect
from tests.harness import ServeProcess
from tests.hostile.test_h2_abuse import rss_kb
from tests.hostile.wsframes import BINARY, CONTINUATION, PING, PONG, TEXT, RawWs, frame, upgrade

pytestmark = pytest.mark.anyio
BOUND_S = 60                 # generous: waited on, never timed
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the server runs in a child process: the backend is the client's


@pytest.fixture(scope="module", params=["granian", "uvicorn"])
def daemon(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One daemon per HTTP server for the module; every test checks it is still
    healthy afterwards."""
    workspace = tmp_path_factory.mktemp(f"wsabuse-{request.param}")
    with ServeProcess(workspace, "--http-server", request.param) as child:
        yield child


def server_of(daemon: ServeProcess) -> str:
    return daemon.flags[daemon.flags.index("--http-server") + 1]


def rpc(rpc_id: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params or {}}


async def open_session(ws: WsClient, daemon: ServeProcess) -> str:
    await ws.send_json(INIT)
    assert (await ws.receive_json())["id"] == 0
    await ws.send_json(rpc(1, "session/new", {"cwd": str(daemon.workspace), "mcpServers": []}))
    reply = await ws.wait_for(lambda m: m.get("id") == 1)
    return reply["result"]["sessionId"]  # type: ignore[no-any-return]


async def well_behaved(daemon: ServeProcess) -> None:
    """The house rule's last step: the process is up and a fresh WebSocket client
    creates a session and completes a prompt."""
    assert daemon.returncode is None, daemon.stderr_text()[-2000:]
    async with ws_connect(daemon.base_url) as ws:
        sid = await open_session(ws, daemon)
        await ws.send_json(rpc(2, "session/prompt", {
            "sessionId": sid, "prompt": [{"type": "text", "text": "hello"}]}))
        reply = await ws.wait_for(lambda m: m.get("id") == 2, timeout=BOUND_S)
        assert reply["result"] == {"stopReason": "end_turn"}, reply


async def ended(daemon: ServeProcess, session_id: str) -> None:
    """Wait until the session has left the live list (the journal lists it ended)."""
    async with httpx.AsyncClient(base_url=daemon.base_url, timeout=BOUND_S) as client:
        workspace = (await client.get("/capabilities")).json()["workspaces"][0]["id"]
        with anyio.fail_after(BOUND_S):
            while True:
                listed = (await client.get(f"/workspace/{workspace}/ended-sessions",
                                           params={"size": 100})).json()["sessions"]
                if any(s["sessionId"] == session_id for s in listed):
                    return
                await anyio.sleep(0.05)


# -- closing the socket mid-prompt ---------------------------------------------------------
@pytest.mark.parametrize("how", ["close 1000", "close 4000", "dropped"])
async def test_closing_the_socket_mid_prompt_ends_the_prompt_once(
        daemon: ServeProcess, how: str) -> None:
    """The socket goes while the session's first prompt runs (a close frame 1000 or
    another code, or the TCP connection dropped): the connection's session is closed
    and the prompt fails ``session_closed``, once, in the history a later load shows
    (REST ``/load``'s ``promptTerminals``); a new socket loads the session and
    prompts it. (The terminal was missing there when the prompt was the session's
    first: the bridge kept a closed session's terminals only when it had some before
    the close settled its pending prompts.)"""
    async with ws_connect(daemon.base_url) as ws:
        sid = await open_session(ws, daemon)
        await ws.send_json(rpc(2, "session/prompt", {
            "sessionId": sid, "prompt": [{"type": "text", "text": "/sleep 600s held"}]}))
        await ws.wait_for(lambda m: m.get("method") == "session/update" and
                          m["params"]["update"]["sessionUpdate"] == "user_message_chunk")
        if how == "dropped":
            await ws.stream.aclose()
        else:
            await ws.close(int(how.split()[1]))
    await ended(daemon, sid)
    async with httpx.AsyncClient(base_url=daemon.base_url, timeout=BOUND_S) as client:
        loaded = await client.post(f"/session/{sid}/load", json={})
    assert loaded.status_code == 200, loaded.text
    terminals = loaded.json()["promptTerminals"]
    assert [(t["terminal"], t.get("errorCode")) for t in terminals] == [
        ("failed", "session_closed")], terminals
    async with ws_connect(daemon.base_url) as ws:
        await ws.send_json(INIT)
        assert (await ws.receive_json())["id"] == 0
        await ws.send_json(rpc(1, "session/load", {"sessionId": sid, "mcpServers": [],
                                                   "cwd": str(daemon.workspace)}))
        assert "result" in await ws.wait_for(lambda m: m.get("id") == 1)
        await ws.send_json(rpc(2, "session/prompt", {
            "sessionId": sid, "prompt": [{"type": "text", "text": "again"}]}))
        reply = await ws.wait_for(lambda m: m.get("id") == 2, timeout=BOUND_S)
        assert reply["result"] == {"stopReason": "end_turn"}, reply
    await well_behaved(daemon)


# -- messages over the cap -------------------------------------------------------------------
CAP = 10 * 1024 * 1024       # the body cap, which is the frame cap (AcpConfig.max_body_bytes)
GROWTH_KB = 64 * 1024        # far above what a connection costs, far below what piles up


def message(size: int) -> bytes:
    """A well-formed request of exactly ``size`` bytes."""
    head, tail = b'{"jsonrpc":"2.0","id":1,"method":"session/list","params":{"a":"', b'"}}'
    return head + b"y" * (size - len(head) - len(tail)) + tail


async def initialized(daemon: ServeProcess) -> RawWs:
    raw = await RawWs.open(daemon.port)
    assert raw.status == 101, raw.head
    await raw.send(frame(TEXT, json.dumps(INIT).encode()))
    assert json.loads(await raw.next_text())["id"] == 0
    return raw


async def sent_until_closed(raw: RawWs, frames: Iterable[bytes]) -> int:
    """Send ``frames`` while reading; the server's close code. The server may close
    (and stop reading) before the last frame is out: the sending then stops."""
    code = 0

    async def read() -> None:
        nonlocal code
        code = await raw.close_code(BOUND_S)
        tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        try:
            for data in frames:
                await raw.send(data)
        except (anyio.BrokenResourceError, ConnectionError):
            pass
        with anyio.fail_after(BOUND_S):
            await anyio.sleep_forever()
    return code


def too_big(daemon: ServeProcess) -> set[int]:
    """What a client that is still sending sees of a message over the cap: 1009. On
    uvicorn maybe only the reset (1006): its WebSocket protocol closes the socket at
    once with the client's bytes unread, and the kernel's RST can discard the close
    frame before the client reads it (granian reads the whole message first)."""
    return {"granian": {1009}, "uvicorn": {1009, 1006}}[server_of(daemon)]


@pytest.mark.slow
async def test_fifty_messages_over_the_cap_close_1009_with_memory_bounded(
        daemon: ServeProcess) -> None:
    """One text frame a byte over the cap closes the socket with 1009 (uvicorn as the
    frame's head arrives, granian once the message is whole), fifty times over: the
    RSS after the fiftieth is within a bound of the RSS after the first (granian
    holds each message whole before the app sees it: the first one's pages stay with
    the allocator)."""
    before = 0
    for i in range(50):
        raw = await initialized(daemon)
        assert await sent_until_closed(raw, [frame(TEXT, message(CAP + 1))]) in too_big(daemon)
        await raw.aclose()
        if i == 0:
            before = rss_kb(daemon.pid)
    assert rss_kb(daemon.pid) < before + GROWTH_KB, (before, rss_kb(daemon.pid))
    await well_behaved(daemon)


async def test_a_message_at_the_cap_is_served(daemon: ServeProcess) -> None:
    raw = await initialized(daemon)
    await raw.send(frame(TEXT, message(CAP)))
    assert json.loads(await raw.next_text(BOUND_S))["id"] == 1
    await raw.aclose()
    await well_behaved(daemon)


@pytest.mark.parametrize("opcode", [TEXT, BINARY])
async def test_a_message_in_continuation_frames_past_the_cap_closes_1009(
        daemon: ServeProcess, opcode: int) -> None:
    """Twice the cap in 64 KiB fragments (320 continuation frames, none over the cap
    alone): closed 1009 (``too_big``), the binary message's too."""
    piece, whole = 64 * 1024, message(2 * CAP)
    frames = (frame(opcode if at == 0 else CONTINUATION, whole[at:at + piece],
                    fin=at + piece >= len(whole)) for at in range(0, len(whole), piece))
    before = rss_kb(daemon.pid)
    raw = await initialized(daemon)
    assert await sent_until_closed(raw, frames) in too_big(daemon)
    await raw.aclose()
    assert rss_kb(daemon.pid) < before + GROWTH_KB, (before, rss_kb(daemon.pid))
    await well_behaved(daemon)


# -- frames a library would not send -------------------------------------------------------
async def test_invalid_utf8_in_a_text_frame_fails_the_connection(daemon: ServeProcess) -> None:
    """RFC 6455 §8.1: the server fails the connection, before the app could answer
    -32700. uvicorn closes with 1007; granian 2.8 closes with no status code (1005).
    The client's fault is one line in the log, never a traceback (uvicorn logs one at
    ERROR by itself: a client could fill the log at will)."""
    logged = len(daemon.stderr_text())
    raw = await initialized(daemon)
    await raw.send(frame(TEXT, b'{"jsonrpc":"2.0","id":1,"method":"\xff\xfe"}'))
    expected = {"uvicorn": 1007, "granian": 1005}[server_of(daemon)]
    assert await raw.close_code(BOUND_S) == expected
    await raw.aclose()
    await well_behaved(daemon)
    log = daemon.stderr_text()[logged:]
    assert "Traceback" not in log, log[-3000:]
    assert not [line for line in log.splitlines() if "UTF-8" in line and "ERROR" in line]


async def test_binary_frames_are_ignored(daemon: ServeProcess) -> None:
    """A binary frame, even one holding a request, gets no answer; the next text
    frame is served."""
    raw = await initialized(daemon)
    await raw.send(frame(BINARY, json.dumps(rpc(1, "session/list")).encode()))
    await raw.send(frame(BINARY, b"\xff\x00" * 1000))
    await raw.send(frame(TEXT, json.dumps(rpc(2, "session/list")).encode()))
    assert json.loads(await raw.next_text())["id"] == 2
    await raw.aclose()
    await well_behaved(daemon)


async def test_a_batch_of_thousands_is_one_error_frame(daemon: ServeProcess) -> None:
    """5,000 requests in one array: one -32600 frame (batches are not served), none
    of them run; the socket stays open."""
    async with ws_connect(daemon.base_url) as ws:
        await ws.send_json(INIT)
        assert (await ws.receive_json())["id"] == 0
        await ws.send_json([rpc(i, "session/new", {"cwd": str(daemon.workspace),
                                                   "mcpServers": []}) for i in range(5000)])
        refused = await ws.receive_json()
        assert refused["id"] is None and refused["error"]["code"] == -32600, refused
        await ws.send_json(rpc(9, "session/list"))
        answer = await ws.receive_json()   # the very next frame: nothing else was answered
        assert answer["id"] == 9 and "result" in answer, answer
    await well_behaved(daemon)


async def test_answers_to_requests_the_server_never_sent_are_ignored(
        daemon: ServeProcess) -> None:
    async with ws_connect(daemon.base_url) as ws:
        await ws.send_json(INIT)
        assert (await ws.receive_json())["id"] == 0
        for rpc_id in (0, 12345, "perm-1", -1, None):
            await ws.send_json({"jsonrpc": "2.0", "id": rpc_id,
                                "result": {"outcome": {"outcome": "selected", "optionId": "x"}}})
            await ws.send_json({"jsonrpc": "2.0", "id": rpc_id,
                                "error": {"code": -32603, "message": "no"}})
        await ws.send_json(rpc(9, "session/list"))
        answer = await ws.receive_json()   # the very next frame: nothing else was answered
        assert answer["id"] == 9 and "result" in answer, answer
    await well_behaved(daemon)


async def test_a_ping_flood_is_answered_with_memory_bounded(daemon: ServeProcess) -> None:
    """20,000 pings sent without reading a pong: the server answers each (once the
    client reads), still serves the socket's requests, and does not grow."""
    before = rss_kb(daemon.pid)
    raw = await initialized(daemon)
    count = 20_000
    await raw.send(b"".join(frame(PING, b"%d" % i) for i in range(count)))
    await raw.send(frame(TEXT, json.dumps(rpc(1, "session/list")).encode()))
    pongs, answer = 0, None
    with anyio.fail_after(BOUND_S):
        while answer is None or pongs < count:
            opcode, payload = await raw.next_frame()
            if opcode == PONG:
                pongs += 1
            elif opcode == TEXT:
                answer = json.loads(payload)
    assert answer["id"] == 1
    await raw.aclose()
    assert rss_kb(daemon.pid) < before + GROWTH_KB, (before, rss_kb(daemon.pid))
    await well_behaved(daemon)


# -- a client that never reads -------------------------------------------------------------
async def terminals(client: httpx.AsyncClient, session_id: str) -> int:
    loaded = await client.post(f"/session/{session_id}/load", json={})
    return len(loaded.json()["promptTerminals"])


@pytest.mark.slow
async def test_a_client_that_never_reads_a_long_stream_costs_bounded_memory(
        daemon: ServeProcess) -> None:
    """Eight turns of 20,000 ``session/update`` notifications each (~40 MB of frames)
    to a socket whose client never reads (a small receive buffer): the turns still
    end (the agent is not held, nor kept to the pace at which the kernel trickles the
    socket: ``bridge.bus`` flow control), and over the last six (~30 MB) the server's
    RSS grows by less than those frames (its writes wait on the socket, the bus evicts
    the reader and the channel resumes from the ring: nothing queues per frame;
    measured: a few MB), and others are served meanwhile. The turns are prompted over
    REST: a server need not read what a client sends on a socket whose answers it
    cannot write (granian does not, while a write waits)."""
    raw = await RawWs.open(daemon.port)
    sock = raw.stream.extra(anyio.abc.SocketAttribute.raw_socket)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await raw.send(frame(TEXT, json.dumps(INIT).encode()))
    assert json.loads(await raw.next_text())["id"] == 0
    await raw.send(frame(TEXT, json.dumps(rpc(1, "session/new", {
        "cwd": str(daemon.workspace), "mcpServers": []})).encode()))
    sid = json.loads(await raw.next_text())["result"]["sessionId"]
    before = 0
    try:   # closed whatever happens: the module's later tests count open sockets
        async with httpx.AsyncClient(base_url=daemon.base_url, timeout=BOUND_S) as client:
            for turn in range(8):
                if turn == 2:   # warmed up: the session's ring is full (8,000 events)
                    before = rss_kb(daemon.pid)
                accepted = await client.post(f"/session/{sid}/prompt", json={
                    "prompt": [{"type": "text", "text": "/chunks 20000 x"}]})
                assert accepted.status_code == 202, accepted.text
                with anyio.fail_after(2 * BOUND_S):
                    while await terminals(client, sid) <= turn:
                        await anyio.sleep(0.2)
                await well_behaved(daemon)
        assert rss_kb(daemon.pid) < before + 16 * 1024, (before, rss_kb(daemon.pid))
    finally:
        await raw.aclose()
    await well_behaved(daemon)


# -- many sockets ------------------------------------------------------------------------------
async def websocket_connections(daemon: ServeProcess) -> float:
    metrics = (await daemon_get(daemon, "/metrics")).text
    line = next(l for l in metrics.splitlines()
                if l.startswith('acp_server_acp_connections{transport="websocket"}'))
    return float(line.split()[-1])


async def no_websocket_connections(daemon: ServeProcess) -> None:
    """Once the server counts no open ``/acp`` WebSocket connection."""
    with anyio.fail_after(BOUND_S):
        while await websocket_connections(daemon) != 0:
            await anyio.sleep(0.05)


async def daemon_get(daemon: ServeProcess, path: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=daemon.base_url, timeout=BOUND_S) as client:
        return await client.get(path)


async def test_hundreds_of_sockets_at_once_meet_the_connection_cap(
        daemon: ServeProcess) -> None:
    """300 sockets opened at once, each sending ``initialize``: every upgrade is
    accepted (101), 48 are served (three quarters of ``--max-acp-connections`` 64,
    what one principal may hold) and every other one gets the -32603 error frame,
    then close 1013. Once the server has seen them closed, a well-behaved client is
    served (right after the client closed them, some may still hold their slots: it
    would get 1013, "retry later")."""
    await no_websocket_connections(daemon)   # the earlier tests' sockets are gone
    outcomes: list[str] = []
    sockets: list[RawWs] = []

    async def one() -> None:
        raw = await RawWs.open(daemon.port)
        sockets.append(raw)
        assert raw.status == 101, raw.head
        await raw.send(frame(TEXT, json.dumps(INIT).encode()))
        answer = json.loads(await raw.next_text(BOUND_S))
        if "result" in answer:
            outcomes.append("served")
            return
        assert answer["error"] == {
            "code": -32603, "message": "Too many ACP connections of this principal; retry later"}
        assert await raw.close_code(BOUND_S) == 1013
        outcomes.append("refused")

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(300):
                tg.start_soon(one)
        assert (outcomes.count("served"), outcomes.count("refused")) == (48, 252)
    finally:
        for raw in sockets:
            await raw.aclose()
    await no_websocket_connections(daemon)   # seen closed by the server: slots free
    await well_behaved(daemon)


# -- hostile upgrade requests ----------------------------------------------------------------
HOSTILE_UPGRADES: dict[str, tuple[dict[str, Any], dict[str, int]]] = {
    # case: (upgrade() arguments, status by server)
    "a foreign Origin": ({"extra": "Origin: https://evil.example\r\n"},
                         {"granian": 403, "uvicorn": 403}),
    "Origin null": ({"extra": "Origin: null\r\n"}, {"granian": 403, "uvicorn": 403}),
    "no Sec-WebSocket-Key": ({"key": None}, {"granian": 400, "uvicorn": 400}),
    "Sec-WebSocket-Version 8": ({"version": "8"}, {"granian": 400, "uvicorn": 400}),
    "Sec-WebSocket-Version abc": ({"version": "abc"}, {"granian": 400, "uvicorn": 400}),
    "no Sec-WebSocket-Version": ({"version": None}, {"granian": 400, "uvicorn": 400}),
    "a 100 KB header": ({"extra": f"X-Big: {'a' * 100_000}\r\n"},
                        {"granian": 431, "uvicorn": 431}),
    "200 header fields": ({"extra": "".join(f"X-{i}: v\r\n" for i in range(200))},
                          {"granian": 431, "uvicorn": 431}),
}


@pytest.mark.parametrize("case", list(HOSTILE_UPGRADES))
async def test_a_hostile_upgrade_is_refused_before_the_handshake(daemon: ServeProcess,
                                                                 case: str) -> None:
    """Each refused with an HTTP answer, never upgraded; a foreign Origin gets the
    CORS refusal's exact bytes (as the peer), the head caps their 431."""
    arguments, statuses = HOSTILE_UPGRADES[case]
    raw = await RawWs.open(daemon.port, upgrade(daemon.port, **arguments))
    assert raw.status == statuses[server_of(daemon)], raw.head
    if raw.status == 403:
        assert raw.body == b'{"error":"Request denied by CORS policy"}'
    await raw.aclose()
    await well_behaved(daemon)


async def test_a_client_gone_mid_stream_ends_its_connection_quietly(
        daemon: ServeProcess) -> None:
    """A client that vanishes (a reset: no close frame) while its session streams a
    long turn: the server's next write to it fails, and the connection ends as a lost
    one (its slot freed), with no ASGI error and no traceback in the log."""
    logged = len(daemon.stderr_text())
    raw = await initialized(daemon)
    new = rpc(1, "session/new", {"cwd": str(daemon.workspace), "mcpServers": []})
    await raw.send(frame(TEXT, json.dumps(new).encode()))
    sid = json.loads(await raw.next_text(BOUND_S))["result"]["sessionId"]
    prompt = rpc(2, "session/prompt", {"sessionId": sid, "prompt": [
        {"type": "text", "text": "/chunks 20000 " + "w" * 20000}]})
    await raw.send(frame(TEXT, json.dumps(prompt).encode()))
    await raw.next_text(BOUND_S)   # the turn streams
    sock = raw.stream.extra(anyio.abc.SocketAttribute.raw_socket)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await raw.aclose()   # a reset
    await no_websocket_connections(daemon)
    await well_behaved(daemon)
    log = daemon.stderr_text()[logged:]
    assert "Exception in ASGI application" not in log and "Traceback" not in log, log[-3000:]
