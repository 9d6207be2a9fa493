"""An agent whose setter refusals are as big as it likes
(``bridge.setting_changes.refused``), behind both doors over real HTTP on both anyio
backends: a real child (``tests.agents.fixture_agent --refuse-setters``) refuses every
``session/set_mode``, ``set_model`` and ``set_config_option`` with a 5,000-character
message and a 2 MiB ``data``. REST's ``agent_refused`` and ``/acp``'s JSON-RPC error
carry the message cut at 1,000 characters and, in place of the ``data``, the marker
``{errorKind, truncated: true, bytes}``; a small ``data`` passes as it is."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import anyio
import pytest

from bridge.wire import MAX_AGENT_DATA, MAX_AGENT_MESSAGE
from tests.acp_http.server import request, running_acp_server
from tests.agents import fixture_command

pytestmark = pytest.mark.anyio

BIG = 2 * 1024 * 1024
BLOB_OVERHEAD = len('{"errorKind":"hostile","blob":""}')


def refusing(size: int) -> str:
    return shlex.join(fixture_command("refusing", "--modes", "--refuse-setters", str(size)))


def marker(size: int) -> dict[str, Any]:
    return {"errorKind": "hostile", "truncated": True, "bytes": size + BLOB_OVERHEAD}


async def test_rest_setters_answer_a_bounded_refusal(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with running_acp_server(tmp_path, agent=refusing(BIG)) as srv:
            sid = (await srv.client.post("/session", json={})).json()["sessionId"]
            for route, body in (("approval-mode", {"mode": "code"}),
                                ("model", {"modelId": "m"}),
                                ("config-option", {"configId": "c", "value": "v"})):
                answer = await srv.client.post(f"/session/{sid}/{route}", json=body)
                assert answer.status_code == 409, route
                assert len(answer.content) < 4 * 1024, (route, len(answer.content))
                refusal = answer.json()
                assert refusal["code"] == "agent_refused"
                assert refusal["error"] == "r" * MAX_AGENT_MESSAGE
                assert refusal["data"] == marker(BIG), route


async def test_acp_setters_answer_a_bounded_refusal(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with running_acp_server(tmp_path, agent=refusing(BIG)) as srv:
            conn_id, _ = await srv.initialize()
            async with srv.stream(conn_id) as conn_stream:
                sid = await srv.new_session(conn_id, conn_stream)
                async with srv.stream(conn_id, sid) as session_stream:
                    for rpc_id, (method, params) in enumerate((
                            ("session/set_mode", {"modeId": "code"}),
                            ("session/set_model", {"modelId": "m"}),
                            ("session/set_config_option", {"configId": "c", "value": "v"})),
                            start=2):
                        sent = await srv.post(conn_id, request(
                            rpc_id, method, {"sessionId": sid, **params}), sid)
                        assert sent.status_code == 202, sent.text
                        reply = await session_stream.wait_for_id(rpc_id)
                        error = reply["error"]
                        assert error["code"] == -32603
                        assert error["message"] == "r" * MAX_AGENT_MESSAGE
                        assert error["data"] == marker(BIG), method


async def test_a_refusals_small_data_passes_as_it_is(tmp_path: Path) -> None:
    size = MAX_AGENT_DATA - BLOB_OVERHEAD   # exactly the cap, encoded
    with anyio.fail_after(60):
        async with running_acp_server(tmp_path, agent=refusing(size)) as srv:
            sid = (await srv.client.post("/session", json={})).json()["sessionId"]
            answer = await srv.client.post(f"/session/{sid}/approval-mode",
                                           json={"mode": "code"})
            assert answer.status_code == 409
            assert answer.json()["data"] == {"errorKind": "hostile", "blob": "x" * size}
