"""An agent whose every JSON-RPC error is as big as it likes, beyond the setters
(``bridge.wire.agent_error``, where its connection makes the ``AgentError``), behind
both doors over real HTTP on both anyio backends: a real child
(``tests.agents.fixture_agent --refuse-new`` / ``--refuse-others``) refuses
``session/new``, ``session/delete``, an extension it advertises and a prompt with a
5,000-character message and a 2 MiB ``data``. REST's ``data`` (a refused
``POST /session``), a failed turn's ``turn_error`` and ``turnError``, and ``/acp``'s
JSON-RPC errors carry the message cut at 1,000 characters and, in place of the
``data``, the marker ``{errorKind, truncated: true, bytes}``; a small ``data`` passes
as it is."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import anyio
import pytest

from bridge.wire import MAX_AGENT_DATA, MAX_AGENT_MESSAGE
from tests.acp_http.server import RunningAcpServer, Sse, request, running_acp_server
from tests.agents import fixture_command
from tests.rest.server import running_server

pytestmark = pytest.mark.anyio

BIG = 2 * 1024 * 1024
BLOB_OVERHEAD = len('{"errorKind":"hostile","blob":""}')
SMALL = 4 * 1024   # what a bounded answer stays under


def refusing(flag: str, size: int) -> str:
    return shlex.join(fixture_command("refusing", flag, str(size)))


def marker(size: int) -> dict[str, Any]:
    return {"errorKind": "hostile", "truncated": True, "bytes": size + BLOB_OVERHEAD}


async def test_rest_a_refused_new_session_answers_a_bounded_data(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with running_server(tmp_path, agent=refusing("--refuse-new", BIG)) as srv:
            answer = await srv.client.post("/session", json={})
            assert answer.status_code == 500, answer.text[:200]
            assert len(answer.content) < SMALL, len(answer.content)
            assert answer.json() == {"error": "Internal error", "code": -32603,
                                     "data": marker(BIG)}


async def test_rest_a_refused_prompt_reports_a_bounded_message(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with running_server(tmp_path, agent=refusing("--refuse-others", BIG)) as srv:
            sid = (await srv.create_session())["sessionId"]
            failed = (await srv.prompt(sid, "refuse")).json()
            frames = await srv.events_until(sid, "turn_error", timeout=30,
                                            last_event_id=failed["lastEventId"])
            error = frames[-1][1]["data"]
            assert (error["message"], error["code"], error["errorKind"]) == \
                ("r" * MAX_AGENT_MESSAGE, "-32603", "hostile")
            status = (await srv.client.get(f"/session/{sid}/status")).json()
            assert status["turnError"] == {"message": "r" * MAX_AGENT_MESSAGE,
                                           "code": "-32603", "errorKind": "hostile"}


async def _acp_error(srv: RunningAcpServer, conn_id: str, stream: Sse, rpc_id: int,
                     method: str, params: dict[str, Any], sid: str | None) -> dict[str, Any]:
    sent = await srv.post(conn_id, request(rpc_id, method, params), sid)
    assert sent.status_code == 202, sent.text
    reply = await stream.wait_for_id(rpc_id)
    assert len(str(reply)) < SMALL, (method, len(str(reply)))
    return reply["error"]  # type: ignore[no-any-return]


async def test_acp_a_refused_new_session_is_bounded(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with running_acp_server(tmp_path, agent=refusing("--refuse-new", BIG)) as srv:
            conn_id, _ = await srv.initialize()
            async with srv.stream(conn_id) as conn_stream:
                error = await _acp_error(srv, conn_id, conn_stream, 1, "session/new",
                                         {"cwd": srv.workspace, "mcpServers": []}, None)
                assert error == {"code": -32603, "message": "r" * MAX_AGENT_MESSAGE,
                                 "data": marker(BIG)}


async def test_acp_forwarded_requests_and_prompts_are_bounded(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with running_acp_server(tmp_path, agent=refusing("--refuse-others", BIG)) as srv:
            conn_id, _ = await srv.initialize()
            async with srv.stream(conn_id) as conn_stream:
                sid = await srv.new_session(conn_id, conn_stream)
                async with srv.stream(conn_id, sid) as session_stream:
                    for rpc_id, (method, params, stream) in enumerate((
                            ("_fixture/refuse", {"sessionId": sid}, conn_stream),   # passed
                            ("session/prompt", {"sessionId": sid, "prompt": [
                                {"type": "text", "text": "refuse"}]}, session_stream),
                            ("session/delete", {"sessionId": sid}, session_stream)), start=2):
                        error = await _acp_error(srv, conn_id, stream, rpc_id, method,
                                                 params, sid)
                        assert error["code"] == -32603, method
                        assert error["message"] == "r" * MAX_AGENT_MESSAGE, method
                        assert error["data"] == marker(BIG), method


async def test_a_small_data_passes_as_it_is(tmp_path: Path) -> None:
    size = MAX_AGENT_DATA - BLOB_OVERHEAD   # exactly the cap, encoded
    with anyio.fail_after(60):
        async with running_server(tmp_path, agent=refusing("--refuse-new", size)) as srv:
            answer = await srv.client.post("/session", json={})
            assert answer.status_code == 500
            assert answer.json()["data"] == {"errorKind": "hostile", "blob": "x" * size}
