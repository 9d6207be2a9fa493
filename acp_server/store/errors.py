"""The store is unavailable: one error every door maps to a 503, and the store's health.

    try:
        await store.create_task(new, event0, None)
    except StoreUnavailableError as exc:          # a door answers 503 + Retry-After
        return problem_503(exc.reason, retry_after=exc.retry_after)

    await persist(lambda: store.transition(...), what="task_1 → failed")  # runner writes

Contracts:

* ``StoreUnavailableError`` means the store could not be reached or could not write
  (PostgreSQL down or restarting, its connections killed, SQLite's disk full or file
  locked past the busy timeout, the database file deleted): nothing of the failed
  operation was acknowledged. A COMMIT cut mid-way may still have landed, which is
  why a client retries with its ``Idempotency-Key``. ``reason`` is for operators
  (logs, ``/health?deep=1``), ``retry_after`` (seconds) for the ``Retry-After`` header.
* Each door maps it to its own 503: LMSP ``store_unavailable`` problem, REST
  ``{error, code: "store_unavailable"}``, ``/acp`` JSON-RPC ``data.errorKind:
  "store_unavailable"``. Never a 500.
* An engine's own error (``ENGINE_ERRORS``) that reaches a door is a write the store
  refused for good; the door answers it as it answers ``StoreUnavailableError`` (nothing
  was recorded) and logs it, with the database's first line, as a refusal.
* ``StoreHealth`` is what a store knows of itself: down from the first failed write or
  read until the next one that succeeds (``/health?deep=1`` reports it).
* ``persist`` retries an operation for as long as the store is unavailable, with a
  capped exponential ``Backoff``, until it succeeds or the caller is cancelled: for
  writes that must happen eventually (a task's failure, its terminal transition).
"""

from __future__ import annotations

import logging
import random
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import anyio
import psycopg

from bridge.loggable import loggable

log = logging.getLogger("acp_server.store")

RETRY_AFTER_S = 5
T = TypeVar("T")


class StoreUnavailableError(Exception):
    """The store cannot serve this operation now; retry later (503)."""

    code = "store_unavailable"

    def __init__(self, reason: str, *, retry_after: int = RETRY_AFTER_S) -> None:
        super().__init__(f"The task store is unavailable: {reason}")
        self.reason = reason
        self.retry_after = retry_after


# What an engine raises for a write's own fault (a constraint, a trigger, a value it
# cannot take) reaches the caller as is; a door that gets one answers as for an outage.
ENGINE_ERRORS = (sqlite3.Error, psycopg.Error)


def first_line(exc: BaseException, limit: int | None = None) -> str:
    """The first line of an error's message (its type's name when it has none), at most
    ``limit`` characters (then "…"): what a log line or ``/health`` says of it, never a
    payload; escaped by the log lines' one rule (``bridge.loggable``: a database's
    message may quote a value a client chose)."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return loggable(text, len(text) if limit is None else limit)


class Backoff:
    """Capped exponential delays with jitter: ``first``, ×2 each failure, at most ``cap``."""

    def __init__(self, first: float = 0.05, cap: float = 5.0) -> None:
        self.first, self.cap = first, cap
        self.current = 0.0

    def next(self) -> float:
        self.current = self.first if self.current == 0 else min(self.cap, self.current * 2)
        return self.current * (0.75 + random.random() / 2)

    def reset(self) -> None:
        self.current = 0.0


class StoreHealth:
    """Up, or down since a time for a reason (set by the store on each outcome)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.reason: str | None = None
        self.down_since: float | None = None
        self.failures = 0          # operations refused as unavailable, since start
        self._writes_down = False  # only a write that succeeds clears a write failure

    @property
    def up(self) -> bool:
        return self.reason is None

    def failed(self, reason: str, *, write: bool = True) -> None:
        self.failures += 1
        self._writes_down = self._writes_down or write
        if self.reason is None:
            self.down_since = self.clock()
            log.warning("store unavailable: %s", reason)
        self.reason = reason

    def succeeded(self, *, write: bool = True) -> None:
        if self._writes_down and not write:
            return
        self._writes_down = False
        if self.reason is not None:
            log.warning("store available again (down for %.1f s: %s)",
                        self.clock() - (self.down_since or self.clock()), self.reason)
        self.reason = None
        self.down_since = None


class Probed(Protocol):
    """What ``/health?deep=1`` asks of a store (every store of this room is one)."""

    health: StoreHealth

    async def probe(self, timeout: float = 2.0) -> str | None: ...


async def persist(fn: Callable[[], Awaitable[T]], *, what: str,
                  backoff: Backoff | None = None) -> T:
    """``await fn()`` until it does not raise ``StoreUnavailableError`` (logged once)."""
    delays = backoff or Backoff(0.1, 5.0)
    logged = False
    while True:
        try:
            return await fn()
        except StoreUnavailableError as exc:
            if not logged:
                log.warning("%s: waiting for the store (%s)", what, exc.reason)
                logged = True
            await anyio.sleep(delays.next())
