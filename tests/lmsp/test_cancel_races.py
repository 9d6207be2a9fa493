"""Property: cancel racing completion and failure at random points (§7.2, §7.3).

Whatever the interleaving: exactly one terminal event, last; the task's final status
agrees with it; cancel answers 200 (then the task ends ``cancelled``) or 409
``task_not_cancelable`` (then it had ``succeeded``/``failed``, as reported).
Drives the service directly (the route maps ``LmspError`` 1:1; see test_tasks).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acp_server.lmsp import open_lmsp
from acp_server.lmsp.problems import LmspError
from acp_server.lmsp.requests import parse_task_envelope
from acp_server.principals import LOCAL_CALLER
from bridge import Bridge
from bridge.agents.reference import ReferenceAgentFactory
from tests.lmsp.server import envelope
from tests.lmsp.stores import SKIP_POSTGRES, STORE_FACTORIES, postgres_dsn

FINAL = {"response.completed": "succeeded", "response.incomplete": "succeeded",
         "response.failed": "failed", "response.cancelled": "cancelled"}


async def scenario(store_name: str, ending: str, sleep_ms: int, chunks: int,
                   cancel_at_ms: list[float], running: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = STORE_FACTORIES[store_name](Path(tmp), "lmsp", True)
        async with Bridge(ReferenceAgentFactory(), workspace_cwd=tmp) as bridge, \
                open_lmsp(bridge, state_dir=tmp, max_running_tasks=running,
                          store=store) as service:
            text = f"/sleep {sleep_ms}ms /chunks {chunks} {ending} words here"
            body = envelope(text)
            parsed = parse_task_envelope(body)
            record, _ = await service.create_task(parsed.request, on_restart="fail",
                                                  key=None, route="test", caller=LOCAL_CALLER)
            answers: list[tuple[int, str]] = []
            start = time.monotonic()
            for at in sorted(cancel_at_ms):
                await anyio.sleep(max(0.0, start + at / 1000 - time.monotonic()))
                try:
                    answered = await service.cancel(record.id)
                    answers.append((200, answered.status))
                except LmspError as exc:
                    assert exc.code == "task_not_cancelable" and exc.status == 409
                    answers.append((409, exc.extensions["task_status"]))
            with anyio.fail_after(10):
                final = await service.wait_terminal(record.id)
            events = await service.store.read_events(record.id, -1, 1000)
            assert [e.seq for e in events] == list(range(len(events)))
            terminal = [e for e in events if e.type in FINAL]
            assert len(terminal) == 1 and terminal[0] is events[-1]
            assert FINAL[terminal[0].type] == final.status
            for code, status in answers:
                if code == 200:
                    assert status in ("cancelling", "cancelled")
                    assert final.status == "cancelled"
                else:
                    assert status == final.status and status in ("succeeded", "failed")
            if answers and answers[0][0] == 409:   # once finished, always 409
                assert all(code == 409 for code, _ in answers)


@pytest.mark.parametrize("store_name", [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.skipif(postgres_dsn() is None, reason=SKIP_POSTGRES)),
])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ending=st.sampled_from(["", "/fail", "/refuse", "/max_tokens"]),
       sleep_ms=st.integers(0, 30), chunks=st.integers(1, 80),
       cancel_at_ms=st.lists(st.floats(0, 60), min_size=1, max_size=3),
       running=st.sampled_from([0, 1, 4]))
def test_cancel_races(store_name: str, backend: str, ending: str, sleep_ms: int, chunks: int,
                      cancel_at_ms: list[float], running: int) -> None:
    anyio.run(scenario, store_name, ending, sleep_ms, chunks, cancel_at_ms, running,
              backend=backend)
