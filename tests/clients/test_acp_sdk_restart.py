"""The ACP TypeScript SDK (``@agentclientprotocol/sdk``) across a ``kill -9`` of a real
``acp-server serve`` (issue #23): a client that ``session/load``s after the restart, on
a fresh Streamable HTTP or WebSocket connection, gets the whole history (asserted on
what its ``session/update`` handler received), then prompts on."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import pytest

from tests.clients.node import HERE, node_command, run_script
from tests.harness import ServeProcess, free_port

pytestmark = [pytest.mark.anyio, pytest.mark.clients]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client is Node; the server is its own process


async def _line(process: anyio.abc.Process) -> str:
    """The first line the process prints."""
    assert process.stdout is not None
    seen = b""
    with anyio.fail_after(60):
        while not seen.endswith(b"\n"):
            seen += await process.stdout.receive()
    return seen.decode()


def _texts(log: list[dict[str, Any]], kind: str) -> list[str]:
    return [e["text"] for e in log if e["kind"] == "update" and e["sessionUpdate"] == kind]


async def test_acp_sdk_client_loads_the_whole_history_after_kill_9(acp_sdk: str,
                                                                   tmp_path: Path) -> None:
    child = ServeProcess(tmp_path, "--port", str(free_port()))
    await anyio.to_thread.run_sync(child.start)
    makers: list[anyio.abc.Process] = []
    try:
        made: dict[str, str] = {}
        for transport in ("http", "ws"):   # their connections stay open through the kill
            maker = await anyio.open_process([*node_command(), str(HERE / "acp_sdk_reload.mjs"),
                                              acp_sdk, child.base_url, transport,
                                              str(tmp_path), "make"])
            makers.append(maker)
            made[transport] = json.loads(await _line(maker))["sessionId"]
        await anyio.to_thread.run_sync(child.kill)   # SIGKILL: no drain, no clean stop
        for maker in makers:
            # a maker may already have exited on its dropped connection (seen under load)
            with contextlib.suppress(ProcessLookupError):
                maker.kill()
            await maker.wait()
        await anyio.to_thread.run_sync(child.start)
        for transport, sid in made.items():
            log = (await run_script("acp_sdk_reload.mjs", acp_sdk, child.base_url, transport,
                                    str(tmp_path), "load", sid))["log"]
            users = [i for i, e in enumerate(log) if e["kind"] == "update"
                     and e["sessionUpdate"] == "user_message_chunk"]
            history, after = log[:users[2]], log[users[2]:]
            assert _texts(history, "user_message_chunk") == ["/chunks 2 before one",
                                                             "before two"], transport
            assert "".join(_texts(history, "agent_message_chunk")) == (
                "Echo: before oneEcho: before two"), transport
            assert _texts(after, "user_message_chunk") == ["after"]
            assert "".join(_texts(after, "agent_message_chunk")) == "Echo: after"
            assert after[-1] == {"kind": "stop", "stopReason": "end_turn"}
            if transport == "ws":   # one socket: the history strictly before the answer
                assert log[users[2] - 1] == {"kind": "load_result"}
    finally:
        for maker in makers:
            if maker.returncode is None:
                maker.kill()
                await maker.wait()
        await anyio.to_thread.run_sync(child.stop)
