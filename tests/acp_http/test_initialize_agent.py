"""``/acp`` ``initialize`` answers what the default agent's sessions will have, also
when it is the connection's first message and the agent has not started yet: the
agent is started first (within the ``initialize`` timeout), and its capabilities are
the answer's; one that cannot start leaves only what the server serves whatever the
agent (``session/list``, ``close``, ``delete``), never a ``loadSession`` or
``resume`` nobody will honour."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.acp_http.server import request, running_acp_server
from tests.acp_http.wsclient import ws_connect
from tests.agents import fixture_command

pytestmark = pytest.mark.anyio

SERVED = {"list": {}, "close": {}, "delete": {}}


def caps(answer: dict[str, Any]) -> dict[str, Any]:
    return answer["result"]["agentCapabilities"]  # type: ignore[no-any-return]


async def test_first_initialize_answers_the_stdio_agents_capabilities(tmp_path: Path) -> None:
    """The fixture agent offers ``loadSession`` and ``close``, no ``resume`` or
    ``fork``: that is the first answer too, not the reference agent's defaults."""
    agent = shlex.join(fixture_command("plain"))
    async with running_acp_server(tmp_path, agent=agent) as srv:
        assert srv.server.bridge.agents.state(srv.server.bridge.agents.default) == "not_started"
        _, first = await srv.initialize()
        assert srv.server.bridge.agents.state(srv.server.bridge.agents.default) == "running"
        _, again = await srv.initialize()
        assert caps(first) == caps(again)
        assert caps(first)["loadSession"] is True
        assert caps(first)["sessionCapabilities"] == SERVED   # no resume, no fork


async def test_first_initialize_offers_the_reference_agents_fork(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path) as srv:
        _, first = await srv.initialize()
        assert "fork" in caps(first)["sessionCapabilities"], caps(first)
        async with ws_connect(srv.base_url) as ws:   # the WebSocket door alike
            await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
            answer = await ws.receive_json()
        assert caps(answer) == caps(first)


async def test_an_agent_that_cannot_start_is_offered_nothing_of_its_own(
        tmp_path: Path) -> None:
    agent = str(tmp_path / "no-such-agent")
    async with running_acp_server(tmp_path, agent=agent) as srv:
        conn_id, first = await srv.initialize()
        assert first["result"]["protocolVersion"] == 1
        assert caps(first) == {"sessionCapabilities": SERVED,
                               "mcpCapabilities": {"http": False, "sse": False}}
        async with srv.stream(conn_id) as conn_stream:
            await srv.post(conn_id, request(1, "session/new", {
                "cwd": srv.workspace, "mcpServers": []}))
            refused = await conn_stream.wait_for_id(1)
        assert refused["error"]["data"]["errorKind"] == "agent_unavailable", refused


async def test_a_start_that_fails_unexpectedly_still_answers_initialize(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An error of the agent's start that is not a ``BridgeError`` (a bug) is logged and
    ``initialize`` answers the server's own capabilities; it answered 500 (every
    client's first message)."""
    async with running_acp_server(tmp_path) as srv:
        async def broken() -> dict[str, Any]:
            raise RuntimeError("a bug in the start")

        monkeypatch.setattr(srv.server.bridge, "start_agent", broken)
        _, first = await srv.initialize()
        assert caps(first) == {"sessionCapabilities": SERVED,
                               "mcpCapabilities": {"http": False, "sse": False}}
    assert "a bug in the start" in caplog.text
