"""The store lowers the interpreter's switch interval only while its work runs on a
worker thread (``acp_server.store.writer.store_work``), and puts it back after."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from acp_server.store.errors import StoreUnavailableError
from acp_server.store.switching import SWITCH_INTERVAL_S, store_work
from acp_server.store.writer import Op
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


# -- the parked writer thread on every path (both engines, both anyio backends) ----------

def _store(tmp_path: Any, name: str, *, writers: int | None = None) -> Any:
    from tests.lmsp import stores

    store = stores.STORE_FACTORIES[name](tmp_path, "w", True)
    if writers is not None:   # PostgreSQL: ``writers`` loops (set before ``open``)
        store.writers = writers
        store._write_limiter = anyio.CapacityLimiter(writers + 1)
    return store


def _noop(conn: Any, out: Any, *state: Any) -> None:
    return None


def _held_until_gate() -> tuple[Any, threading.Event, threading.Event]:
    """An operation that holds the writer's thread (``started`` set) until ``gate`` is
    set, then returns "held"."""
    started, gate = threading.Event(), threading.Event()

    def held(conn: Any, out: Any, *state: Any) -> str:
        started.set()
        gate.wait(10)
        return "held"

    return held, started, gate


def _settled_cleanly(store: Any) -> None:
    """The writer left no store work behind and its threads gave back their tokens."""
    assert store_work._inside == 0
    assert store._write_limiter.borrowed_tokens == 0


@pytest.mark.anyio
async def test_an_on_commit_that_raises_is_logged_and_the_writer_goes_on(
        tmp_path: Any, store_name: str, interval: float,
        caplog: pytest.LogCaptureFixture) -> None:
    def broken(events: Any) -> None:
        raise RuntimeError("on_commit bug")

    store = _store(tmp_path, store_name)
    store.on_commit = broken
    with anyio.fail_after(20):
        async with store:
            assert await store._write(lambda conn, out, *s: out.append("x") or 1) == 1
            assert await store._write(lambda conn, out, *s: out.append("y") or 2) == 2
            await wait_until(lambda: store_work._inside == 0, timeout=10)
    assert "the on_commit hook failed" in caplog.text
    _settled_cleanly(store)
    assert sys.getswitchinterval() == pytest.approx(interval)


@pytest.mark.anyio
async def test_a_prepare_that_raises_fails_only_its_own_operation(
        tmp_path: Any, store_name: str, interval: float) -> None:
    """Once in the writer task's batch (the thread parked), once in the batch the
    thread takes after settling one (``_settle_then_next``): the operation whose
    ``prepare`` raised gets the error, the others in its batch commit."""
    def broken() -> None:
        raise RuntimeError("prepare bug")

    held, started, gate = _held_until_gate()

    outcomes: dict[str, Any] = {}

    def queue(name: str, fn: Any = _noop, prepare: Any = None) -> None:
        op = Op(fn, prepare=prepare,
                on_done=lambda op: outcomes.__setitem__(name, op.error or op.result))
        assert store.submit(op)

    store = _store(tmp_path, store_name)
    with anyio.fail_after(20):
        async with store:
            queue("bad first", prepare=broken)   # the writer task's batch
            queue("good first", lambda conn, out, *s: "ok")
            await wait_until(lambda: len(outcomes) == 2)
            queue("held", held)
            await wait_until(started.is_set)     # the thread runs ``held``
            queue("bad next", prepare=broken)    # queued meanwhile: the thread's batch
            queue("good next", lambda conn, out, *s: "ok")
            gate.set()
            await wait_until(lambda: len(outcomes) == 5)
            assert await store._write(lambda conn, out, *s: 3) == 3
    assert isinstance(outcomes.pop("bad first"), RuntimeError)
    assert isinstance(outcomes.pop("bad next"), RuntimeError)
    assert outcomes == {"good first": "ok", "held": "held", "good next": "ok"}
    _settled_cleanly(store)
    assert sys.getswitchinterval() == pytest.approx(interval)


@pytest.mark.anyio
async def test_every_operation_failing_its_prepare_leaves_the_writer_serving(
        tmp_path: Any, store_name: str) -> None:
    def broken() -> None:
        raise RuntimeError("prepare bug")

    errors: list[Any] = []
    store = _store(tmp_path, store_name)
    with anyio.fail_after(20):
        async with store:
            for _ in range(3):
                assert store.submit(Op(_noop, prepare=broken,
                                       on_done=lambda op: errors.append(op.error)))
            await wait_until(lambda: len(errors) == 3)
            assert await store._write(lambda conn, out, *s: 4) == 4
    assert all(isinstance(e, RuntimeError) for e in errors)
    _settled_cleanly(store)


@pytest.mark.anyio
async def test_closing_with_operations_queued_settles_them_all(
        tmp_path: Any, store_name: str) -> None:
    done: list[Any] = []
    store = _store(tmp_path, store_name)
    with anyio.fail_after(20):
        async with store:
            for _ in range(50):
                assert store.submit(Op(lambda conn, out, *s: conn.execute("SELECT 1"),
                                       on_done=lambda op: done.append(op.error)))
    assert len(done) == 50 and not any(done)
    _settled_cleanly(store)


@pytest.mark.anyio
async def test_cancelling_the_task_group_with_operations_queued_ends_the_thread(
        tmp_path: Any, store_name: str) -> None:
    """The enclosing task group is cancelled while operations are queued: the store
    still closes (its thread parks, is told to end and gives its token back), with no
    store work left behind, and a new store on the same data serves. On PostgreSQL the
    closing releases the instance's leases, a write: the writer loops serve it though
    the store's scope is cancelled (they were cancelled with it, and the release then
    waited for ever about one run in eight)."""
    store = _store(tmp_path, store_name)
    queued = anyio.Event()

    async def serve() -> None:
        async with store:
            for _ in range(20):
                assert store.submit(Op(_noop))
            queued.set()
            await anyio.sleep_forever()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            await queued.wait()
            tg.cancel_scope.cancel()
    _settled_cleanly(store)
    again = _store(tmp_path, store_name)
    with anyio.fail_after(20):
        async with again:
            assert await again._write(lambda conn, out, *s: 5) == 5
    _settled_cleanly(again)


@pytest.mark.anyio
async def test_an_engine_error_mid_batch_then_a_good_write(tmp_path: Any,
                                                           store_name: str) -> None:
    store = _store(tmp_path, store_name)
    with anyio.fail_after(20):
        async with store:
            with pytest.raises(Exception):   # noqa: B017 - the engine's own error type
                await store._write(lambda conn, out, *s: conn.execute("SELEC nonsense"))
            assert await store._write(lambda conn, out, *s: 7) == 7
            assert store.health.up
    _settled_cleanly(store)


@pytest.mark.anyio
async def test_postgres_two_writers_under_writes_and_reads_then_close_with_ops_queued(
        tmp_path: Any) -> None:
    from tests.lmsp import stores

    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    store = _store(tmp_path, "postgres", writers=2)
    done: list[Any] = []
    with anyio.fail_after(30):
        async with store:
            assert store._write_limiter.borrowed_tokens == 3   # 2 writers + the listener

            async def write(n: int) -> None:
                assert await store._write(lambda conn, out, *s: n) == n

            async def read() -> None:
                assert await store._read(
                    lambda conn: conn.execute("SELECT 1").fetchone()[0]) == 1

            async with anyio.create_task_group() as tg:
                for n in range(60):
                    tg.start_soon(write, n)
                    tg.start_soon(read)
            for _ in range(100):
                assert store.submit(Op(_noop, on_done=lambda op: done.append(op.error)))
    assert len(done) == 100 and not any(done)
    _settled_cleanly(store)


# -- a bug in the writer's own settling never leaves a caller or the close waiting ---------


@pytest.mark.anyio
async def test_a_settling_bug_still_wakes_every_caller(
        tmp_path: Any, store_name: str, interval: float,
        caplog: pytest.LogCaptureFixture) -> None:
    """``_outcomes`` (classification, health, ``on_commit``) raises once: the batch's
    callers are woken all the same, the writer goes on, the store closes."""
    store = _store(tmp_path, store_name)
    real, broken = store._outcomes, [True]

    def outcomes(batch: Any) -> None:
        if broken.pop() if broken else False:
            raise RuntimeError("settle bug")
        real(batch)

    store._outcomes = outcomes
    with anyio.fail_after(20):
        async with store:
            assert await store._write(lambda conn, out, *s: 1) == 1
            assert await store._write(lambda conn, out, *s: 2) == 2
            await wait_until(lambda: store_work._inside == 0, timeout=10)
    assert "settling a batch failed" in caplog.text
    _settled_cleanly(store)
    assert sys.getswitchinterval() == pytest.approx(interval)


class _Exit(BaseException):
    """Not an engine's error: what a worker thread might see from an operation."""


def _break_settle(store: Any, times: int | None) -> None:
    """``store._settle`` raises for a batch holding a "doomed" result, ``times`` times
    (``None``: every time): a bug on the writer's thread's hop into the loop."""
    real, left = store._settle, [times]

    def settle(batch: Any) -> None:
        if left[0] != 0 and any(op.result == "doomed" for op in batch):
            if left[0] is not None:
                left[0] -= 1
            raise RuntimeError("settle bug")
        real(batch)

    store._settle = settle


@pytest.mark.anyio
async def test_a_writer_thread_that_fails_is_replaced(
        tmp_path: Any, store_name: str, interval: float,
        caplog: pytest.LogCaptureFixture) -> None:
    """``_settle`` itself raises once, on the writer's thread's hop into the loop: the
    thread ends. Its batch ran, so its callers get their own outcomes (woken without
    the broken settling), a new thread serves the next write, and the store closes."""
    store = _store(tmp_path, store_name)
    _break_settle(store, 1)
    with anyio.fail_after(20):
        async with store:
            assert await store._write(lambda conn, out, *s: "doomed") == "doomed"
            assert await store._write(lambda conn, out, *s: 3) == 3
            assert store.health.up
            await wait_until(lambda: store_work._inside == 0, timeout=10)
    assert "its thread failed" in caplog.text
    _settled_cleanly(store)
    assert sys.getswitchinterval() == pytest.approx(interval)


@pytest.mark.anyio
async def test_a_writer_left_without_a_thread_fails_fast_and_still_closes(
        tmp_path: Any, store_name: str) -> None:
    """The thread fails twice with no batch settled in between: no new thread. What
    is queued then fails at once, and the close (on PostgreSQL, a write: the
    leases' release) does not wait for a writer that is gone."""
    store = _store(tmp_path, store_name)
    _break_settle(store, None)
    with anyio.fail_after(20):
        async with store:
            for _ in range(2):
                assert await store._write(lambda conn, out, *s: "doomed") == "doomed"
            with pytest.raises(StoreUnavailableError, match="writer stopped"):
                await store._write(lambda conn, out, *s: 4)
            assert not store.health.up
    _settled_cleanly(store)


@pytest.mark.anyio
async def test_operations_gathered_when_the_thread_fails_are_failed_not_lost(
        tmp_path: Any, store_name: str) -> None:
    """The thread's hop takes the next batch off the queue, then raises: the
    operations it took are failed ("not written"), never left waiting."""
    store = _store(tmp_path, store_name)
    real = store._gather

    def gather(first: Any, into: list[Any]) -> Any:
        batch = real(first, into)
        if any(op.bulk == "victim" for op in batch):
            raise RuntimeError("bug after gather")
        return batch

    store._gather = gather
    held, started, gate = _held_until_gate()

    outcomes: dict[str, Any] = {}
    with anyio.fail_after(20):
        async with store:
            assert store.submit(Op(held, on_done=lambda op: outcomes.__setitem__(
                "held", op.result)))
            await wait_until(started.is_set)
            assert store.submit(Op(_noop, bulk="victim", on_done=lambda op: outcomes.__setitem__(
                "victim", op.error)))
            gate.set()
            await wait_until(lambda: len(outcomes) == 2)
            assert await store._write(lambda conn, out, *s: 3) == 3
    assert outcomes["held"] == "held"
    assert isinstance(outcomes["victim"], StoreUnavailableError)
    assert "not written" in str(outcomes["victim"])
    _settled_cleanly(store)


@pytest.mark.anyio
async def test_a_base_exception_in_a_batch_fails_it_and_rolls_back(
        tmp_path: Any, store_name: str, interval: float) -> None:
    """An operation raises a ``BaseException`` (not an engine error) in the worker
    thread: its batch fails with an unknown outcome, the transaction is rolled back
    (the next write commits), the thread goes on, and nothing stays entered."""
    def exits(conn: Any, out: Any, *state: Any) -> None:
        raise _Exit()

    store = _store(tmp_path, store_name)
    with anyio.fail_after(20):
        async with store:
            with pytest.raises(StoreUnavailableError, match="outcome is unknown"):
                await store._write(exits)
            assert await store._write(lambda conn, out, *s: 4) == 4
            await wait_until(lambda: store_work._inside == 0, timeout=10)
    _settled_cleanly(store)
    assert sys.getswitchinterval() == pytest.approx(interval)


@pytest.mark.anyio
async def test_postgres_one_of_two_writers_gone_leaves_the_other_serving(
        tmp_path: Any) -> None:
    """Writer 0's thread fails at once, twice: it is gone, and its loop stops taking
    operations, so writer 1 serves every write after the first (no 503s)."""
    from tests.lmsp import stores

    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    store = _store(tmp_path, "postgres", writers=2)
    real = store._run_batches

    def run_batches(index: int, park: Any, waiter: Any, held: Any) -> None:
        if index == 0:
            waiter.result()   # take a batch, then die (a bug)
            raise RuntimeError("writer 0 bug")
        real(index, park, waiter, held)

    store._run_batches = run_batches
    failed = 0
    with anyio.fail_after(60):
        async with store:
            for n in range(100):
                try:
                    assert await store._write(lambda conn, out, *s, n=n: n) == n
                except StoreUnavailableError:
                    failed += 1
            await wait_until(lambda: store._live_writers == 1, timeout=10)
            assert store.health.up
    assert failed <= 2   # the batches writer 0 held when its thread died
    _settled_cleanly(store)
