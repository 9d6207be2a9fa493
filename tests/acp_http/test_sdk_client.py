"""The ACP Python SDK (``agent-client-protocol``) as an independent client: its
Streamable HTTP transport and its WebSocket transport against our ``/acp``.

The SDK is asyncio-only, so these run under the asyncio backend only."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

acp = pytest.importorskip("acp")
from acp import PROTOCOL_VERSION, Client, connect_to_agent, text_block  # noqa: E402
from acp.http import create_http_stream  # noqa: E402
from acp.schema import (  # noqa: E402
    AgentMessageChunk,
    AllowedOutcome,
    ClientCapabilities,
    RequestPermissionResponse,
)

from tests.acp_http.server import RunningAcpServer  # noqa: E402
from tests.bridge.helpers import wait_until

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class RecordingClient(Client):
    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.permissions = 0

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if isinstance(update, AgentMessageChunk):
            self.chunks.append(update.content.text)

    async def request_permission(self, options: Any, session_id: str, tool_call: Any,
                                 **kwargs: Any) -> RequestPermissionResponse:
        self.permissions += 1
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=options[0].option_id))


async def _turns(conn: Any, client: RecordingClient, workspace: str) -> None:
    init = await conn.initialize(protocol_version=PROTOCOL_VERSION,
                                 client_capabilities=ClientCapabilities())
    assert init.protocol_version == 1
    session = await conn.new_session(cwd=workspace, mcp_servers=[])
    result = await conn.prompt(session_id=session.session_id,
                               prompt=[text_block("/chunks 3 hello sdk")])
    assert result.stop_reason == "end_turn"
    # the SDK runs each notification's handler in its own task: wait for them
    await wait_until(lambda: "".join(client.chunks).endswith("Echo: hello sdk"))
    assert len(client.chunks) >= 3
    client.chunks.clear()
    result = await conn.prompt(session_id=session.session_id,
                               prompt=[text_block("/permission ok")])
    assert result.stop_reason == "end_turn"
    assert client.permissions == 1
    await wait_until(lambda: "Permission allowed" in "".join(client.chunks))


async def test_sdk_http_client(server: RunningAcpServer) -> None:
    client = RecordingClient()
    async with httpx.AsyncClient(timeout=httpx.Timeout(None)) as http:
        transport = create_http_stream(f"{server.base_url}/acp", client=http)
        conn = connect_to_agent(client, transport)
        try:
            await _turns(conn, client, server.workspace)
        finally:
            await conn.close()
    assert not server.registry.connections          # the SDK DELETEs on close


async def test_sdk_websocket_client(server: RunningAcpServer) -> None:
    from acp.ws import create_websocket_stream

    client = RecordingClient()
    url = server.base_url.replace("http://", "ws://") + "/acp"
    transport = await create_websocket_stream(url)
    conn = connect_to_agent(client, transport)
    try:
        await _turns(conn, client, server.workspace)
    finally:
        await conn.close()
