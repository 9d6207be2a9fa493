"""``elicitation/create`` and ``elicitation/complete`` (agent → client) on ``/acp``,
mediated like a permission: delivered to every connection that offers
``clientCapabilities.elicitation``, the first answer wins, a timeout cancels it, and
the console's event stream shows it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from bridge import BridgeOptions
from bridge.wire import envelope
from tests.acp_http.extended_agent import ExtendedFactory
from tests.acp_http.server import request, running_acp_server, said, text
from tests.acp_http.wsclient import WsClient, ws_connect

pytestmark = pytest.mark.anyio

OFFERS = {"protocolVersion": 1, "clientCapabilities": {"elicitation": {"form": {}, "url": {}}}}


async def _open(ws: WsClient, init: dict[str, Any]) -> None:
    await ws.send_json(request(0, "initialize", init))
    await ws.receive_json()


async def test_first_answer_wins_among_the_clients_that_offer_it(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path, agent_factory=ExtendedFactory()) as srv:
        async with ws_connect(srv.base_url) as first, ws_connect(srv.base_url) as second, \
                ws_connect(srv.base_url) as plain:
            await _open(first, OFFERS)
            await first.send_json(request(1, "session/new", {"cwd": srv.workspace,
                                                             "mcpServers": []}))
            sid = (await first.receive_json())["result"]["sessionId"]
            for ws, init in ((second, OFFERS), (plain, {"protocolVersion": 1})):
                await _open(ws, init)
                await ws.send_json(request(1, "session/resume", {"sessionId": sid,
                                                                 "cwd": srv.workspace}))
                await ws.wait_for(lambda m: m.get("id") == 1)
            await first.send_json(request(2, "session/prompt", {"sessionId": sid,
                                                                "prompt": text("/elicit form")}))

            def asks(m: dict[str, Any]) -> bool:
                return m.get("method") == "elicitation/create"

            ask = await first.wait_for(asks)
            assert ask["params"]["message"] == "Your name?"
            assert ask["params"]["sessionId"] == sid
            assert "requestId" not in ask["params"]
            assert (await second.wait_for(asks))["id"] == ask["id"]
            shown = await plain.wait_for(lambda m: m.get("method") == "_qwen/notify"
                                         and m["params"]["kind"] == "elicitation_request")
            assert shown["params"]["data"]["requestId"] == ask["id"]
            await second.send_json({"jsonrpc": "2.0", "id": ask["id"], "result": {
                "action": "accept", "content": {"name": "Ada"}}})
            seen: list[dict[str, Any]] = []
            done = await first.wait_for(lambda m: seen.append(m) or m.get("id") == 2)
            assert done["result"]["stopReason"] == "end_turn"
            assert said(seen) == 'Elicited accept {"name": "Ada"}'
            # answered by another client: the first one's question is withdrawn (ACP's
            # $/cancel_request), right after the resolution's notification
            kinds = [m.get("method") for m in seen]
            withdrawn = seen[kinds.index("$/cancel_request")]
            assert withdrawn == {"jsonrpc": "2.0", "method": "$/cancel_request",
                                 "params": {"requestId": ask["id"]}}
            before = seen[kinds.index("$/cancel_request") - 1]
            assert before["params"]["kind"] == "elicitation_resolved"
            # the one that answered is not told to cancel its own answer
            await second.send_json(request(9, "session/list", {}))
            tail: list[dict[str, Any]] = []
            await second.wait_for(lambda m: tail.append(m) or m.get("id") == 9)
            assert "$/cancel_request" not in [m.get("method") for m in tail]
            await first.send_json({"jsonrpc": "2.0", "id": ask["id"], "result": {
                "action": "decline"}})                 # too late: ignored
            assert not srv.bridge.elicitations.pending_count


async def test_a_url_elicitation_completes_and_an_unanswered_one_times_out(
        tmp_path: Path) -> None:
    options = BridgeOptions(permission_response_timeout_ms=300)
    async with running_acp_server(tmp_path, agent_factory=ExtendedFactory(),
                                  options=options) as srv:
        async with ws_connect(srv.base_url) as ws:
            await _open(ws, OFFERS)
            await ws.send_json(request(1, "session/new", {"cwd": srv.workspace,
                                                          "mcpServers": []}))
            sid = (await ws.receive_json())["result"]["sessionId"]
            await ws.send_json(request(2, "session/prompt", {"sessionId": sid,
                                                             "prompt": text("/elicit url")}))
            ask = await ws.wait_for(lambda m: m.get("method") == "elicitation/create")
            assert ask["params"]["mode"] == "url" and ask["params"]["elicitationId"] == "e-1"
            await ws.send_json({"jsonrpc": "2.0", "id": ask["id"], "result": {"action": "accept"}})
            complete = await ws.wait_for(lambda m: m.get("method") == "elicitation/complete")
            assert complete["params"]["elicitationId"] == "e-1"
            await ws.wait_for(lambda m: m.get("id") == 2)
            # nobody answers: the timeout cancels it, the turn goes on
            await ws.send_json(request(3, "session/prompt", {"sessionId": sid,
                                                             "prompt": text("/elicit form")}))
            seen: list[dict[str, Any]] = []
            await ws.wait_for(lambda m: seen.append(m) or m.get("id") == 3)
            assert said(seen) == "Elicited cancel null"
            resolved = [m for m in seen if m.get("method") == "_qwen/notify"
                        and m["params"]["kind"] == "elicitation_resolved"]
            assert resolved[0]["params"]["data"]["reason"] == "timeout"
            cancels = [m for m in seen if m.get("method") == "$/cancel_request"]
            assert [c["params"]["requestId"] for c in cancels] == \
                [resolved[0]["params"]["data"]["requestId"]]


async def test_the_console_stream_shows_it(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path, agent_factory=ExtendedFactory()) as srv:
        created = await srv.client.post("/session", json={"sessionScope": "thread"})
        sid = created.json()["sessionId"]
        answered = await srv.client.post(f"/session/{sid}/prompt", json={
            "prompt": text("/elicit form")})
        assert answered.status_code == 202
        with anyio.fail_after(30):
            while not srv.bridge.elicitations.pending_count:
                await anyio.sleep(0.01)
        with anyio.fail_after(30):   # published once journaled
            while not (events := [e for e in srv.bridge.get_session(sid).bus.ring_events()
                                  if e.type == "elicitation_request"]):
                await anyio.sleep(0.01)
        assert json.loads(envelope(events[0]))["data"]["message"] == "Your name?"
        srv.bridge.get_session(sid).cancel_active("test")
