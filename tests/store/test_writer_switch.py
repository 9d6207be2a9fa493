"""The store lowers the interpreter's switch interval only while its work runs on a
worker thread (``acp_server.store.writer.store_work``), and puts it back after."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from acp_server.store.writer import SWITCH_INTERVAL_S, store_work
from tests.bridge.helpers import wait_until


@pytest.fixture
def interval() -> Iterator[float]:
    saved = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield 0.005
    sys.setswitchinterval(saved)


def test_lowered_while_inside_and_put_back_by_the_last_to_leave(interval: float) -> None:
    with store_work:
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
        with store_work:
            assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
    assert sys.getswitchinterval() == pytest.approx(interval)


def test_never_raised(interval: float) -> None:
    sys.setswitchinterval(SWITCH_INTERVAL_S / 2)
    with store_work:
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S / 2)
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S / 2)


def test_threads_overlapping(interval: float) -> None:
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with store_work:
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=other)
    with store_work:
        thread.start()
        assert inside.wait(10)
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)   # the other is in
    leave.set()
    thread.join(10)
    assert sys.getswitchinterval() == pytest.approx(interval)


@pytest.mark.anyio
async def test_a_store_leaves_the_interval_as_it_found_it(tmp_path, interval: float) -> None:
    """Writes and reads through a real SQLite store, then nothing on a thread: the
    interval is back (it was lowered for the store's whole life before)."""
    from acp_server.store import store_for

    seen: list[float] = []
    async with store_for(None, state_dir=str(tmp_path)) as store:
        assert sys.getswitchinterval() == pytest.approx(interval)
        await store._write(lambda conn, events: seen.append(sys.getswitchinterval()))
        assert await store.get_task("no-such-task") is None
        # the writer's thread wakes its callers before it returns and leaves (its
        # chained batches): the interval is back once the writer task resumes
        await wait_until(lambda: sys.getswitchinterval() == pytest.approx(interval),
                         timeout=10)
    assert seen == [pytest.approx(SWITCH_INTERVAL_S)]   # on the writer's thread
    assert sys.getswitchinterval() == pytest.approx(interval)
