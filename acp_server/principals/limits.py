"""Rate limits per principal and request class: a token bucket each, in memory.

    limiter = RateLimiter({"prompt": Tier(10), "mutation": Tier(30), "read": Tier(120)},
                          clock=time.monotonic)
    wait = limiter.take("ci", "prompt")    # None: allowed (one token taken); else seconds
    limiter.tier("prompt").per_minute      # 10

Contracts:

* One bucket per (principal name, class), holding at most ``per_minute`` requests and
  refilled continuously at ``per_minute`` per ``window_s`` (60 s): a principal may
  send ``per_minute`` requests at once, then one every ``window_s / per_minute``
  seconds (``qwen serve``'s ``--rate-limit`` tiers work the same way: prompt 10,
  mutation 30, read 120 per minute). ``take`` is exact: the n-th request of a burst is
  refused iff the bucket holds less than one token, and the answer is how long until
  it holds one (the ``Retry-After``).
* A class without a tier (or a tier of 0 per minute) is not limited.
* The buckets are this process's memory: nothing is shared between instances (each
  instance behind a load balancer grants its own ``per_minute``), nothing survives a
  restart. At most ``max_keys`` principals are tracked; buckets that are full again
  are dropped first when that many are reached, and past it requests are allowed (a
  bounded memory, never a refusal because of other principals).
* ``clock`` (monotonic seconds) is injected: tests move time by hand.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

from acp_server.principals.model import MUTATION_CLASS, PROMPT_CLASS, READ_CLASS

WINDOW_S = 60.0
MAX_KEYS = 10_000


@dataclasses.dataclass(frozen=True, slots=True)
class Tier:
    per_minute: float
    window_s: float = WINDOW_S

    @property
    def rate(self) -> float:
        """Tokens per second."""
        return self.per_minute / self.window_s


# Failed credentials per client address not on loopback (``Gate.failures``): 20 at
# once, then one every 3 s; past them the address's requests are refused unchecked.
CREDENTIAL_FAILURE = "credential_failure"
FAILURE_TIERS = {CREDENTIAL_FAILURE: Tier(20)}

# qwen serve's --rate-limit tiers: the defaults for stored tokens.
DEFAULT_TIERS = {PROMPT_CLASS: Tier(10), MUTATION_CLASS: Tier(30), READ_CLASS: Tier(120)}


class RateLimiter:
    def __init__(self, tiers: Mapping[str, Tier], *, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = MAX_KEYS) -> None:
        self.tiers = {k: t for k, t in tiers.items() if t.per_minute > 0}
        self.clock = clock
        self.max_keys = max_keys
        # class -> (capacity, tokens per second, {principal: [tokens, last refill]})
        self._classes = {k: (t.per_minute, t.rate, {}) for k, t in self.tiers.items()}
        self._size = 0
        self.refused: dict[str, int] = {k: 0 for k in tiers}

    def tier(self, klass: str) -> Tier | None:
        return self.tiers.get(klass)

    def take(self, key: str, klass: str) -> float | None:
        """Take one request of ``klass`` for ``key``: ``None`` when allowed, else the
        seconds until one would be."""
        found = self._classes.get(klass)
        if found is None:
            return None
        capacity, rate, buckets = found
        now = self.clock()
        bucket = buckets.get(key)
        if bucket is None:
            if self._size >= self.max_keys and not self._sweep(now):
                return None   # bounded memory: see the contracts
            bucket = buckets[key] = [capacity, now]
            self._size += 1
        else:
            tokens = bucket[0] + (now - bucket[1]) * rate
            bucket[0] = tokens if tokens < capacity else capacity
            bucket[1] = now
        if bucket[0] >= 1:
            bucket[0] -= 1
            return None
        self.refused[klass] = self.refused.get(klass, 0) + 1
        return (1 - bucket[0]) / rate

    def waiting(self, key: str, klass: str) -> float | None:
        """Seconds until ``key``'s bucket of ``klass`` holds one token again, ``None``
        when it does (or is not tracked); takes nothing."""
        found = self._classes.get(klass)
        bucket = found[2].get(key) if found is not None else None
        if found is None or bucket is None:
            return None
        tokens = bucket[0] + (self.clock() - bucket[1]) * found[1]
        return None if tokens >= 1 else (1 - tokens) / found[1]

    def give_back(self, key: str, klass: str) -> None:
        """Undo one ``take`` that was allowed: the request is counted elsewhere (another
        instance serves it: ``acp_server.fleet``). Never past the bucket's capacity."""
        found = self._classes.get(klass)
        bucket = found[2].get(key) if found is not None else None
        if found is not None and bucket is not None:
            bucket[0] = min(found[0], bucket[0] + 1)

    def _sweep(self, now: float) -> bool:
        """Drop the buckets that have refilled completely; whether room was made."""
        for capacity, rate, buckets in self._classes.values():
            full = [key for key, (tokens, at) in buckets.items()
                    if tokens + (now - at) * rate >= capacity]
            for key in full:
                del buckets[key]
            self._size -= len(full)
        return self._size < self.max_keys


__all__ = ["CREDENTIAL_FAILURE", "DEFAULT_TIERS", "FAILURE_TIERS", "RateLimiter", "Tier",
           "WINDOW_S"]
