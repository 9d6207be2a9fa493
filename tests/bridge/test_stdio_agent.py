"""StdioAgentFactory against real child processes (the reference agent and tiny scripts)."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from bridge.agents.base import AgentConnection
from bridge.agents.stdio import StdioAgentConnection, StdioAgentFactory
from bridge.errors import AgentDiedError, AgentError
from tests.agents import fixture_command
from tests.bridge.fake_agent_client import FakeClient, prompt

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]


def reference_command(backend: str) -> list[str]:
    return [sys.executable, "-m", "bridge.agents.reference", "--backend", backend]


def script_command(source: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(source)]


@asynccontextmanager
async def spawned(
    client: FakeClient, command: list[str], **options: Any
) -> AsyncIterator[StdioAgentConnection]:
    factory = StdioAgentFactory(command, cwd=str(REPO), name="test", **options)
    with anyio.fail_after(10):
        # Exiting the task group proves the reader/stderr tasks end after aclose.
        async with anyio.create_task_group() as tg:
            conn = await factory.connect(client, tg)
            assert isinstance(conn, AgentConnection) and not conn.closed
            try:
                yield conn
            finally:
                await conn.aclose()


async def new_session(conn: StdioAgentConnection, cwd: str = "/work") -> str:
    return (await conn.request("session/new", {"cwd": cwd, "mcpServers": []}))["sessionId"]


def assert_reaped(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_initialize_session_and_chunks_in_order(anyio_backend: str) -> None:
    client = FakeClient()
    async with spawned(client, reference_command(anyio_backend)) as conn:
        info = await conn.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        assert info["protocolVersion"] == 1 and info["agentInfo"]["name"] == "acp-server-reference"
        sid = await new_session(conn)
        text = "".join(f"{i:03d}" for i in range(40))
        result = await conn.request("session/prompt", prompt(sid, f"/chunks 40 {text}"))
        assert result == {"stopReason": "end_turn"}
        chunks = client.chunks(sid)
        assert len(chunks) == 40  # all delivered before the answer, in order
        assert "".join(chunks) == f"Echo: {text}"
        assert all(isinstance(raw, msgspec.Raw) for raw in client.raw_updates)
        with pytest.raises(AgentError) as info_err:
            await conn.request("session/prompt", prompt(sid, "/fail"))
        assert info_err.value.rpc_code == -32603
        pid = conn.pid
    assert conn.returncode == 0  # the reference agent exits on stdin EOF
    assert_reaped(pid)
    assert client.lost == []


async def test_permission_round_trip_and_cancel(anyio_backend: str) -> None:
    client = FakeClient()
    async with spawned(client, reference_command(anyio_backend)) as conn:
        sid = await new_session(conn)
        await conn.request("session/prompt", prompt(sid, "/permission /chunks 1 please"))
        assert client.texts(sid) == "Permission allowed (allow_once).\nEcho: please"
        assert client.permission_requests[0]["toolCall"]["title"] == "Reference permission check"

        # A held permission request must not block session/cancel.
        client.clear()
        client.hold_permission = True
        client.permission_started = anyio.Event()
        results: list[Any] = []

        async def run() -> None:
            results.append(await conn.request("session/prompt", prompt(sid, "/permission x")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await client.permission_started.wait()
            await conn.notify("session/cancel", {"sessionId": sid})
        assert results == [{"stopReason": "cancelled"}]
        client.release.set()


async def test_cancel_interrupts_sleep(anyio_backend: str) -> None:
    client = FakeClient()
    async with spawned(client, reference_command(anyio_backend)) as conn:
        sid = await new_session(conn)
        results: list[Any] = []

        async def run() -> None:
            results.append(await conn.request("session/prompt", prompt(sid, "/sleep 120s")))

        with anyio.fail_after(30):   # a hang guard: the cancel ends the 120 s sleep
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                # the cancel once the prompt is on its way (it then holds the write lock
                # or has written: the agent reads the prompt first), not after a fixed
                # 50 ms a loaded machine could spend before the prompt was sent
                while not conn._requests._waiting:  # type: ignore[attr-defined]
                    await anyio.sleep(0.005)
                await conn.notify("session/cancel", {"sessionId": sid})
        assert results == [{"stopReason": "cancelled"}]


async def test_fs_write_confined(tmp_path: Path, anyio_backend: str) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    client = FakeClient(root=workspace)
    async with spawned(client, reference_command(anyio_backend)) as conn:
        sid = await new_session(conn, cwd=str(workspace))
        await conn.request("session/prompt", prompt(sid, "/tool write out.txt written over stdio"))
        assert (workspace / "out.txt").read_text() == "written over stdio\n"
        statuses = [u.get("status") for u in client.session_updates(sid) if "toolCallId" in u]
        assert statuses == ["pending", "completed"]
        client.clear()
        await conn.request("session/prompt", prompt(sid, "/tool write ../escape.txt"))
        statuses = [u.get("status") for u in client.session_updates(sid) if "toolCallId" in u]
        assert statuses == ["pending", "failed"]
        assert "failed: Path outside the workspace" in client.texts(sid)
    assert not (tmp_path / "escape.txt").exists()


async def test_line_over_one_mebibyte_passes_both_ways(anyio_backend: str) -> None:
    client = FakeClient()
    big = "x" * (1536 * 1024)
    async with spawned(client, reference_command(anyio_backend)) as conn:
        sid = await new_session(conn)
        await conn.request("session/prompt", prompt(sid, f"/chunks 1 {big}"))
        assert client.chunks(sid) == [f"Echo: {big}"]


@pytest.mark.parametrize(("limit", "size"), [(4096, 6000), (65536, 400_000)], ids=["one-read", "many-reads"])
async def test_line_over_the_limit_is_a_protocol_failure(anyio_backend: str, limit: int, size: int) -> None:
    client = FakeClient()
    command = reference_command(anyio_backend)
    async with spawned(client, command, max_line_bytes=limit, shutdown_grace_s=0.3) as conn:
        sid = await new_session(conn)
        with pytest.raises(AgentDiedError, match="limit"):
            await conn.request("session/prompt", prompt(sid, "/chunks 1 " + "y" * size))
        assert len(client.lost) == 1 and conn.closed
        pid = conn.pid
    assert_reaped(pid)


async def test_crash_mid_turn(anyio_backend: str) -> None:
    client = FakeClient()
    async with spawned(client, reference_command(anyio_backend)) as conn:
        a = await new_session(conn)
        b = await new_session(conn)
        other: list[BaseException] = []

        async def sleeper() -> None:
            with pytest.raises(AgentDiedError) as info:
                await conn.request("session/prompt", prompt(b, "/sleep 10s"))
            other.append(info.value)

        async with anyio.create_task_group() as tg:
            tg.start_soon(sleeper)
            await anyio.sleep(0.05)
            with pytest.raises(AgentDiedError) as info:
                await conn.request("session/prompt", prompt(a, "/crash /chunks 5 boom"))
        assert info.value.exit_code == 3
        assert other == [info.value]
        assert client.lost == [info.value]
        assert client.chunks(a) == ["Echo:"]  # one chunk, then the process died
        assert conn.closed and conn.returncode == 3
        assert_reaped(conn.pid)
        with pytest.raises(AgentDiedError):
            await conn.request("session/list", {})
    assert len(client.lost) == 1


async def test_agent_requests_unknown_method_and_independent_ids(
    caplog: pytest.LogCaptureFixture,
) -> None:
    child = """
        import json, sys
        def send(message):
            sys.stdout.write(json.dumps(message) + "\\n"); sys.stdout.flush()
        ours = json.loads(sys.stdin.readline())            # our request, id 0
        sys.stderr.write("hello from stderr\\n"); sys.stderr.flush()
        send({"jsonrpc": "2.0", "id": 0, "method": "terminal/create",
              "params": {"sessionId": "s", "command": "ls"}})
        send({"jsonrpc": "2.0", "id": "x-1", "method": "_vendor/thing", "params": {"sessionId": "s"}})
        answers = [json.loads(sys.stdin.readline()) for _ in range(2)]
        answers.sort(key=lambda a: str(a["id"]))
        send({"jsonrpc": "2.0", "method": "_vendor/ignored", "params": {}})
        send({"jsonrpc": "2.0", "method": "session/update",
              "params": {"sessionId": "s", "update": {"sessionUpdate": "_answers", "answers": answers},
                         "_meta": {"vendor": 1}}})
        send({"jsonrpc": "2.0", "id": ours["id"], "result": {"pong": True, "models": {"a": [1]}}})
        sys.stdin.readline()
    """
    client = FakeClient()
    with caplog.at_level(logging.INFO, logger="bridge.agents.stdio"):
        async with spawned(client, script_command(child)) as conn:
            assert await conn.request("ping", {}) == {"pong": True, "models": {"a": [1]}}
            update = client.updates[0]
            assert update["_meta"] == {"vendor": 1}  # unknown fields survive
            answers = update["update"]["answers"]
            assert answers == [
                {"jsonrpc": "2.0", "id": 0, "error": {
                    "code": -32601, "message": "Method not found", "data": {"method": "terminal/create"}}},
                {"jsonrpc": "2.0", "id": "x-1", "error": {
                    "code": -32601, "message": "Method not found", "data": {"method": "_vendor/thing"}}},
            ]
            pid = conn.pid
    assert f"[agent test pid={pid}] hello from stderr" in caplog.text
    assert_reaped(pid)


async def test_aclose_kills_a_child_ignoring_eof_and_sigterm() -> None:
    child = """
        import json, signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": "session/update",
                                     "params": {"sessionId": "ready", "update": {}}}) + "\\n")
        sys.stdout.flush()
        while True:
            time.sleep(1)
    """
    client = FakeClient()
    async with spawned(client, script_command(child), shutdown_grace_s=0.2) as conn:
        with anyio.fail_after(30):
            while not client.updates:
                await anyio.sleep(0.01)
        pending: list[BaseException] = []

        async def waiter() -> None:
            with pytest.raises(AgentDiedError) as info:
                await conn.request("never/answered", {})
            pending.append(info.value)

        with anyio.fail_after(10):   # a hang guard: stdin EOF, SIGTERM, then SIGKILL
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await anyio.sleep(0.02)
                await conn.aclose()
        assert len(pending) == 1
        assert conn.returncode == -signal.SIGKILL   # it outlived both graces
        await conn.aclose()  # idempotent
        assert_reaped(conn.pid)
        with pytest.raises(AgentDiedError):
            await conn.request("initialize", {})
    assert client.lost == []


async def test_missing_command_raises_agent_died() -> None:
    factory = StdioAgentFactory(["/nonexistent/agent-binary"])
    async with anyio.create_task_group() as tg:
        with pytest.raises(AgentDiedError, match="Cannot start agent"):
            await factory.connect(FakeClient(), tg)


async def test_the_first_answer_to_a_request_id_wins(caplog: pytest.LogCaptureFixture) -> None:
    """An agent answering one request twice (``end_turn``, then an error): the first
    answer is the result, the second is logged and changes nothing."""
    client = FakeClient()
    with caplog.at_level(logging.WARNING, logger="bridge.agents.stdio"):
        async with spawned(client, fixture_command("twice", "--answer-twice")) as conn:
            await conn.request("initialize", {"protocolVersion": 1})
            sid = await new_session(conn)
            assert await conn.request("session/prompt", prompt(sid, "one")) == {
                "stopReason": "end_turn"}
            # the next request is answered after the stray second answer was read
            assert await conn.request("session/prompt", prompt(sid, "two")) == {
                "stopReason": "end_turn"}
            assert not conn.closed
    strays = [r for r in caplog.records if "already answered request id" in r.getMessage()]
    assert len(strays) >= 1


async def test_an_agent_withdraws_a_request_it_sent() -> None:
    """``$/cancel_request`` from the agent: a request still being handled is cancelled
    and answered -32800; an unknown or malformed one is ignored; the same id as an
    integer and as a string are different requests."""
    child = """
        import json, sys
        def send(message):
            sys.stdout.write(json.dumps(message) + "\\n"); sys.stdout.flush()
        ours = json.loads(sys.stdin.readline())            # our request, id 0
        send({"jsonrpc": "2.0", "id": 7, "method": "session/request_permission",
              "params": {"sessionId": "s", "options": [{"optionId": "ok"}]}})
        send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 99}})
        send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {}})
        send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "7"}})
        send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 7}})
        answer = json.loads(sys.stdin.readline())
        send({"jsonrpc": "2.0", "method": "session/update",
              "params": {"sessionId": "s", "update": {"sessionUpdate": "_answer", "answer": answer}}})
        send({"jsonrpc": "2.0", "id": ours["id"], "result": {}})
        sys.stdin.readline()
    """
    client = FakeClient()
    client.hold_permission = True   # the handler waits until it is withdrawn
    async with spawned(client, script_command(child)) as conn:
        assert await conn.request("ping", {}) == {}
        assert client.updates[0]["update"]["answer"] == {
            "jsonrpc": "2.0", "id": 7, "error": {"code": -32800, "message": "Request cancelled"}}
        assert client.permission_finished == 0   # cancelled, never answered


async def test_an_agent_flooding_requests_is_refused_past_the_cap() -> None:
    """An agent's own requests handled at once are bounded (``max_requests_in_flight``):
    past it each is answered -32603 at once, so an agent that floods requests (even one
    that reads no answers: the reader then waits on its write) holds a bounded number of
    handlers, never the server's memory; the ones taken are answered when they end."""
    child = """
        import json, sys
        def send(message):
            sys.stdout.write(json.dumps(message) + "\\n"); sys.stdout.flush()
        ours = json.loads(sys.stdin.readline())            # our request, id 0
        for i in range(40):
            send({"jsonrpc": "2.0", "id": i, "method": "session/request_permission",
                  "params": {"sessionId": "s", "options": [{"optionId": "allow_once"}]}})
        refused = [json.loads(sys.stdin.readline()) for _ in range(24)]
        send({"jsonrpc": "2.0", "method": "session/update",
              "params": {"sessionId": "s", "update": {"sessionUpdate": "_refused",
                                                      "answers": refused}}})
        send({"jsonrpc": "2.0", "id": ours["id"], "result": {}})
        answered = [json.loads(sys.stdin.readline()) for _ in range(16)]
        send({"jsonrpc": "2.0", "method": "session/update",
              "params": {"sessionId": "s", "update": {"sessionUpdate": "_answered",
                                                      "ids": sorted(a["id"] for a in answered),
                                                      "ok": all("result" in a for a in answered)}}})
        sys.stdin.readline()
    """
    client = FakeClient()
    client.hold_permission = True
    async with spawned(client, script_command(child), max_requests_in_flight=16) as conn:
        assert await conn.request("ping", {}) == {}
        refused = client.updates[0]["update"]["answers"]
        assert [a["id"] for a in refused] == list(range(16, 40))
        assert {json.dumps(a["error"], sort_keys=True) for a in refused} == {json.dumps(
            {"code": -32603, "message": "Too many requests in flight", "data": {"limit": 16}},
            sort_keys=True)}
        assert len(client.permission_requests) == 16
        client.release.set()
        with anyio.fail_after(10):
            while len(client.updates) < 2:
                await anyio.sleep(0.01)
        assert client.updates[1]["update"] == {"sessionUpdate": "_answered",
                                               "ids": list(range(16)), "ok": True}
