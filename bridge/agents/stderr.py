"""An agent's stderr, logged at a bounded rate, its last lines kept.

    log = StderrLog("[agent qwen pid=42]")
    log.line(b"warming up\\n")       # logged (INFO, ``bridge.agents.stdio.stderr``)
    log.tail                         # the last ``TAIL_LINES`` lines, for a death message
    log.close()                      # stderr ended: says how many lines were not logged
    bad = StderrLog(prefix, what="invalid stdout", logger=other, level=logging.WARNING)
    bad.say("ignoring invalid message: …")   # any other stream of an agent's lines

Contracts: every line goes to ``tail`` as it is, and to the log
``loggable`` (CR, ESC and the other controls escaped: an agent's line can neither forge
a server log line nor drive the reader's terminal); at most ``burst`` lines are logged at once and
``per_s`` a second after that (a token bucket on ``clock``); the lines past it are
counted, not logged, and the count is logged (WARNING) with the next line logged or at
``close``. An agent that floods its stderr so costs the server's log (and disk) at
most ``per_s`` lines a second, never its own volume.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

from bridge.loggable import loggable

log = logging.getLogger("bridge.agents.stdio.stderr")

TAIL_LINES = 50
BURST = 200
PER_S = 20.0
LINE_CHARS = 4096   # of a logged line; ``tail`` keeps it whole


class StderrLog:
    def __init__(self, prefix: str, *, burst: int = BURST, per_s: float = PER_S,
                 clock: Callable[[], float] = time.monotonic, what: str = "stderr",
                 logger: logging.Logger = log, level: int = logging.INFO) -> None:
        self.prefix = prefix
        self.what = what
        self.logger = logger
        self.level = level
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.burst = burst
        self.per_s = per_s
        self.clock = clock
        self.suppressed = 0
        self._allowance = float(burst)
        self._at = clock()

    def line(self, raw: bytes) -> None:
        self.say(raw.decode("utf-8", "replace").rstrip())

    def say(self, text: str) -> None:
        self.tail.append(text)
        now = self.clock()
        self._allowance = min(float(self.burst),
                              self._allowance + max(0.0, now - self._at) * self.per_s)
        self._at = now
        if self._allowance < 1.0:
            self.suppressed += 1
            return
        self._allowance -= 1.0
        self._report()
        self.logger.log(self.level, "%s %s", self.prefix, loggable(text, LINE_CHARS))

    def close(self) -> None:
        self._report()

    def _report(self) -> None:
        if self.suppressed:
            self.logger.warning("%s %d %s line(s) not logged (more than %g a second)",
                                self.prefix, self.suppressed, self.what, self.per_s)
            self.suppressed = 0
