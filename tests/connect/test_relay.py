"""``acp-server connect`` spoken to as an editor speaks to its agent (raw JSON-RPC
lines on the child's stdio), over each transport, against a real server."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from acp_server.profiles import profile
from tests.acp_http.server import running_acp_server
from tests.connect.harness import spawn_adapter

pytestmark = pytest.mark.anyio

INIT = {"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": False}},
        "clientInfo": {"name": "test-editor", "version": "1"}}


def text(value: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": value}]


@pytest.mark.parametrize("transport", ["websocket", "http"])
async def test_a_conversation_with_a_permission(tmp_path: Path, transport: str) -> None:
    async with running_acp_server(tmp_path) as srv, \
            spawn_adapter(srv.base_url + "/acp", "--transport", transport) as adapter:
        init = await adapter.request("initialize", INIT)
        assert init["result"]["protocolVersion"] == 1
        assert init["result"]["agentCapabilities"]["loadSession"] is True
        created = await adapter.request("session/new", {"cwd": srv.workspace, "mcpServers": []})
        sid = created["result"]["sessionId"]
        done = await adapter.request("session/prompt", {"sessionId": sid,
                                                        "prompt": text("/chunks 2 hello")})
        assert done["result"] == {"stopReason": "end_turn"}
        asked = await adapter.request("session/prompt", {"sessionId": sid,
                                                         "prompt": text("/permission may I")})
        assert asked["result"]["stopReason"] == "end_turn"
        [permission] = adapter.asked
        assert permission["params"]["sessionId"] == sid
        assert "acp-server/event" not in permission["params"]["_meta"]
        said = "".join(adapter.texts("agent_message_chunk", sid))
        assert said == "Echo: hello" + "Permission allowed (allow_once).\nEcho: may I"
        assert adapter.texts("user_message_chunk", sid) == ["/chunks 2 hello",
                                                            "/permission may I"]
        for update in adapter.updates():
            assert "acp-server/event" not in update.get("_meta", {})
        # unknown methods pass through; the server's answer comes back under our id
        unknown = await adapter.request("_nobody/knows", {"sessionId": sid}, rpc_id="x-1")
        assert unknown["error"]["code"] == -32601
        listed = await adapter.request("session/list", {})
        assert sid in [s["sessionId"] for s in listed["result"]["sessions"]]
        closed = await adapter.request("session/close", {"sessionId": sid})
        assert closed["result"] == {}
        await adapter.process.stdin.aclose()   # the editor goes away
        assert await adapter.exit_code() == 0, "\n".join(adapter.stderr)
        assert not [line for line in adapter.stderr if "Traceback" in line]


async def test_an_elicitation_through_the_adapter(tmp_path: Path) -> None:
    from tests.acp_http.extended_agent import ExtendedFactory

    def name(request: dict) -> dict:
        return {"action": "accept", "content": {"name": "Grace"}}

    async with running_acp_server(tmp_path, agent_factory=ExtendedFactory()) as srv, \
            spawn_adapter(srv.base_url + "/acp") as adapter:
        await adapter.request("initialize", {"protocolVersion": 1, "clientCapabilities": {
            "elicitation": {"form": {}}}})
        sid = (await adapter.request("session/new", {"cwd": srv.workspace,
                                                     "mcpServers": []}))["result"]["sessionId"]
        await adapter.send({"jsonrpc": "2.0", "id": "p", "method": "session/prompt",
                            "params": {"sessionId": sid, "prompt": text("/elicit form")}})
        ask = await adapter.until(lambda m: m.get("method") == "elicitation/create")
        assert "acp-server/event" not in ask["params"].get("_meta", {})
        await adapter.send({"jsonrpc": "2.0", "id": ask["id"], "result": name(ask)})
        done = await adapter.response("p")
        assert done["result"]["stopReason"] == "end_turn"
        assert adapter.texts("agent_message_chunk", sid) == ['Elicited accept {"name": "Grace"}']


async def test_agent_picks_the_servers_profile(tmp_path: Path) -> None:
    other = profile("other", [sys.executable, "-m", "bridge.agents.reference"])
    async with running_acp_server(tmp_path, agent_profiles=(other,)) as srv:
        async with spawn_adapter(srv.base_url + "/acp", "--agent", "other") as adapter:
            await adapter.request("initialize", INIT)
            created = await adapter.request("session/new", {"cwd": srv.workspace,
                                                            "mcpServers": []})
            sid = created["result"]["sessionId"]
            assert srv.bridge.get_session(sid).agent_name == "other"
            done = await adapter.request("session/prompt", {"sessionId": sid,
                                                            "prompt": text("hi")})
            assert done["result"]["stopReason"] == "end_turn"
        async with spawn_adapter(srv.base_url + "/acp", "--agent", "nope") as adapter:
            await adapter.request("initialize", INIT)
            refused = await adapter.request("session/new", {"cwd": srv.workspace,
                                                            "mcpServers": []})
            assert refused["error"]["code"] == -32602
            assert "other" in refused["error"]["data"]["available"]


@pytest.mark.parametrize("transport", ["websocket", "http"])
async def test_the_editor_reloads_a_session_it_saw(tmp_path: Path, transport: str) -> None:
    """review7 #4: the editor's own session/load of a session it already showed gets
    the whole history again (it asked for it), not only what it had not seen; later
    events are still forwarded once."""
    async with running_acp_server(tmp_path) as srv, \
            spawn_adapter(srv.base_url + "/acp", "--transport", transport) as adapter:
        await adapter.request("initialize", INIT)
        sid = (await adapter.request("session/new", {"cwd": srv.workspace,
                                                     "mcpServers": []}))["result"]["sessionId"]
        done = await adapter.request("session/prompt", {"sessionId": sid,
                                                        "prompt": text("/chunks 3 hello")})
        assert done["result"]["stopReason"] == "end_turn"
        history = adapter.updates(sid)
        loaded = await adapter.request("session/load", {"sessionId": sid,
                                                        "cwd": srv.workspace,
                                                        "mcpServers": []})
        assert "result" in loaded
        # the server may answer before its replay to this connection is all written
        await adapter.until(lambda m: len(adapter.updates(sid)) >= 2 * len(history))
        assert adapter.updates(sid) == history + history
        after = await adapter.request("session/prompt", {"sessionId": sid,
                                                         "prompt": text("after")})
        assert after["result"]["stopReason"] == "end_turn"
        turn = adapter.updates(sid)[2 * len(history):]
        assert [u["content"]["text"] for u in turn][0] == "after"
        assert "".join(u["content"]["text"] for u in turn[1:]) == "Echo: after"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
async def test_a_signal_ends_the_adapter_like_a_closed_stdin(tmp_path: Path, signum: int,
                                                            anyio_backend: str) -> None:
    """review7 #9, #17: SIGTERM / SIGHUP / SIGINT cancel the editor's running turn and
    close the connection (the server ends it, nothing lingers), then exit 128 + N,
    without a traceback."""
    async with running_acp_server(tmp_path) as srv, \
            spawn_adapter(srv.base_url + "/acp") as adapter:
        await adapter.request("initialize", INIT)
        sid = (await adapter.request("session/new", {"cwd": srv.workspace,
                                                     "mcpServers": []}))["result"]["sessionId"]
        await adapter.send({"jsonrpc": "2.0", "id": "turn", "method": "session/prompt",
                            "params": {"sessionId": sid, "prompt": text("/sleep 30s long")}})
        await adapter.until(lambda m: m.get("method") == "session/update")
        assert srv.bridge.get_session(sid).pending
        adapter.process.send_signal(signum)
        assert await adapter.exit_code() == 128 + signum
        assert not any(s.session_id == sid and s.pending for s in srv.bridge.sessions())
        if anyio_backend == "asyncio":   # hypercorn (trio) reports every close as 1006
            assert not srv.registry.lingering_sessions
        assert not [line for line in adapter.stderr if "Traceback" in line], adapter.stderr
