"""Store calls an asker waits for at most a while, run where a hung store holds no one.

    bounded = BoundedCalls()          # the store's; ``tg`` set while the store is open
    counts = await bounded.ask("status_counts", store.status_counts, 1.0)  # or TimeoutError

A store can hang rather than fail: a PostgreSQL paused (SIGSTOP) or behind a network
gone silent keeps its TCP connections open, and a statement on them never returns (no
timeout of the engine's fires). A read runs on a worker thread, which cancelling the
asker cannot stop, so ``move_on_after`` around it waited as long as the store: the
operator's own checks (``/health?deep=1``, ``/metrics``) hung with it. (The PostgreSQL
engine now gives such a statement up itself, after its own bound: ``pg_answers``; the
checks answer within their shorter timeout all the same.)

Contracts: ``ask(key, call, timeout)`` runs ``call()`` in the store's task group and
waits for it at most ``timeout`` seconds, then raises ``TimeoutError``; the call goes
on, and its outcome is the answer of every asker of ``key`` while it runs: asking
again while it hangs starts nothing more (one call per key, so a hung store costs one
thread per key, not one per ask). What ``call`` raises reaches each asker. Before the
store is open (no task group), ``call`` is awaited in the asker's task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from anyio.abc import TaskGroup

T = TypeVar("T")


class _Call:
    __slots__ = ("done", "error", "result", "returned")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.result: Any = None
        self.returned = False   # not when the store's task group was cancelled (closing)
        self.error: BaseException | None = None


class BoundedCalls:
    def __init__(self) -> None:
        self.tg: TaskGroup | None = None
        self._running: dict[str, _Call] = {}

    async def ask(self, key: str, call: Callable[[], Awaitable[T]], timeout: float) -> T:
        if self.tg is None:
            return await call()
        pending = self._running.get(key)
        if pending is None:
            pending = self._running[key] = _Call()
            self.tg.start_soon(self._run, key, pending, call)
        with anyio.move_on_after(timeout):
            await pending.done.wait()
        if not pending.done.is_set() or (pending.error is None and not pending.returned):
            raise TimeoutError(f"no answer within {timeout:g} s")
        if pending.error is not None:
            raise pending.error
        return pending.result  # type: ignore[no-any-return]

    async def _run(self, key: str, pending: _Call, call: Callable[[], Awaitable[Any]]) -> None:
        try:
            pending.result = await call()
            pending.returned = True
        except Exception as exc:
            pending.error = exc
        finally:
            self._running.pop(key, None)
            pending.done.set()
