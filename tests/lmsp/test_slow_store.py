"""A store slow mid-turn (a long fsync, a lock, an outage) while a task's agent streams:
the runner's reader waits for its writer, the bus evicts its subscription, and the
runner reads on from the last event it read, replayed from the session's ring; the
task ends with all of its output. When the ring no longer has those events, the task
fails (``output_lost``) instead of completing with part of its output missing.
(helper-48's review: it ended ``completed`` with the output cut.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_server.store.sqlite import SqliteTaskStore
from bridge import BridgeOptions
from tests.lmsp.server import running_lmsp

pytestmark = pytest.mark.anyio
CHUNKS = 9000


class SlowStore(SqliteTaskStore):
    """The task's writes wait for ``gate`` (set by the test)."""

    gate: anyio.Event | None = None

    async def append_events(self, task_id: str, events: Any, while_states: Any) -> Any:
        if self.gate is not None:
            await self.gate.wait()
        return await super().append_events(task_id, events, while_states)

    async def transition(self, task_id: str, from_states: Any, to_state: str,
                         finish: Any = None, *, now: float) -> Any:
        if self.gate is not None and to_state == "running":
            await self.gate.wait()
        return await super().transition(task_id, from_states, to_state, finish, now=now)


async def _run(tmp_path: Path, **flags: Any) -> dict[str, Any]:
    store = SlowStore(str(tmp_path / "lmsp.sqlite3"))
    store.gate = anyio.Event()
    async with running_lmsp(tmp_path, store=store, **flags) as srv:
        task = await srv.create(f"/chunks {CHUNKS} " + "a" * CHUNKS)
        # until the agent published every chunk: more than the runner's reader may
        # hold (its queue and its writer's pending events), so the bus evicted it
        with anyio.fail_after(30):
            while not any(s.bus.last_event_id >= CHUNKS for s in srv.bridge.sessions()):
                await anyio.sleep(0.01)
        store.gate.set()
        return await srv.wait(task["id"], timeout=60)  # type: ignore[no-any-return]


async def test_the_runner_reads_on_after_its_reader_was_evicted(tmp_path: Path) -> None:
    done = await _run(tmp_path)
    assert done["status"] == "succeeded" and done["response"]["status"] == "completed"
    text = done["response"]["output"][0]["content"][0]["text"]
    assert text == "Echo: " + "a" * CHUNKS   # nothing missing


async def test_output_past_the_ring_fails_the_task(tmp_path: Path) -> None:
    # (the in-memory journal: with the durable one a publisher is held back to its
    # readers, a quarter ring ahead at most, and nothing is evicted)
    done = await _run(tmp_path, session_journal="memory",
                      options=BridgeOptions(event_ring_size=200))
    assert done["status"] == "failed"
    assert done["error"]["code"] == "output_lost"
