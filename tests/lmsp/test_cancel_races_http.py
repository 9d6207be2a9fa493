"""Property over real HTTP: ``POST …/cancel`` racing completion and failure (§7.3).

One server (uvicorn, asyncio, its own thread) serves every example; each example is a
client on the parametrized backend. Cancel answers 200 (the task then ends
``cancelled``) or 409 ``task_not_cancelable`` (it had ``succeeded``/``failed``, as the
problem says); the event log has exactly one terminal event, last, matching the task.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.lmsp.server import envelope, running_lmsp

FINAL = {"response.completed": "succeeded", "response.incomplete": "succeeded",
         "response.failed": "failed", "response.cancelled": "cancelled"}


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("races")
    urls: queue.Queue[str] = queue.Queue(maxsize=1)
    stop = threading.Event()

    async def serve() -> None:
        async with running_lmsp(tmp, max_running_tasks=4) as srv:
            urls.put(srv.base_url)
            while not stop.is_set():
                await anyio.sleep(0.05)

    thread = threading.Thread(target=anyio.run, args=(serve,), daemon=True)
    thread.start()
    yield urls.get(timeout=10)
    stop.set()
    thread.join(10)


async def scenario(url: str, text: str, cancel_at_ms: list[float]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        created = await client.post("/lmsp/v1/tasks", json=envelope(text))
        assert created.status_code == 202
        task_id = created.json()["id"]
        answers: list[tuple[int, Any]] = []
        start = time.monotonic()
        for at in sorted(cancel_at_ms):
            await anyio.sleep(max(0.0, start + at / 1000 - time.monotonic()))
            response = await client.post(f"/lmsp/v1/tasks/{task_id}/cancel")
            answers.append((response.status_code, response.json()))
        with anyio.fail_after(10):
            while (task := (await client.get(f"/lmsp/v1/tasks/{task_id}")).json())[
                    "status"] not in ("succeeded", "failed", "cancelled"):
                await anyio.sleep(0.005)
        stream = await client.get(f"/lmsp/v1/tasks/{task_id}/events")
        events = [json.loads(line[6:]) for line in stream.text.splitlines()
                  if line.startswith("data: ")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    terminal = [e for e in events if e["type"] in FINAL]
    assert len(terminal) == 1 and terminal[0] is events[-1]
    assert FINAL[terminal[0]["type"]] == task["status"]
    assert terminal[0]["response"]["status"] in (
        ("completed", "incomplete") if task["status"] == "succeeded" else (task["status"],))
    for status, body in answers:
        if status == 200:
            assert body["status"] in ("cancelling", "cancelled")
            assert task["status"] == "cancelled"
        else:
            assert status == 409 and body["code"] == "task_not_cancelable"
            assert body["task_status"] == task["status"] in ("succeeded", "failed")
    codes = [status for status, _ in answers]
    assert codes == sorted(codes)   # once 409, always 409; once 200, never 409
    event(f"cancel {codes[0]} -> {task['status']}")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ending=st.sampled_from(["", "/fail", "/refuse", "/max_tokens"]),
       sleep_ms=st.integers(0, 25), chunks=st.integers(1, 60),
       cancel_at_ms=st.lists(st.floats(0, 50), min_size=1, max_size=3))
def test_cancel_races_over_http(server_url: str, backend: str, ending: str, sleep_ms: int,
                                chunks: int, cancel_at_ms: list[float]) -> None:
    text = f"/sleep {sleep_ms}ms /chunks {chunks} {ending} some words here"
    anyio.run(scenario, server_url, text, cancel_at_ms, backend=backend)
