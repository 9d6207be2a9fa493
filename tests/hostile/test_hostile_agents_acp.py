"""The hostile stdio agent (``tests.agents.hostile_agent``) behind ``/acp``: a cancel it
ignores still answers the client's ``session/prompt`` (``cancelled``) within
``cancel_grace_ms``, what the agent says of that turn afterwards never reaches the
client, and the next ``session/prompt`` is answered once the agent ended it."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import anyio
import pytest

from bridge.options import BridgeOptions
from tests.acp_http.server import request, running_acp_server
from tests.agents import ROOT

pytestmark = pytest.mark.anyio


async def test_an_ignored_cancel_answers_the_prompt_cancelled(tmp_path: Path) -> None:
    agent = shlex.join([sys.executable, str(ROOT / "tests" / "agents" / "hostile_agent.py")])
    options = BridgeOptions(cancel_grace_ms=300)
    async with running_acp_server(tmp_path, agent=agent, options=options) as srv:
        conn_id, _ = await srv.initialize()
        async with srv.stream(conn_id) as conn_stream:
            sid = await srv.new_session(conn_id, conn_stream)
            async with srv.stream(conn_id, sid) as session_stream:
                await srv.prompt(conn_id, sid, 2, "stall gate")
                await session_stream.wait_for(
                    lambda m: m.get("method") == "session/update"
                    and m["params"]["update"].get("content", {}).get("text") == "stalling")
                response = await srv.post(conn_id, request(None, "session/cancel",
                                                           {"sessionId": sid}), sid)
                assert response.status_code == 202
                with anyio.fail_after(10):   # the grace, not the agent
                    reply = await session_stream.wait_for_id(2)
                assert reply["result"]["stopReason"] == "cancelled", reply
                await srv.prompt(conn_id, sid, 3, "next")   # held behind the agent's turn
                (tmp_path / "gate").write_text("")
                reply = await session_stream.wait_for_id(3)
                assert reply["result"]["stopReason"] == "end_turn", reply
                texts = [m["params"]["update"].get("content", {}).get("text")
                         for m in session_stream.messages if m.get("method") == "session/update"]
                assert "LATE" not in texts and "hostile: next" in texts, texts
                assert not [m for m in session_stream.messages
                            if m.get("method") == "session/request_permission"]
