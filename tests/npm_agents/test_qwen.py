"""`qwen --acp` (npm @qwen-code/qwen-code) behind our server, against our fake model server.

Real turns over REST (and over `/acp`): a plain turn, the permission round trip on a tool call, cancel
mid-turn, and the queue cap with a real agent behind it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from httpx_sse import aconnect_sse

from bridge import BridgeOptions
from bridge.agents.stdio import StdioAgentFactory
from tests.acp_http.server import RunningAcpServer, request, text
from tests.bridge.fake_model_server import FakeModelState, build_fake_model_app
from tests.harness import local_server, serving

pytestmark = [pytest.mark.anyio, pytest.mark.agents]


@contextlib.asynccontextmanager
async def qwen_server(tmp_path: Path, qwen_entry: str, *, max_pending: int = 5,
                      acp: list[RunningAcpServer] | None = None,
                      ) -> AsyncIterator[tuple[httpx.AsyncClient, FakeModelState, Path]]:
    """Our server with qwen behind it; ``acp`` (when given) receives an /acp driver."""
    state = FakeModelState()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    state.write_path = str(workspace / "hello.txt")
    async with serving(build_fake_model_app(state)) as model_url:
        home = tmp_path / "home"
        home.mkdir()
        factory = StdioAgentFactory(
            [shutil.which("node") or "node", qwen_entry, "--acp", "--auth-type", "openai",
             "--approval-mode", "default"],
            cwd=str(workspace), name="qwen", shutdown_grace_s=2.0,
            env={"HOME": str(home), "OPENAI_BASE_URL": model_url + "/v1", "OPENAI_API_KEY": "x",
                 "OPENAI_MODEL": "fake-small", "QWEN_CODE_NO_RELAUNCH": "true",
                 "NO_COLOR": "1"})
        options = BridgeOptions(max_pending_prompts_per_session=max_pending,
                                initialize_timeout_ms=60_000)
        async with local_server(workspace, kind=RunningAcpServer, options=options,
                                agent_factory=factory, state_dir=tmp_path / "state",
                                timeout=60) as srv:
            if acp is not None:
                acp.append(srv)
            yield srv.client, state, workspace


async def new_session(client: httpx.AsyncClient) -> str:
    response = await client.post("/session", json={"sessionScope": "thread"})
    assert response.status_code == 200, response.text
    return response.json()["sessionId"]


async def prompt(client: httpx.AsyncClient, sid: str, text: str) -> httpx.Response:
    return await client.post(f"/session/{sid}/prompt",
                             json={"prompt": [{"type": "text", "text": text}]})


async def events(client: httpx.AsyncClient, sid: str, cursor: int, until: str,
                 on_event: Any = None, timeout: float = 90) -> list[tuple[str, dict]]:
    frames: list[tuple[str, dict]] = []
    with anyio.fail_after(timeout):
        async with aconnect_sse(client, "GET", f"/session/{sid}/events",
                                headers={"Last-Event-ID": str(cursor)}) as source:
            async for sse in source.aiter_sse():
                if not sse.data:
                    continue
                frame = (sse.event, json.loads(sse.data))
                frames.append(frame)
                if on_event is not None:
                    await on_event(*frame)
                if sse.event == until:
                    return frames
    return frames


def agent_text(frames: list[tuple[str, dict]]) -> str:
    return "".join(d["data"]["update"]["content"].get("text", "") for kind, d in frames
                   if kind == "session_update"
                   and d["data"]["update"]["sessionUpdate"] == "agent_message_chunk")


async def test_plain_turn(tmp_path, qwen_entry):
    async with qwen_server(tmp_path, qwen_entry) as (client, state, _):
        sid = await new_session(client)
        accepted = await prompt(client, sid, "say hello")
        assert accepted.status_code == 202
        frames = await events(client, sid, accepted.json()["lastEventId"], "turn_complete")
        assert frames[-1][1]["data"]["stopReason"] == "end_turn"
        assert "pong" in agent_text(frames)
        assert state.requests, "qwen never called the model server"


async def test_permission_round_trip_on_a_tool_call(tmp_path, qwen_entry):
    async with qwen_server(tmp_path, qwen_entry) as (client, state, workspace):
        sid = await new_session(client)
        accepted = await prompt(client, sid, "WRITE the file please")
        votes = []

        async def vote(kind: str, data: dict) -> None:
            if kind == "permission_request":
                request = data["data"]
                option = next(o for o in request["options"] if o["kind"] == "allow_once")
                answer = await client.post(f"/session/{sid}/permission/{request['requestId']}",
                                           json={"outcome": {"outcome": "selected",
                                                             "optionId": option["optionId"]}})
                votes.append(answer.status_code)

        frames = await events(client, sid, accepted.json()["lastEventId"], "turn_complete",
                              on_event=vote)
        kinds = [k for k, _ in frames]
        assert votes == [200]
        assert kinds.index("permission_request") < kinds.index("permission_resolved")
        assert frames[-1][1]["data"]["stopReason"] == "end_turn"
        assert (workspace / "hello.txt").read_text() == "written via ACP\n"


async def test_cancel_mid_turn(tmp_path, qwen_entry):
    async with qwen_server(tmp_path, qwen_entry) as (client, state, _):
        sid = await new_session(client)
        accepted = await prompt(client, sid, "SLOW story please")
        cancelled = []

        async def cancel(kind: str, data: dict) -> None:
            if not cancelled and kind == "session_update" \
                    and data["data"]["update"]["sessionUpdate"] == "agent_message_chunk":
                cancelled.append((await client.post(f"/session/{sid}/cancel")).status_code)

        frames = await events(client, sid, accepted.json()["lastEventId"], "turn_complete",
                              on_event=cancel)
        assert cancelled == [204]
        assert "prompt_cancelled" in [k for k, _ in frames]
        assert frames[-1][1]["data"]["stopReason"] == "cancelled"


async def test_queue_full_with_a_real_agent(tmp_path, qwen_entry):
    async with qwen_server(tmp_path, qwen_entry, max_pending=1) as (client, state, _):
        sid = await new_session(client)
        first = await prompt(client, sid, "SLOW story please")
        assert first.status_code == 202
        refused = await prompt(client, sid, "another")
        assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
        assert refused.json() == {"error": f'Prompt queue full for session "{sid}" (1/1 pending)',
                                  "code": "prompt_queue_full", "sessionId": sid, "limit": 1,
                                  "pendingCount": 1}
        await client.post(f"/session/{sid}/cancel")
        await events(client, sid, first.json()["lastEventId"], "turn_complete")
        assert (await prompt(client, sid, "again")).status_code == 202


async def test_turn_and_permission_over_acp(tmp_path, qwen_entry):
    drivers: list[RunningAcpServer] = []
    async with qwen_server(tmp_path, qwen_entry, acp=drivers) as (client, state, workspace):
        acp = drivers[0]
        conn_id, init = await acp.initialize()
        assert init["result"]["protocolVersion"] == 1
        async with acp.stream(conn_id) as conn_stream:
            await acp.post(conn_id, request(1, "session/new", {"cwd": str(workspace),
                                                              "mcpServers": []}))
            created = (await conn_stream.wait_for_id(1, timeout=60))["result"]
            sid = created["sessionId"]
            assert "models" in created or "modes" in created   # qwen's own fields kept
            async with acp.stream(conn_id, sid) as session_stream:
                await acp.post(conn_id, request(2, "session/prompt", {
                    "sessionId": sid, "prompt": text("say hello")}), sid)
                reply = await session_stream.wait_for_id(2, timeout=60)
                assert reply["result"]["stopReason"] == "end_turn"
                assert any(m.get("method") == "session/update" for m in session_stream.messages)

                await acp.post(conn_id, request(3, "session/prompt", {
                    "sessionId": sid, "prompt": text("WRITE the file please")}), sid)
                asked = await session_stream.wait_for(
                    lambda m: m.get("method") == "session/request_permission", timeout=60)
                option = next(o for o in asked["params"]["options"] if o["kind"] == "allow_once")
                answer = await acp.post(conn_id, {"jsonrpc": "2.0", "id": asked["id"], "result": {
                    "outcome": {"outcome": "selected", "optionId": option["optionId"]}}}, sid)
                assert answer.status_code == 202
                reply = await session_stream.wait_for_id(3, timeout=60)
                assert reply["result"]["stopReason"] == "end_turn"
                assert (workspace / "hello.txt").read_text() == "written via ACP\n"
