"""Network cuts between the adapter and the server (a TCP relay the test drops): the
editor-side turn completes, every update reaches it once, in the server's order, and
the prompt ran once; permissions asked before or during the cut are answered."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from bridge.wire import envelope
from tests.acp_http.server import RunningAcpServer, running_acp_server
from tests.agents.held import HeldAgent
from tests.connect.harness import Adapter, TcpRelay, port_of, spawn_adapter, tcp_relay
from tests.harness import ServeProcess

pytestmark = pytest.mark.anyio

INIT = {"protocolVersion": 1, "clientCapabilities": {}}


def text(value: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": value}]


def server_updates(srv: RunningAcpServer, sid: str) -> list[dict[str, Any]]:
    """The session's updates as the server published them (the truth)."""
    ring = srv.bridge.get_session(sid).bus.ring_events()
    return [json.loads(envelope(e))["data"]["update"] for e in ring if e.type == "session_update"]


async def until(condition: Any, timeout: float = 20.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)


async def start(adapter: Adapter, srv: RunningAcpServer) -> str:
    await adapter.request("initialize", INIT)
    created = await adapter.request("session/new", {"cwd": srv.workspace, "mcpServers": []})
    return created["result"]["sessionId"]  # type: ignore[no-any-return]


def restart_behind(relay: TcpRelay, child: ServeProcess, *, clean: bool = False) -> None:
    """``kill -9`` the server behind ``relay`` (``clean``: SIGTERM, its drain) and start
    it again on the same state (a new port): the adapter's links are cut and its next
    one reaches the new server."""
    relay.refusing = True
    if clean:
        child.stop()
    else:
        child.kill()
    child.start()
    relay.target_port = child.port
    relay.cut()
    relay.refusing = False


def echo_of(value: str) -> Any:
    return lambda m: m.get("method") == "session/update" \
        and m["params"]["update"].get("content", {}).get("text") == value \
        and m["params"]["update"]["sessionUpdate"] == "user_message_chunk"


def check_once(adapter: Adapter, srv: RunningAcpServer, sid: str, prompts: int) -> None:
    updates = adapter.updates(sid)
    assert updates == server_updates(srv, sid)    # none missing, none doubled, in order
    echoes = [u for u in updates if u["sessionUpdate"] == "user_message_chunk"]
    assert len(echoes) == prompts                  # each prompt ran once


@pytest.mark.parametrize("transport", ["websocket", "http"])
async def test_a_cut_mid_turn(tmp_path: Path, transport: str, anyio_backend: str) -> None:
    # the turn waits in the agent until the link is cut: it runs, and ends, while no
    # link is up, whatever the machine's load (a 2 s turn could be over before the cut)
    agent = HeldAgent(hold=lambda said: said.endswith("across the cut"))
    async with running_acp_server(tmp_path, agent_factory=agent) as srv, \
            tcp_relay(port_of(srv.base_url)) as relay, \
            spawn_adapter(f"http://127.0.0.1:{relay.port}/acp", "--transport", transport,
                          "--verbose") as adapter:
        sid = await start(adapter, srv)
        first = await adapter.request("session/prompt", {"sessionId": sid,
                                                         "prompt": text("before the cut")})
        assert first["result"]["stopReason"] == "end_turn"
        await adapter.send({"jsonrpc": "2.0", "id": "turn", "method": "session/prompt",
                            "params": {"sessionId": sid,
                                       "prompt": text("/chunks 7 across the cut")}})
        await adapter.until(echo_of("/chunks 7 across the cut"))
        turn = await agent.arrived(1)
        # the turn goes on on the server while nothing gets through
        relay.refusing = True
        relay.cut()
        links = relay.connections
        turn.release()
        await until(lambda: not srv.bridge.get_session(sid).pending)
        assert relay.connections == links   # no link was up while the turn ran
        relay.refusing = False
        done = await adapter.response("turn", timeout=60)
        assert done["result"] == {"stopReason": "end_turn"}
        said = adapter.texts("agent_message_chunk", sid)
        assert "".join(said) == "Echo: before the cut" + "Echo: across the cut"
        check_once(adapter, srv, sid, prompts=2)
        assert relay.connections >= 2
        again = [line for line in adapter.stderr if "reconnected" in line][-1]
        if transport == "http":   # HTTP/2 where the server speaks it (hypercorn: h2c)
            assert ("HTTP/2" if anyio_backend == "trio" else "HTTP/1.1") in again, again
        else:
            assert "websocket" in again
        after = await adapter.request("session/prompt", {"sessionId": sid,
                                                         "prompt": text("after")})
        assert after["result"]["stopReason"] == "end_turn"
        check_once(adapter, srv, sid, prompts=3)


async def test_a_permission_asked_while_down(tmp_path: Path) -> None:
    # the turn waits in the agent until the link is cut, so its ask comes while it is
    # down, whatever the machine's load (a 1 s, then 5 s, wait before the ask raced
    # the cut: the ask could get through, answered, first)
    agent = HeldAgent(hold=lambda said: said.endswith("go"))
    async with running_acp_server(tmp_path, agent_factory=agent) as srv, \
            tcp_relay(port_of(srv.base_url)) as relay, \
            spawn_adapter(f"http://127.0.0.1:{relay.port}/acp") as adapter:
        sid = await start(adapter, srv)
        await adapter.send({"jsonrpc": "2.0", "id": "turn", "method": "session/prompt",
                            "params": {"sessionId": sid, "prompt": text("/permission go")}})
        await adapter.until(echo_of("/permission go"))
        turn = await agent.arrived(1)
        assert srv.bridge.permissions.pending_count == 0
        relay.refusing = True
        relay.cut()
        links = relay.connections
        turn.release()
        await until(lambda: srv.bridge.permissions.pending_count == 1)
        assert relay.connections == links   # asked while no link was up
        relay.refusing = False
        assert adapter.asked == []   # asked while the link was down
        done = await adapter.response("turn", timeout=60)
        assert done["result"]["stopReason"] == "end_turn"
        assert [m["method"] for m in adapter.asked] == ["session/request_permission"]
        assert "".join(adapter.texts("agent_message_chunk", sid)) == \
            "Permission allowed (allow_once).\nEcho: go"
        check_once(adapter, srv, sid, prompts=1)


async def test_a_permission_answered_while_down(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path) as srv, tcp_relay(port_of(srv.base_url)) as relay, \
            spawn_adapter(f"http://127.0.0.1:{relay.port}/acp", "--verbose",
                          answer_permission=None) as adapter:
        sid = await start(adapter, srv)
        await adapter.send({"jsonrpc": "2.0", "id": "turn", "method": "session/prompt",
                            "params": {"sessionId": sid, "prompt": text("/permission wait")}})
        ask = await adapter.until(lambda m: m.get("method") == "session/request_permission")
        relay.refusing = True
        relay.cut()
        # the editor answers while the adapter is cut off from the server
        await adapter.send({"jsonrpc": "2.0", "id": ask["id"], "result": {
            "outcome": {"outcome": "selected", "optionId": "reject_once"}}})
        assert srv.bridge.permissions.pending_count == 1   # it stays pending meanwhile
        relay.refusing = False
        try:
            done = await adapter.response("turn", timeout=60)
        except TimeoutError:
            raise AssertionError("\n".join(adapter.stderr) + repr(adapter.received[-5:]))
        assert done["result"]["stopReason"] == "end_turn"
        assert len(adapter.asked) == 1                      # not asked twice
        assert "".join(adapter.texts("agent_message_chunk", sid)) == \
            "Permission rejected (reject_once).\nEcho: wait"
        check_once(adapter, srv, sid, prompts=1)


async def test_a_server_restart_keeps_the_session(tmp_path: Path) -> None:
    """Sessions are durable (issue #23): a server started on the same state dir restores
    the session from the journal, the adapter re-attaches it with ``session/load``, the
    prompt that was in flight is re-sent under its id and gets its terminal (it was
    running at the restart: ``server_restarted``), and the session goes on."""
    async with running_acp_server(tmp_path) as first, \
            tcp_relay(port_of(first.base_url)) as relay, \
            spawn_adapter(f"http://127.0.0.1:{relay.port}/acp") as adapter:
        sid = await start(adapter, first)
        await adapter.send({"jsonrpc": "2.0", "id": "turn", "method": "session/prompt",
                            "params": {"sessionId": sid, "prompt": text("/sleep 30s slow")}})
        await adapter.until(echo_of("/sleep 30s slow"))
        async with running_acp_server(tmp_path) as second:   # the "restarted" one
            relay.target_port = port_of(second.base_url)
            relay.cut()
            error = (await adapter.response("turn", timeout=60))["error"]
            assert error["data"]["errorCode"] == "server_restarted"
            later = await adapter.request("session/prompt", {"sessionId": sid,
                                                             "prompt": text("hello?")})
            assert later["result"]["stopReason"] == "end_turn"
        assert any("reconnected" in line for line in adapter.stderr)


@pytest.mark.parametrize("clean", [False, True], ids=["kill-9", "SIGTERM"])
async def test_kill_9_of_a_real_server_through_the_adapter(tmp_path: Path, clean: bool) -> None:
    """A real ``acp-server serve`` killed with SIGKILL mid-turn (or stopped with SIGTERM:
    its drain shows the session's stream events it does not journal, and the session
    comes back under a new epoch) and started again on the same state: the adapter
    re-attaches the session, the turn that was running gets its ``server_restarted``
    terminal, the conversation goes on, and the editor saw every update of the earlier
    turn once."""
    child = ServeProcess(tmp_path).start()
    try:
        async with tcp_relay(child.port) as relay, \
                spawn_adapter(f"http://127.0.0.1:{relay.port}/acp") as adapter:
            await adapter.request("initialize", INIT)
            created = await adapter.request("session/new", {"cwd": str(tmp_path),
                                                            "mcpServers": []})
            sid = created["result"]["sessionId"]
            first = await adapter.request("session/prompt", {"sessionId": sid,
                                                             "prompt": text("before")})
            assert first["result"]["stopReason"] == "end_turn"
            await adapter.send({"jsonrpc": "2.0", "id": "turn", "method": "session/prompt",
                                "params": {"sessionId": sid, "prompt": text("/sleep 30s slow")}})
            await adapter.until(echo_of("/sleep 30s slow"))
            restart_behind(relay, child, clean=clean)
            error = (await adapter.response("turn", timeout=60))["error"]
            assert error["data"]["errorCode"] == "server_restarted"
            later = await adapter.request("session/prompt", {"sessionId": sid,
                                                             "prompt": text("after")})
            assert later["result"]["stopReason"] == "end_turn"
            said = adapter.texts("agent_message_chunk", sid)
            assert "".join(said).count("Echo: before") == 1
            assert "".join(said).endswith("Echo: after")
            echoes = [u["content"]["text"] for u in adapter.updates(sid)
                      if u["sessionUpdate"] == "user_message_chunk"]
            assert echoes == ["before", "/sleep 30s slow", "after"]
    finally:
        child.stop()


def withdrawals(adapter: Adapter) -> list[Any]:
    return [m["params"]["requestId"] for m in adapter.received
            if m.get("method") == "$/cancel_request"]


@pytest.mark.parametrize("cut", [False, True], ids=["live", "resolved-while-down"])
async def test_a_permission_answered_elsewhere_is_withdrawn_once(tmp_path: Path,
                                                                 cut: bool) -> None:
    """The editor does not answer; another client votes (REST). Live, the server's
    ``$/cancel_request`` reaches the editor; resolved while the link is down, the
    adapter withdraws it when the resolution is replayed. Either way once, and the
    turn ends with the vote that won."""
    async with running_acp_server(tmp_path) as srv, tcp_relay(port_of(srv.base_url)) as relay, \
            spawn_adapter(f"http://127.0.0.1:{relay.port}/acp",
                          answer_permission=None) as adapter:
        sid = await start(adapter, srv)
        await adapter.send({"jsonrpc": "2.0", "id": "turn", "method": "session/prompt",
                            "params": {"sessionId": sid, "prompt": text("/permission vote")}})
        ask = await adapter.until(lambda m: m.get("method") == "session/request_permission")
        if cut:
            relay.refusing = True
            relay.cut()
        voted = await srv.client.post(
            f"/session/{sid}/permission/{ask['id']}",
            json={"outcome": {"outcome": "selected", "optionId": "allow_once"}})
        assert voted.status_code == 200, voted.text
        relay.refusing = False
        await adapter.until(lambda m: m.get("method") == "$/cancel_request")
        done = await adapter.response("turn", timeout=60)
        assert done["result"]["stopReason"] == "end_turn"
        assert "Permission allowed (allow_once)." in \
            "".join(adapter.texts("agent_message_chunk", sid))
        # the editor answers the withdrawn request, as ACP asks: nothing breaks
        await adapter.send({"jsonrpc": "2.0", "id": ask["id"], "error": {
            "code": -32800, "message": "Request cancelled"}})
        after = await adapter.request("session/prompt", {"sessionId": sid,
                                                         "prompt": text("after")})
        assert after["result"]["stopReason"] == "end_turn"
        assert withdrawals(adapter) == [ask["id"]]
        assert len(adapter.asked) == 1
        if cut:
            assert relay.connections >= 2


async def test_a_question_open_at_a_kill_9_is_withdrawn_after_the_restart(
        tmp_path: Path) -> None:
    """A real server killed with SIGKILL while the editor has a permission question
    open, started again on the same state: the question is resolved at start
    (``server_restarted``), the adapter's re-attach replays that resolution, and the
    editor gets ``$/cancel_request`` for it, once; the turn that asked fails with
    ``server_restarted`` and the session goes on."""
    child = ServeProcess(tmp_path).start()
    try:
        async with tcp_relay(child.port) as relay, \
                spawn_adapter(f"http://127.0.0.1:{relay.port}/acp",
                              answer_permission=None) as adapter:
            await adapter.request("initialize", INIT)
            created = await adapter.request("session/new", {"cwd": str(tmp_path),
                                                            "mcpServers": []})
            sid = created["result"]["sessionId"]
            await adapter.send({"jsonrpc": "2.0", "id": "turn", "method": "session/prompt",
                                "params": {"sessionId": sid, "prompt": text("/permission x")}})
            ask = await adapter.until(lambda m: m.get("method") == "session/request_permission")
            restart_behind(relay, child)
            error = (await adapter.response("turn", timeout=60))["error"]
            assert error["data"]["errorCode"] == "server_restarted"
            await adapter.until(lambda m: m.get("method") == "$/cancel_request")
            later = await adapter.request("session/prompt", {"sessionId": sid,
                                                             "prompt": text("after")})
            assert later["result"]["stopReason"] == "end_turn"
            assert withdrawals(adapter) == [ask["id"]]
            assert len(adapter.asked) == 1
    finally:
        child.stop()


@pytest.mark.parametrize("transport", ["websocket", "http"])
async def test_a_session_whose_agent_died_goes_on(tmp_path: Path, transport: str) -> None:
    """The agent dies mid-turn (``/crash``): that turn fails; the server ends the
    session (``session_died``) but keeps it, so the adapter loads it again before the
    editor's next request of it, and the conversation goes on in the same session,
    on the same link."""
    async with running_acp_server(tmp_path) as srv, \
            spawn_adapter(f"{srv.base_url}/acp", "--transport", transport,
                          "--verbose") as adapter:
        sid = await start(adapter, srv)
        first = await adapter.request("session/prompt", {"sessionId": sid,
                                                         "prompt": text("before it died")})
        assert first["result"]["stopReason"] == "end_turn"
        died = await adapter.request("session/prompt", {"sessionId": sid,
                                                        "prompt": text("/crash")})
        assert "error" in died, died
        later = await adapter.request("session/prompt", {"sessionId": sid,
                                                         "prompt": text("/history")})
        assert later.get("result", {}).get("stopReason") == "end_turn", later
        said = "".join(adapter.texts("agent_message_chunk", sid))
        echoed = adapter.texts("user_message_chunk", sid)
        await until(lambda: any("loading it again" in line for line in adapter.stderr))
    assert not any("reconnected" in line for line in adapter.stderr), adapter.stderr
    assert "user: before it died" in said   # the agent was seeded with the conversation
    assert echoed.count("before it died") == 1   # the editor was not shown it twice


async def test_a_rate_limited_token_re_attaches_its_sessions(tmp_path: Path) -> None:
    """A real ``acp-server serve`` whose stored token is of the ``default`` rate class
    (60 mutations a minute: one a second once spent). The editor has three sessions and
    the bucket is empty when the link is cut: each re-attaching ``session/load`` is
    refused for the rate until the bucket refills. The adapter waits on the link it
    has and the turn in flight is answered; before, each refusal dropped the link and
    the next one re-attached every session again, never paid for within
    ``--give-up-after``: the adapter gave up on a server that was up."""
    with ServeProcess(tmp_path, "--token", "boot", "--rate-limit-mutation", "60") as child:
        token = child.http.post("/tokens", json={"name": "alice"}).json()["token"]
        async with tcp_relay(child.port) as relay, \
                spawn_adapter(f"http://127.0.0.1:{relay.port}/acp", "--give-up-after", "3s",
                              env={"ACP_SERVER_TOKEN": token}) as adapter:
            await adapter.request("initialize", INIT)
            started = time.monotonic()   # the bucket refills one a second from here on
            sids = [(await adapter.request("session/new", {"cwd": str(tmp_path),
                                                           "mcpServers": []}))
                    ["result"]["sessionId"] for _ in range(3)]
            await adapter.send({"jsonrpc": "2.0", "id": "turn", "method": "session/prompt",
                                "params": {"sessionId": sids[0],
                                           "prompt": text("/sleep 2s across")}})
            await adapter.until(echo_of("/sleep 2s across"))
            spent = 3
            async with httpx.AsyncClient(base_url=child.base_url,
                                         headers={"Authorization": f"Bearer {token}"},
                                         timeout=30) as http:
                while (await http.delete("/session/none")).status_code != 429:
                    spent += 1   # the mutation bucket, emptied
            # 60, and what refilled meanwhile: a loaded machine spends seconds on these
            assert spent <= 60 + (time.monotonic() - started) + 1, spent
            relay.cut()
            done = await adapter.response("turn", timeout=60)
            assert done.get("result") == {"stopReason": "end_turn"}, done
            assert adapter.process.returncode is None
            later = await adapter.request("session/prompt", {"sessionId": sids[2],
                                                             "prompt": text("after")})
            assert later["result"]["stopReason"] == "end_turn"


async def test_a_session_stream_refused_for_the_rate_is_opened_again(tmp_path: Path) -> None:
    """Streamable HTTP, a stored token of the ``default`` rate class whose read bucket
    is empty: the ``GET`` stream of a new session is answered 429. The adapter opens it
    again after ``Retry-After`` before the session's prompt goes, and the prompt's
    reply and updates arrive (they come on that stream); before, the stream was left
    unopened and the prompt was never answered."""
    with ServeProcess(tmp_path, "--token", "boot", "--rate-limit-read", "60") as child:
        token = child.http.post("/tokens", json={"name": "alice"}).json()["token"]
        async with spawn_adapter(f"{child.base_url}/acp", "--transport", "http1",
                                 env={"ACP_SERVER_TOKEN": token}) as adapter, \
                httpx.AsyncClient(base_url=child.base_url,
                                  headers={"Authorization": f"Bearer {token}"},
                                  timeout=30) as http:
            await adapter.request("initialize", INIT)
            while (await http.get("/capabilities")).status_code != 429:
                pass   # the read bucket, emptied
            created = await adapter.request("session/new", {"cwd": str(tmp_path),
                                                            "mcpServers": []})
            sid = created["result"]["sessionId"]
            done = await adapter.request("session/prompt", {"sessionId": sid,
                                                            "prompt": text("/chunks 3 hi")})
            assert done.get("result") == {"stopReason": "end_turn"}, done
            assert "".join(adapter.texts("agent_message_chunk", sid)) == "Echo: hi"


@pytest.mark.parametrize("transport", ["websocket", "http1"])
async def test_a_prompt_sent_again_is_not_refused_for_the_rate(tmp_path: Path,
                                                              transport: str) -> None:
    """A stored token of the ``default`` rate class, two prompts a minute: the second
    runs when the link is cut, and the adapter sends it again under its prompt id. The
    server admits nothing new for it, so its rate limit lets it through: the editor
    gets the turn's end. Before, it was answered "Rate limit exceeded" (retry in 30 s)
    of a prompt its agent ran to the end."""
    with ServeProcess(tmp_path, "--token", "boot", "--rate-limit-prompt", "2") as child:
        token = child.http.post("/tokens", json={"name": "alice"}).json()["token"]
        async with tcp_relay(child.port) as relay, \
                spawn_adapter(f"http://127.0.0.1:{relay.port}/acp", "--transport", transport,
                              env={"ACP_SERVER_TOKEN": token}) as adapter:
            await adapter.request("initialize", INIT)
            created = await adapter.request("session/new", {"cwd": str(tmp_path),
                                                            "mcpServers": []})
            sid = created["result"]["sessionId"]
            first = await adapter.request("session/prompt", {"sessionId": sid,
                                                             "prompt": text("one")})
            assert first["result"]["stopReason"] == "end_turn"
            await adapter.send({"jsonrpc": "2.0", "id": "turn", "method": "session/prompt",
                                "params": {"sessionId": sid,
                                           "prompt": text("/sleep 1s two")}})
            await adapter.until(echo_of("/sleep 1s two"))
            relay.cut()
            done = await adapter.response("turn", timeout=60)
            assert done.get("result") == {"stopReason": "end_turn"}, done
            assert "".join(adapter.texts("agent_message_chunk", sid)) == "Echo: oneEcho: two"
            third = await adapter.request("session/prompt", {"sessionId": sid,
                                                             "prompt": text("three")})
            assert third["error"]["data"]["errorKind"] == "rate_limit_exceeded"   # a new one
