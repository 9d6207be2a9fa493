"""Refused requests in the request log, bounded under a flood.

    refusals = RefusalLog(lines=20, window_s=10.0, clock=time.monotonic)
    refusals.admit((401, "/session", "rest"))   # True: log its line; False: counted
    refusals.due()                 # the windows closed since: [Summary(cause, count, s)]
    refusals.due(final=True)       # at shutdown: every window's count, open ones too

Contracts:

* A request is *refused* when its answer is a 4xx or a 503 (``refused``): a token
  missing or wrong, a Host or Origin refused, a rate limit, a body too large, a path
  no route has, the store or the capacity unavailable. Its *cause* is its status,
  route template (``unmatched`` when none matched) and door: a bounded set, since a
  route is a template, never the raw path (past ``MAX_CAUSES`` causes with a window
  open at once, the others share one, ``OVERFLOW``; a window that is over is closed
  first, so a cause refused once long ago holds no room).
* Per cause, a window opens with its first refused request and lasts ``window_s`` on
  ``clock``: its first ``lines`` requests are logged as any other, the rest only
  counted. Once it is over, one summary says how many were not logged (none when all
  were): ``due`` hands back the windows closed by then, asked by the access writer's
  thread on each write (every 50 ms, a thread that runs anyway: no timer of its own),
  and by ``admit`` itself when the cause's next request finds its window over; at
  shutdown ``due(final=True)`` closes every window. Each request is counted exactly
  once: logged, or in one summary.
* ``admit`` runs on the event loop and ``due`` on the writer's thread: one lock.
* Requests that are not refused are never counted here; their lines are as before.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

LINES = 20          # lines per cause and window
WINDOW_S = 10.0
MAX_CAUSES = 1024   # causes with a window open at once
Cause = tuple[int, str, str]   # status, route template, door
OVERFLOW: Cause = (0, "*", "*")


def refused(status: int) -> bool:
    """An answer that refused its request: a 4xx or a 503."""
    return 400 <= status < 500 or status == 503


class Summary(NamedTuple):
    """``count`` refused requests of ``cause`` not logged in the last ``seconds``."""

    cause: Cause
    count: int
    seconds: float

    def message(self) -> str:
        status, route, door = self.cause
        return (f"… and {self.count} more refused {status} {route} door={door} "
                f"in the last {self.seconds:.1f} s (not logged)"
                if status else
                f"… and {self.count} more refused requests of other causes "
                f"in the last {self.seconds:.1f} s (not logged)")

    def fields(self) -> dict[str, object]:
        status, route, door = self.cause
        return {"kind": "refused_not_logged", "status": status, "route": route,
                "door": door, "count": self.count, "window_s": round(self.seconds, 3)}


class _Window:
    __slots__ = ("start", "logged", "more")

    def __init__(self, start: float) -> None:
        self.start = start
        self.logged = 0
        self.more = 0


class RefusalLog:
    def __init__(self, *, lines: int = LINES, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic,
                 max_causes: int = MAX_CAUSES) -> None:
        self.lines = lines
        self.window_s = window_s
        self.clock = clock
        self.max_causes = max_causes
        self._windows: dict[Cause, _Window] = {}
        self._lock = threading.Lock()
        self._next_close = math.inf   # the earliest end of a window with a count
        self._next_sweep = -math.inf   # the earliest end of a window, when the map is full
        self.closed: list[Summary] = []   # closed by ``admit``: written by its caller

    def admit(self, cause: Cause) -> bool:
        """Whether this refused request's line is logged (else it is counted)."""
        now = self.clock()
        with self._lock:
            window = self._windows.get(cause)
            if window is None and len(self._windows) >= self.max_causes:
                self._sweep(now)   # windows over hold no room (nor do they block a cause)
                if len(self._windows) >= self.max_causes:
                    cause = OVERFLOW
                    window = self._windows.get(cause)
            if window is not None and now - window.start >= self.window_s:
                del self._windows[cause]
                if window.more:
                    self.closed.append(Summary(cause, window.more, self.window_s))
                window = None
            if window is None:
                window = self._windows[cause] = _Window(now)
            if window.logged < self.lines:
                window.logged += 1
                return True
            if not window.more:
                self._next_close = min(self._next_close, window.start + self.window_s)
            window.more += 1
            return False

    def _sweep(self, now: float) -> None:
        """The windows over by ``now`` closed (under the lock), their summaries to
        ``closed``; at most once per ``window_s`` while every window is open."""
        if now < self._next_sweep:
            return
        oldest = math.inf
        for cause, window in list(self._windows.items()):
            if now - window.start >= self.window_s:
                del self._windows[cause]
                if window.more:
                    self.closed.append(Summary(cause, window.more, self.window_s))
            else:
                oldest = min(oldest, window.start)
        self._next_sweep = oldest + self.window_s if oldest < math.inf else -math.inf

    def due(self, *, final: bool = False) -> list[Summary]:
        """The summaries of the windows over by now (all of them when ``final``),
        those ``admit`` closed first; each is handed back once."""
        now = self.clock()
        if not final and not self.closed and now < self._next_close:
            return []   # the common case: nothing to say, no lock
        with self._lock:
            out, self.closed = self.closed, []
            next_close = math.inf
            for cause, window in list(self._windows.items()):
                end = window.start + self.window_s
                if final or now >= end:
                    del self._windows[cause]
                    if window.more:
                        out.append(Summary(cause, window.more,
                                           min(now - window.start, self.window_s)))
                elif window.more:
                    next_close = min(next_close, end)
            self._next_close = next_close
            return out
