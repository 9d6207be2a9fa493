"""The interpreter's switch interval, lowered while store work runs on a worker thread.

    with store_work:            # or ``async with``: any thread, any store
        ...                     # a batch or a read on a worker thread

Contract: the first to enter lowers the switch interval to ``SWITCH_INTERVAL_S`` (never
raises it), the last to leave puts back what it was. Why (``acp_server.store.writer``):
a worker thread gives up the interpreter lock in every statement and must win it back
from the busy event loop, which holds it for up to the interval; lowered for the
store's whole life it would cost every request that never touches the store.
"""

from __future__ import annotations

import sys
import threading

__all__ = ["SWITCH_INTERVAL_S", "store_work"]

SWITCH_INTERVAL_S = 0.0005


class _StoreWork:
    """``with store_work:`` (or ``async with``) around store work on a worker thread:
    the first to enter lowers the switch interval to ``SWITCH_INTERVAL_S`` (never
    raises it), the last to leave puts back what it was. Any thread, any store."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._saved: float | None = None

    def __enter__(self) -> None:
        with self._lock:
            if self._inside == 0:
                self._saved = sys.getswitchinterval()
                if self._saved > SWITCH_INTERVAL_S:
                    sys.setswitchinterval(SWITCH_INTERVAL_S)
            self._inside += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._inside -= 1
            if self._inside == 0 and self._saved is not None:
                sys.setswitchinterval(self._saved)
                self._saved = None

    async def __aenter__(self) -> None:
        self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()


store_work = _StoreWork()
