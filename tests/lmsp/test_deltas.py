"""``acp_server.lmsp.deltas.DeltaWriter`` over a store that records its writes."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from acp_server.lmsp import deltas
from acp_server.lmsp.deltas import FLUSH_EVENTS, FLUSH_S, DeltaWriter

pytestmark = pytest.mark.anyio


class _Store:
    def __init__(self) -> None:
        self.writes: list[tuple[str, list[Any]]] = []
        self.wrote = anyio.Event()

    async def transition(self, task_id: str, from_states: Any, to: str, finish: Any,
                         *, now: float) -> object:
        self.writes.append((to, list(finish.events)))
        self.wrote.set()
        return object()

    async def append_events(self, task_id: str, events: list[Any], states: Any) -> None:
        self.writes.append(("events", list(events)))
        self.wrote.set()


def _writer(store: _Store) -> DeltaWriter:
    return DeltaWriter(store, "task_1", "opening", clock=lambda: 0.0)  # type: ignore[arg-type]


async def test_a_turn_that_ends_before_the_writer_runs_makes_no_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = _Store()
    made = []
    real = anyio.Event

    def counted() -> anyio.Event:
        made.append(1)
        return real()

    monkeypatch.setattr(deltas.anyio, "Event", counted)
    writer = _writer(store)
    await writer.add(["a", "b"])
    writer.hold_tail = True
    writer.close()
    assert made == [] and store.writes == [] and writer.pending == ["a", "b"]


async def test_events_added_before_the_run_are_written_with_the_opening() -> None:
    store = _Store()
    writer = _writer(store)
    await writer.add(["a"])
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run, True)
        await store.wrote.wait()
        await writer.add(["b"])
        writer.close()
    assert store.writes == [("running", ["opening", "a"]), ("events", ["b"])]
    assert writer.opened and not writer.lost


async def test_a_full_batch_before_the_run_is_written_without_waiting_flush_s() -> None:
    store = _Store()
    writer = _writer(store)
    await writer.add(list(range(FLUSH_EVENTS)))
    with anyio.fail_after(FLUSH_S * 20):   # not due: only the full batch starts it
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.run, False)
            await store.wrote.wait()
            writer.close()
    assert store.writes[0] == ("running", ["opening", *range(FLUSH_EVENTS)])


async def test_a_turn_that_ended_while_running_leaves_its_tail() -> None:
    store = _Store()
    writer = _writer(store)
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run, True)
        await store.wrote.wait()
        await writer.add(["x", "y"])
        writer.hold_tail = True
        writer.close()
    assert store.writes == [("running", ["opening"])]
    assert writer.tail == ["x", "y"]
