"""Real ACP clients spawn ``acp-server connect`` as their agent and hold a
conversation with a permission round trip through it: the ACP TypeScript SDK
(``@agentclientprotocol/sdk`` 2.4.0, its stdio ``ndJsonStream``; 2.x has no
``ClientSideConnection`` class, its client is ``acp.client()``) and the ACP Python
SDK (``agent-client-protocol``, ``spawn_agent_process``), the reference agent behind
the server."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.acp_http.server import running_acp_server
from tests.clients.node import run_script
from tests.connect.harness import ROOT
from tests.clients.conftest import acp_sdk  # noqa: F401 - the npm package, as a fixture

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent


def adapter_command(url: str) -> list[str]:
    return [sys.executable, "-m", "acp_server.connect.cli", url]


@pytest.mark.clients
async def test_the_typescript_sdk_over_stdio(acp_sdk: str, tmp_path: Path) -> None:
    async with running_acp_server(tmp_path) as srv:
        report = await run_script(str(HERE / "acp_sdk_stdio.mjs"), acp_sdk, srv.workspace,
                                  *adapter_command(srv.base_url + "/acp"))
    assert report["protocolVersion"] == 1
    assert report["sessionId"] in report["listed"]
    log = report["log"]
    assert [e["stopReason"] for e in log if e["kind"] == "stop"] == ["end_turn", "end_turn"]
    assert [e["options"] for e in log if e["kind"] == "permission"] == [
        ["allow_once", "allow_always", "reject_once"]]
    chunks = [e["text"] for e in log if e["kind"] == "update"
              and e["sessionUpdate"] == "agent_message_chunk"]
    assert "".join(chunks) == "Echo: hello from node" \
        "Permission allowed (allow_once).\nEcho: may I"
    # the permission was asked inside the second turn, before its end
    kinds = [e["kind"] for e in log]
    assert kinds.index("permission") < len(kinds) - 1 - kinds[::-1].index("stop")
    assert report["exitCode"] == 0


class _Recorder:
    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.permissions: list[list[str]] = []


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the ACP Python SDK is asyncio-only
async def test_the_python_sdk_over_stdio(tmp_path: Path, anyio_backend: str) -> None:
    acp = pytest.importorskip("acp")
    from acp.schema import (AgentMessageChunk, AllowedOutcome, ClientCapabilities,
                            RequestPermissionResponse)

    record = _Recorder()

    class Editor(acp.Client):  # type: ignore[misc,name-defined]
        async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
            if isinstance(update, AgentMessageChunk):
                record.chunks.append(update.content.text)

        async def request_permission(self, options: Any, session_id: str, tool_call: Any,
                                     **kwargs: Any) -> RequestPermissionResponse:
            record.permissions.append([o.option_id for o in options])
            return RequestPermissionResponse(
                outcome=AllowedOutcome(outcome="selected", option_id=options[-1].option_id))

    async with running_acp_server(tmp_path) as srv:
        command, *args = adapter_command(srv.base_url + "/acp")
        async with acp.spawn_agent_process(Editor(), command, *args,
                                           env={"PYTHONPATH": ROOT},
                                           transport_kwargs={"limit": 64 << 20}) as (conn, _p):
            init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION,
                                         client_capabilities=ClientCapabilities())
            assert init.protocol_version == 1
            assert init.agent_capabilities.load_session is True
            session = await conn.new_session(cwd=srv.workspace, mcp_servers=[])
            first = await conn.prompt(session_id=session.session_id,
                                      prompt=[acp.text_block("/chunks 4 hello from python")])
            assert first.stop_reason == "end_turn"
            second = await conn.prompt(session_id=session.session_id,
                                       prompt=[acp.text_block("/permission go on")])
            assert second.stop_reason == "end_turn"
            listed = await conn.list_sessions()
            assert session.session_id in [s.session_id for s in listed.sessions]
    assert record.permissions == [["allow_once", "allow_always", "reject_once"]]
    assert "".join(record.chunks) == "Echo: hello from python" \
        "Permission rejected (reject_once).\nEcho: go on"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the ACP Python SDK is asyncio-only
async def test_the_python_sdk_walks_session_list_pages(tmp_path: Path, anyio_backend: str) -> None:
    """``session/list`` with ``cursor`` / ``nextCursor`` as the ACP Python SDK reads it:
    its typed ``ListSessionsResponse`` (``next_cursor``, ``updated_at``)."""
    acp = pytest.importorskip("acp")
    from acp.schema import ClientCapabilities

    from acp_server.acp_http.listing import PAGE_SIZE
    from bridge import BridgeOptions

    class Editor(acp.Client):  # type: ignore[misc,name-defined]
        async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
            pass

    async with running_acp_server(tmp_path, options=BridgeOptions(max_sessions=100)) as srv:
        made = [(await srv.bridge.create_session()).session_id for _ in range(PAGE_SIZE + 3)]
        command, *args = adapter_command(srv.base_url + "/acp")
        async with acp.spawn_agent_process(Editor(), command, *args,
                                           env={"PYTHONPATH": ROOT}) as (conn, _p):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION,
                                  client_capabilities=ClientCapabilities())
            first = await conn.list_sessions()
            assert len(first.sessions) == PAGE_SIZE and first.next_cursor
            second = await conn.list_sessions(cursor=first.next_cursor)
            assert second.next_cursor is None
            again = await conn.list_sessions(cwd=srv.workspace)
    walked = [s.session_id for s in first.sessions + second.sessions]
    assert walked == made[::-1]
    assert all(s.cwd == srv.workspace and s.updated_at for s in first.sessions)
    assert [s.session_id for s in again.sessions] == walked[:PAGE_SIZE]
