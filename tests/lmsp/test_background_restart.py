"""Background responses across a SIGKILL: a real server process (``tests.lmsp.launcher``),
killed mid-response and started again on the same store, read through the ``openai`` SDK.

The default restart rule (``on_restart: fail``, §7.5) leaves the response that was
running ``failed`` with ``error.code: "server_restarted"``; a finished one is still
retrievable; a queued one runs after the restart. On PostgreSQL the killed
instance's leases expire first (the test lease is 3 s), then recovery applies.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest
from openai import AsyncOpenAI

from tests.lmsp import stores

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
FINAL = {"completed", "incomplete", "failed", "cancelled"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only; the server is its own process


class Server:
    """One ``tests.lmsp.launcher`` process on the given store (SQLite file or a
    PostgreSQL schema), with the test lease timings."""

    def __init__(self, store: list[str], workspace: Path, max_running: int = 2) -> None:
        workspace.mkdir(exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.lmsp.launcher", *store, "--workspace",
             str(workspace), "--max-running-tasks", str(max_running),
             "--lease-s", str(stores.TEST_LEASE_S), "--renew-s", str(stores.TEST_RENEW_S),
             "--poll-s", str(stores.TEST_POLL_S)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("LMSP_PORT "), line
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        self.client = AsyncOpenAI(base_url=f"{self.url}/lmsp/v1", api_key="unused",
                                  max_retries=0)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    async def aclose(self) -> None:
        self.kill()
        await self.client.close()


@pytest.fixture
async def servers() -> AsyncIterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        await server.aclose()


def store_args(tmp_path: Path, store_name: str) -> list[str]:
    if store_name == "sqlite":
        return ["--db", str(tmp_path / "lmsp.db")]
    return ["--store", stores.postgres_url_for(tmp_path, "restart")]


async def poll(client: AsyncOpenAI, response_id: str, statuses: set[str] = FINAL,
               timeout: float = 20) -> Any:
    with anyio.fail_after(timeout):
        while True:
            response = await client.responses.retrieve(response_id)
            if response.status in statuses:
                return response
            await anyio.sleep(0.05)


async def test_sigkill_then_restart_fails_the_running_response(
        tmp_path: Path, store_name: str, servers: list[Server]) -> None:
    store = store_args(tmp_path, store_name)
    first = Server(store, tmp_path / "first", max_running=1)
    servers.append(first)
    client = first.client
    done = await client.responses.create(model="reference", input="/chunks 2 kept",
                                         background=True)
    done = await poll(client, done.id)
    assert done.status == "completed"
    running = await client.responses.create(model="reference", input="/sleep 30s long",
                                            background=True)
    await poll(client, running.id, {"in_progress"})
    queued = await client.responses.create(model="reference", input="after the restart",
                                           background=True)
    assert (await client.responses.retrieve(queued.id)).status == "queued"   # one slot
    first.kill()

    second = Server(store, tmp_path / "second")
    servers.append(second)
    client = second.client
    failed = await poll(client, running.id)
    assert failed.status == "failed" and failed.background is True
    assert failed.error is not None and failed.error.code == "server_restarted"
    kept = await client.responses.retrieve(done.id)
    assert kept.model_dump() == done.model_dump() and kept.output_text == "Echo: kept"
    ran = await poll(client, queued.id)
    assert ran.status == "completed" and ran.output_text == "Echo: after the restart"
    with pytest.raises(openai.BadRequestError):   # finished, so not cancelable
        await client.responses.cancel(running.id)
    # its history is still there to continue from
    after = await client.responses.create(model="reference", input="/history again",
                                          previous_response_id=done.id)
    assert after.output_text.splitlines() == [
        "History:", "user: /chunks 2 kept", "assistant: Echo: kept", "Echo: again"]
