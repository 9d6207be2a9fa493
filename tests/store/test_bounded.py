"""``acp_server.store.bounded``: a store call the asker waits for at most a while."""

from __future__ import annotations

import anyio
import pytest

from acp_server.store.bounded import BoundedCalls

pytestmark = pytest.mark.anyio


async def test_a_hung_call_holds_no_asker_and_runs_once() -> None:
    release = anyio.Event()
    starts = 0

    async def hung() -> str:
        nonlocal starts
        starts += 1
        await release.wait()
        return "answered"

    bounded = BoundedCalls()
    async with anyio.create_task_group() as tg:
        bounded.tg = tg
        for _ in range(3):   # each gives up; none starts another call
            with pytest.raises(TimeoutError):
                await bounded.ask("probe", hung, 0)
        assert starts == 1
        release.set()
        assert await bounded.ask("probe", hung, 10) in ("answered",)
        assert starts in (1, 2)   # the first call's answer, or a new one once it ended

        async def fails() -> str:
            raise LookupError("refused")

        with pytest.raises(LookupError):
            await bounded.ask("other", fails, 10)
        bounded.tg = None


async def test_a_call_cancelled_with_the_store_is_no_answer() -> None:
    bounded = BoundedCalls()
    outcome: list[BaseException | str] = []

    async def ask() -> None:
        try:
            outcome.append(await bounded.ask("probe", anyio.sleep_forever, 10))  # type: ignore[arg-type]
        except TimeoutError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as asker:
        async with anyio.create_task_group() as store:
            bounded.tg = store
            asker.start_soon(ask)
            await anyio.wait_all_tasks_blocked()
            store.cancel_scope.cancel()   # the store closing
    assert len(outcome) == 1 and isinstance(outcome[0], TimeoutError)
