"""Agents that never answer ``session/new`` wedge nothing (#21 item 2), over real HTTP
with the real ``acp-server serve`` and real agent processes.

* Every agent request the bridge awaits has a deadline (``--agent-request-timeout-ms``):
  a hung ``session/new``, or one whose answer drowned in a 50 MB line, is 504
  ``agent_request_timeout`` and its slot comes back.
* A client that goes away releases its in-flight slot.
* One agent's failure never takes capacity from another: 32 hung ``session/new`` to
  ``nonew`` hold only its share of ``--max-sessions``; the reference agent and LMSP
  work on it go on.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.agents import fixture_command
from tests.harness import ServeProcess

pytestmark = pytest.mark.anyio

SWALLOW_BYTES = 50 * 1024 * 1024


def agent_flag(name: str, *flags: str) -> list[str]:
    return ["--agent", f"{name}={shlex.join(fixture_command(name, *flags))}"]


async def runtime(daemon: ServeProcess) -> dict[str, Any]:
    response = await daemon.client.get("/daemon/status")
    assert response.status_code == 200
    return response.json()["runtime"]  # type: ignore[no-any-return]


async def wait_for(daemon: ServeProcess, check: Any, timeout: float = 20.0) -> dict[str, Any]:
    """Poll ``/daemon/status`` until ``check(runtime)`` holds."""
    with anyio.fail_after(timeout):
        while True:
            current = await runtime(daemon)
            if check(current):
                return current
            await anyio.sleep(0.02)


async def create(client: httpx.AsyncClient, agent: str) -> httpx.Response:
    return await client.post("/session", json={"agent": agent, "sessionScope": "thread"})


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the servers are child processes
async def test_hung_session_new_holds_only_its_share_and_gives_it_back(tmp_path: Path) -> None:
    flags = [*agent_flag("nonew", "--never-answer-new"),
             "--agent-request-timeout-ms", "600000"]
    async with ServeProcess(tmp_path, "--agent", "reference", *flags) as daemon:
        refused: list[dict[str, Any]] = []

        async def give_up_later(client: httpx.AsyncClient) -> None:
            response = await create(client, "nonew")   # hangs, or 503 past the share
            assert response.status_code == 503, response.text
            refused.append(response.json())

        clients = [httpx.AsyncClient(base_url=daemon.base_url, timeout=None) for _ in range(32)]
        try:
            async with anyio.create_task_group() as tg:
                for client in clients:
                    tg.start_soon(give_up_later, client)
                # 2 agents, --max-sessions 32: each keeps a reserve of 32 // 4 = 8,
                # so nonew holds at most 24 slots and 8 of the 32 are refused.
                await wait_for(daemon, lambda r: r["sessions"]["admissionInFlight"] == 24
                               and len(refused) == 8)
                assert {(r["code"], r["scope"], r["agent"], r["limit"]) for r in refused} == {
                    ("session_limit_exceeded", "agent", "nonew", 24)}
                # The other agent is not wedged: REST and LMSP work on it go on.
                ok = await create(daemon.client, "reference")
                assert ok.status_code == 200, ok.text
                answer = await daemon.client.post("/lmsp/v1/responses", json={
                    "model": "reference", "input": "still served", "store": False})
                assert answer.status_code == 200, answer.text
                assert answer.json()["status"] == "completed"
                tg.cancel_scope.cancel()   # the 24 clients go away
        finally:
            for client in clients:
                await client.aclose()
        # Every slot of a client gone comes back: only the reference session is left.
        done = await wait_for(daemon, lambda r: r["sessions"]["admissionInFlight"] == 0)
        assert done["sessions"]["active"] == 1


@pytest.mark.parametrize("anyio_backend", ["trio"])   # the servers are child processes
async def test_agent_requests_have_a_deadline(tmp_path: Path) -> None:
    flags = [*agent_flag("nonew", "--never-answer-new"),
             *agent_flag("flood", "--swallow-new", str(SWALLOW_BYTES)),
             "--agent-request-timeout-ms", "500"]
    async with ServeProcess(tmp_path, "--agent", "reference", *flags) as daemon:
        for agent in ("nonew", "flood"):
            response = await create(daemon.client, agent)
            assert response.status_code == 504, response.text
            body = response.json()
            assert body["code"] == "agent_request_timeout" and body["retryable"] is True
            assert body["phase"] == "session/new" and body["timeoutMs"] == 500
        done = await runtime(daemon)
        assert done["sessions"]["admissionInFlight"] == 0 and done["sessions"]["active"] == 0
        # The same deadline on /acp, answered in the door's shape.
        init = await daemon.client.post("/acp", json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}})
        conn_id = init.headers["acp-connection-id"]
        async with daemon.client.stream("GET", "/acp", headers={
                "Acp-Connection-Id": conn_id, "Accept": "text/event-stream"}) as stream:
            posted = await daemon.client.post("/acp", headers={"Acp-Connection-Id": conn_id},
                                              json={"jsonrpc": "2.0", "id": 1,
                                                    "method": "session/new", "params": {
                                                        "cwd": str(tmp_path), "mcpServers": [],
                                                        "_meta": {"acp-server/agent": "nonew"}}})
            assert posted.status_code == 202
            reply = await _first_data(stream)
        assert reply["id"] == 1 and reply["error"]["data"]["errorKind"] == "agent_request_timeout"
        assert (await create(daemon.client, "reference")).status_code == 200


async def _first_data(stream: httpx.Response) -> dict[str, Any]:
    import json

    with anyio.fail_after(20):
        async for line in stream.aiter_lines():
            if line.startswith("data: "):
                return json.loads(line[6:])  # type: ignore[no-any-return]
    raise AssertionError("the stream ended")
