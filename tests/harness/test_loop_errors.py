"""The loop-error guard (``tests.harness.loop_errors``) driven by hand: an error the
asyncio loop logs during a phase fails it, with the loop's message; a test marked
``loop_errors_expected`` passes; a quiet phase passes; a phase that failed of its own
keeps its own error."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from tests.harness import loop_errors


@dataclass
class Item:
    marked: bool = False

    def get_closest_marker(self, name: str) -> Any:
        return object() if self.marked and name == loop_errors.MARK else None


async def _a_callback_raises() -> None:
    asyncio.get_running_loop().call_exception_handler(
        {"message": "Exception in callback a_bug()", "exception": ValueError("a bug")})


def _phase(item: Item, work: Any) -> Any:
    guard = loop_errors._guarded(item, "test")  # type: ignore[arg-type]
    next(guard)
    work()
    try:
        guard.send("its result")
    except StopIteration as done:
        return done.value
    raise AssertionError("the guard yielded twice")


def test_a_loop_error_fails_the_phase_with_its_message() -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        _phase(Item(), lambda: asyncio.run(_a_callback_raises()))
    assert "Exception in callback a_bug()" in str(failed.value)
    assert "ValueError: a bug" in str(failed.value)


def test_a_marked_test_passes_and_a_quiet_phase_too() -> None:
    assert _phase(Item(marked=True), lambda: asyncio.run(_a_callback_raises())) == "its result"
    assert _phase(Item(), lambda: None) == "its result"


def test_a_phase_that_failed_keeps_its_own_error() -> None:
    guard = loop_errors._guarded(Item(), "test")  # type: ignore[arg-type]
    next(guard)
    asyncio.run(_a_callback_raises())
    with pytest.raises(KeyError):
        guard.throw(KeyError("its own"))
    assert loop_errors._RECORDS.records == []   # taken with it, not left for the next
