"""The one bounded FIFO and the re-armable wake-up (``bridge.fifo``, ``bridge.wakeup``)."""

from __future__ import annotations

import anyio
import pytest

from bridge.fifo import BoundedFifo
from bridge.wakeup import Wakeup

pytestmark = pytest.mark.anyio


async def test_bounded_in_items_and_in_bytes_besides_the_newest() -> None:
    fifo: BoundedFifo[str] = BoundedFifo(max_items=3, max_bytes=10)
    assert fifo.put_nowait("a", 4) and fifo.put_nowait("b", 6)
    assert fifo.put_nowait("c", 50)          # 10 bytes before it: still accepted
    assert fifo.overflow() == "items"
    assert not fifo.put_nowait("d", 1)
    assert fifo.get_nowait() == "a"
    assert fifo.overflow() == "bytes" and not fifo.put_nowait("d", 1)   # 56 bytes queued
    assert fifo.take_all() == ["b", "c"] and fifo.items == fifo.nbytes == 0
    assert fifo.put_nowait("huge", 1000)     # alone, larger than the bound, accepted


async def test_uncounted_items_take_no_room_and_keep_their_place() -> None:
    fifo: BoundedFifo[str] = BoundedFifo(max_items=1, max_bytes=None)
    assert fifo.put_uncounted("replay-1") and fifo.put_nowait("live", 5)
    assert fifo.put_uncounted("control") and not fifo.put_nowait("more", 5)
    assert [fifo.get_nowait() for _ in range(4)] == ["replay-1", "live", "control", None]
    assert fifo.items == 0 and fifo.nbytes == 0


async def test_wait_never_consumes_and_ends_after_close_and_drain() -> None:
    fifo: BoundedFifo[int] = BoundedFifo(max_items=None, max_bytes=None)
    with anyio.move_on_after(0.01):   # a cancelled wait loses nothing
        await fifo.wait()
    fifo.put_nowait(1, 1)
    assert await fifo.wait() and await fifo.wait()
    fifo.close()
    assert not fifo.put_nowait(2, 1) and not fifo.put_uncounted(2)
    assert await fifo.wait() and fifo.get_nowait() == 1
    assert not await fifo.wait() and fifo.ended


async def test_one_wakeup_serves_a_reader_of_two_fifos() -> None:
    ready = Wakeup()
    first: BoundedFifo[str] = BoundedFifo(None, None, wakeup=ready)
    second: BoundedFifo[str] = BoundedFifo(None, None, wakeup=ready)
    got: list[str] = []

    async def reader() -> None:
        while len(got) < 2:
            for fifo in (first, second):
                item = fifo.get_nowait()
                if item is not None:
                    got.append(item)
                    break
            else:
                await ready.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        await anyio.wait_all_tasks_blocked()
        assert ready.waiting
        second.put_nowait("from second", 1)
        await anyio.wait_all_tasks_blocked()
        first.put_nowait("from first", 1)
    assert got == ["from second", "from first"]


async def test_wakeup_is_edge_triggered_and_rearms() -> None:
    wakeup = Wakeup()
    wakeup.set()                          # nobody waits: not remembered
    assert not wakeup.waiting
    woken = 0

    async def waiter() -> None:
        nonlocal woken
        for _ in range(2):
            await wakeup.wait()
            woken += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        for expected in (1, 2):
            await anyio.wait_all_tasks_blocked()
            wakeup.set()
            await anyio.wait_all_tasks_blocked()
            assert woken == expected
