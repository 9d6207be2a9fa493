"""Background responses across a SIGKILL: a real ``acp-server serve`` process,
killed mid-response and started again on the same store, read through the ``openai`` SDK.

The default restart rule (``on_restart: fail``, §7.5) leaves the response that was
running ``failed`` with ``error.code: "server_restarted"``; a finished one is still
retrievable; a queued one runs after the restart. On PostgreSQL the killed
instance's leases expire first (the test lease is 3 s), then recovery applies.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
from openai import AsyncOpenAI

from tests.lmsp import stores
from tests.harness import ServeProcess
from tests.lmsp.test_background import poll

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only; the server is its own process


class Server:
    """One ``acp-server serve`` process on the given store (SQLite file or a
    PostgreSQL schema), with the test lease timings."""

    def __init__(self, store: list[str], workspace: Path, max_running: int = 2) -> None:
        workspace.mkdir(exist_ok=True)
        child = ServeProcess(workspace, *store, "--max-running-tasks", str(max_running),
                             *stores.lease_flags()).start()
        self.proc, self.url = child.process, child.base_url
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
        return ["--store", f"sqlite:///{tmp_path / 'lmsp.db'}"]
    return ["--store", stores.postgres_url_for(tmp_path, "restart")]


async def test_sigkill_then_restart_fails_the_running_response(
        tmp_path: Path, store_name: str, servers: list[Server]) -> None:
    store = store_args(tmp_path, store_name)
    first = Server(store, tmp_path / "first", max_running=1)
    servers.append(first)
    client = first.client
    done = await client.responses.create(model="reference", input="/chunks 2 kept",
                                         background=True)
    done = await poll(client, done.id, timeout=20)
    assert done.status == "completed"
    running = await client.responses.create(model="reference", input="/sleep 30s long",
                                            background=True)
    await poll(client, running.id, {"in_progress"}, timeout=20)
    queued = await client.responses.create(model="reference", input="after the restart",
                                           background=True)
    assert (await client.responses.retrieve(queued.id)).status == "queued"   # one slot
    first.kill()

    second = Server(store, tmp_path / "second")
    servers.append(second)
    client = second.client
    failed = await poll(client, running.id, timeout=20)
    assert failed.status == "failed" and failed.background is True
    assert failed.error is not None and failed.error.code == "server_restarted"
    kept = await client.responses.retrieve(done.id)
    assert kept.model_dump() == done.model_dump() and kept.output_text == "Echo: kept"
    assert kept.completed_at is not None and kept.completed_at >= kept.created_at
    assert failed.completed_at is None   # only a completed response has one
    ran = await poll(client, queued.id, timeout=20)
    assert ran.status == "completed" and ran.output_text == "Echo: after the restart"
    with pytest.raises(openai.BadRequestError):   # finished, so not cancelable
        await client.responses.cancel(running.id)
    # its history is still there to continue from
    after = await client.responses.create(model="reference", input="/history again",
                                          previous_response_id=done.id)
    assert after.output_text.splitlines() == [
        "History:", "user: /chunks 2 kept", "assistant: Echo: kept", "Echo: again"]
