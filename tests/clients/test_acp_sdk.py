"""The ACP TypeScript SDK (``@agentclientprotocol/sdk`` 2.4.0), its Streamable HTTP
and WebSocket clients, against ``/acp``: two turns, a permission, a cancel, and the
reconnect recipe (new connection, ``initialize``, ``session/load``) live (while the
first connection is still there) and after ``session/close``. ``acp_sdk.mjs`` reports what the SDK delivered, in order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.acp_http.server import running_acp_server
from tests.bridge.helpers import wait_until
from tests.clients.node import run_script

pytestmark = [pytest.mark.anyio, pytest.mark.clients]

FIRST = ["/chunks 3 first turn", "second turn", "/permission third turn",
         "/sleep 30s cancel me"]


def _texts(log: list[dict[str, Any]], kind: str) -> list[str]:
    return [e["text"] for e in log if e["kind"] == "update" and e["sessionUpdate"] == kind]


def _check_reload(report: dict[str, Any], transport: str, earlier: list[str]) -> None:
    log = report["log"]
    assert log[0] == {"kind": "initialized", "loadSession": True}
    assert "sessionId" not in report["result"]
    # the history: every update before the user message of the turn after the load
    users = [i for i, e in enumerate(log)
             if e["kind"] == "update" and e["sessionUpdate"] == "user_message_chunk"]
    next_turn = users[len(earlier)]
    assert log[next_turn]["text"] == "after load"
    history = log[1:next_turn]
    assert _texts(history, "user_message_chunk") == earlier
    answered = [e["kind"] for e in log].index("load_result")
    if transport == "ws":
        # one socket: the whole history strictly before the answer, as ACP says
        assert answered == next_turn - 1
    # (HTTP: two streams. The server writes the history before the answer, but the
    # SDK reads its streams concurrently and may deliver the answer among them.)
    after = log[next_turn:]
    assert after[-1] == {"kind": "stop", "stopReason": "end_turn"}
    assert "".join(_texts(after, "agent_message_chunk")) == "Echo: after load"


@pytest.mark.parametrize("transport", ["http", "ws"])
async def test_acp_sdk_client(acp_sdk: str, tmp_path: Path, transport: str) -> None:
    async with running_acp_server(tmp_path) as srv:
        report = await run_script("acp_sdk.mjs", acp_sdk, srv.base_url, transport,
                                  srv.workspace)
        sid = report["sessionId"]
        assert report["protocolVersion"] == 1
        first = report["first"]
        assert _texts(first, "user_message_chunk") == FIRST
        stops = [e["stopReason"] for e in first if e["kind"] == "stop"]
        assert stops == ["end_turn", "end_turn", "end_turn", "cancelled"]
        [permission] = [e for e in first if e["kind"] == "permission"]
        assert permission["options"] == ["allow_once", "allow_always", "reject_once"]
        replies = "".join(_texts(first, "agent_message_chunk"))
        assert "Echo: first turn" in replies and "Permission allowed (allow_once)" in replies
        # live: the whole ring again (the chunks as they were sent)
        _check_reload(report["live"], transport, FIRST)
        # cold: the agent's own replay after session/close (one chunk per message; the
        # reference agent keeps no record of the cancelled turn)
        _check_reload(report["cold"], transport, [*FIRST[:3], "after load"])
        # every connection that made or attached it is gone: the session is closed
        await wait_until(lambda: not srv.bridge.has_session(sid))


@pytest.mark.parametrize("transport", ["http", "ws"])
async def test_acp_sdk_dialog_answered_elsewhere_is_withdrawn(acp_sdk: str, tmp_path: Path,
                                                              transport: str) -> None:
    """A permission the SDK's client was asked and another client answered (a REST
    vote): the server withdraws it with ``$/cancel_request``, which the SDK turns into
    the abort of the client's handler (its ``signal``), and the turn goes on with the
    vote that won."""
    async with running_acp_server(tmp_path) as srv:
        async with anyio.create_task_group() as tg:
            reports: list[dict[str, Any]] = []

            async def client() -> None:
                reports.append(await run_script("acp_sdk_withdrawn.mjs", acp_sdk,
                                                srv.base_url, transport, srv.workspace))

            tg.start_soon(client)
            def asked() -> list[tuple[str, str]]:
                return [(e.data.request_id, s.session_id) for s in srv.bridge.sessions()
                        for e in s.bus.ring_events() if e.type == "permission_request"]

            await wait_until(lambda: bool(asked()), timeout=60)
            [(request_id, sid)] = asked()
            voted = await srv.client.post(
                f"/session/{sid}/permission/{request_id}",
                json={"outcome": {"outcome": "selected", "optionId": "allow_once"}})
            assert voted.status_code == 200, voted.text
        [report] = reports
        assert report["log"][0] == {"kind": "asked", "title": report["log"][0]["title"]}
        kinds = [e["kind"] for e in report["log"]]
        assert kinds.index("withdrawn") < kinds.index("stop")
        [withdrawn] = [e for e in report["log"] if e["kind"] == "withdrawn"]
        assert withdrawn["code"] == -32800   # the SDK's RequestError.requestCancelled
        assert report["log"][-1] == {"kind": "stop", "stopReason": "end_turn"}
        said = "".join(e["text"] for e in report["log"] if e["kind"] == "chunk")
        assert "Permission allowed (allow_once)." in said
