"""``/acp`` answers checked against the ACP schema's response types: what
``initialize`` advertises and the protocol version it answers, and what ``session/resume`` answers (``ResumeSessionResponse``:
the session's ``modes`` and ``configOptions``, as ``session/load`` answers them).

The agent here is the reference agent with session state (``modes``,
``configOptions``) in its ``session/new`` answer, no ``sessionCapabilities`` but
``resume`` (as agents that list nothing and close nothing themselves) and
``additionalDirectories``, HTTP and SSE MCP servers (as qwen, claude, gemini), and the
unstable ``providers`` and ``nes``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import anyio.abc
import pytest

from bridge.agents.reference import ReferenceAgentFactory, ReferenceConnection
from tests.acp_http.server import RunningAcpServer, request, running_acp_server

pytestmark = pytest.mark.anyio

MODES = {"currentModeId": "ask", "availableModes": [{"id": "ask", "name": "Ask"},
                                                    {"id": "code", "name": "Code"}]}
CONFIG = [{"id": "model", "name": "Model", "type": "select", "currentValue": "small",
           "options": [{"value": "small", "name": "Small"}]}]


class _StatefulConnection:
    def __init__(self, inner: ReferenceConnection) -> None:
        self.inner = inner

    @property
    def closed(self) -> bool:
        return self.inner.closed

    async def request(self, method: str, params: Any) -> Any:
        result = await self.inner.request(method, params)
        if method == "initialize":
            caps = result["agentCapabilities"]
            caps["sessionCapabilities"] = {"resume": {}, "list": None,
                                           "additionalDirectories": {}}
            caps["mcpCapabilities"] = {"http": True, "sse": True}   # as qwen, claude, gemini
            caps["providers"] = {}
            caps["nes"] = {"events": {}}
            caps["positionEncoding"] = "utf-16"
        elif method in ("session/new", "session/load", "session/resume"):
            result = {**{k: v for k, v in result.items() if k != "models"},
                      "modes": copy.deepcopy(MODES), "configOptions": CONFIG}
        return result

    async def notify(self, method: str, params: Any) -> None:
        await self.inner.notify(method, params)

    async def aclose(self) -> None:
        await self.inner.aclose()


class StatefulFactory:
    name = "reference"

    def __init__(self) -> None:
        self.inner = ReferenceAgentFactory()

    async def connect(self, client: Any, task_group: anyio.abc.TaskGroup) -> _StatefulConnection:
        return _StatefulConnection(await self.inner.connect(client, task_group))


async def test_initialize_advertises_what_acp_implements_whatever_the_agent(
        tmp_path: Path) -> None:
    """``session/list``, ``close`` and ``delete`` are the server's own: advertised
    before the agent has started and after, though this agent offers none of them."""
    async with running_acp_server(tmp_path, agent_factory=StatefulFactory()) as srv:
        _conn_id, before = await srv.initialize()
        conn_id, _ = await srv.initialize()
        async with srv.stream(conn_id) as conn_stream:
            await srv.new_session(conn_id, conn_stream)   # the agent runs now
            _, after = await srv.initialize()
            for answer in (before, after):
                caps = answer["result"]["agentCapabilities"]["sessionCapabilities"]
                assert {"list", "close", "delete"} <= set(caps), caps
                assert all(caps[name] == {} for name in ("list", "close", "delete")), caps
            assert after["result"]["agentCapabilities"]["sessionCapabilities"]["resume"] == {}
            await srv.post(conn_id, request(2, "session/list", {}))
            assert len((await conn_stream.wait_for_id(2))["result"]["sessions"]) == 1


async def test_initialize_does_not_advertise_what_acp_does_not_pass_on(tmp_path: Path) -> None:
    """The client's ``mcpServers`` and ``additionalDirectories`` never reach the agent,
    so the agent's ``mcpCapabilities`` and ``additionalDirectories`` are not offered;
    nor are ``providers`` and ``nes``, whose methods (``providers/list``,
    ``nes/start``) name no session, so never reach the agent."""
    async with running_acp_server(tmp_path, agent_factory=StatefulFactory()) as srv:
        conn_id, before = await srv.initialize()
        async with srv.stream(conn_id) as conn_stream:
            await srv.new_session(conn_id, conn_stream)   # the agent runs now
            _, after = await srv.initialize()
        for answer in (before, after):
            caps = answer["result"]["agentCapabilities"]
            assert caps["mcpCapabilities"] == {"http": False, "sse": False}, caps
            assert "additionalDirectories" not in caps["sessionCapabilities"], caps
            assert not {"providers", "nes", "positionEncoding"} & set(caps), caps
        await srv.post(conn_id, request(2, "providers/list", {}))
        await srv.post(conn_id, request(3, "nes/start", {}))
        async with srv.stream(conn_id) as conn_stream:   # names no session: not served
            assert (await conn_stream.wait_for_id(2))["error"]["code"] == -32601
            assert (await conn_stream.wait_for_id(3))["error"]["code"] == -32601


@pytest.mark.parametrize("asked", [0, -1, 2, 65535, "1", None])
async def test_initialize_answers_the_one_protocol_version_it_speaks(
        server: RunningAcpServer, asked: Any) -> None:
    """ACP: the client's version when supported, else the latest supported. This
    server speaks 1 only, so a client asking for 0 (pre-1.0 ACP) is not told 0."""
    response = await server.post(None, request(0, "initialize", {"protocolVersion": asked}))
    assert response.status_code == 200, response.text
    assert response.json()["result"]["protocolVersion"] == 1


async def test_session_resume_answers_the_session_state(tmp_path: Path) -> None:
    """A second connection's ``session/resume`` gets the session's modes and
    configOptions, as its ``session/load`` does (with a cursor too)."""
    async with running_acp_server(tmp_path, agent_factory=StatefulFactory()) as srv:
        conn_id, _ = await srv.initialize()
        async with srv.stream(conn_id) as conn_stream:
            sid = await srv.new_session(conn_id, conn_stream)
        other, _ = await srv.initialize()
        async with srv.stream(other) as conn_stream:
            params = {"sessionId": sid, "cwd": srv.workspace, "mcpServers": []}
            await srv.post(other, request(2, "session/load", params))
            await srv.post(other, request(3, "session/resume", params))
            with_cursor = {**params, "_meta": {"acp-server/lastEventId": 0}}
            await srv.post(other, request(4, "session/resume", with_cursor))
            load = (await conn_stream.wait_for_id(2))["result"]
            resume = (await conn_stream.wait_for_id(3))["result"]
            resumed_after = (await conn_stream.wait_for_id(4))["result"]
        assert load == {"modes": MODES, "configOptions": CONFIG}
        assert resume == load
        assert {k: v for k, v in resumed_after.items() if k != "_meta"} == load
        assert "acp-server/events" in resumed_after["_meta"]
