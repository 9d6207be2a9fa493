"""A pytest plugin (``tests/conftest.py`` loads it for the whole suite): an error the
asyncio event loop only logs fails the test during which it was logged.

    @pytest.mark.loop_errors_expected    # a test that provokes one on purpose

asyncio hands what no one awaits or catches to its exception handler, which logs it on
the ``asyncio`` logger at ERROR and goes on: "Task exception was never retrieved" (a
task nobody waited for), "Exception in callback …" (a ``call_soon`` that raised),
"Fatal error on transport …". Such an error is a bug (every task has an owner), and
the test that caused it may pass. So each phase (set-up, call, tear-down) fails with
the records logged during it. A task's unretrieved error is logged when the task is
collected, which may be during a later test: the message says so. (Under trio an
unowned task cannot exist, and an error out of a callback ends the run itself.)

Threads' exceptions are pytest's own ``PytestUnhandledThreadExceptionWarning``, an
error by ``pyproject.toml``'s ``filterwarnings``; the same lines in an ``acp-server
serve`` child's log fail its test (``tests.harness.unhandled``).
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

import pytest

MARK = "loop_errors_expected"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


_RECORDS = _Records()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}: the test provokes an asyncio loop error "
                                       "on purpose (tests.harness.loop_errors)")
    logging.getLogger("asyncio").addHandler(_RECORDS)


def pytest_unconfigure(config: pytest.Config) -> None:
    logging.getLogger("asyncio").removeHandler(_RECORDS)


def _shown(records: list[logging.LogRecord]) -> str:
    lines = []
    for record in records:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            text += f"\n    {type(error).__name__}: {error}"
        lines.append(text)
    return "\n".join(lines)


def _guarded(item: pytest.Item, phase: str) -> Generator[None, Any, Any]:
    start = len(_RECORDS.records)
    try:
        result = yield
    finally:   # a phase that failed of its own fails with its own error
        logged = _RECORDS.records[start:]
        del _RECORDS.records[start:]
    if logged and item.get_closest_marker(MARK) is None:
        pytest.fail(f"the asyncio loop logged {len(logged)} error(s) during the {phase} "
                    f"(an unretrieved task error is logged when the task is collected: "
                    f"maybe made by an earlier test):\n{_shown(logged)}", pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _guarded(item, "set-up"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _guarded(item, "test"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _guarded(item, "tear-down"))
