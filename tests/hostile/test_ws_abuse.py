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

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.acp_http.wsclient import WsClient, ws_connect
from tests.harness import ServeProcess
from tests.hostile.test_h2_abuse import rss_kb

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

