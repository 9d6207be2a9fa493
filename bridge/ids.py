"""Random ids, their bits drawn from the OS in bulk: prompt ids (RFC 9562 version 7
UUIDs), version 4 UUIDs and random integers.

    prompt_id = new_prompt_id()          # '019ad7c4-5e1b-7a3c-9f02-…', sorts by its ms
    new_prompt_id(1_764_662_400_000)     # an injected millisecond (tests)
    session_id = uuid4_str()             # as str(uuid.uuid4()): '3f0c…-…-4…-[89ab]…-…'
    suffix = random_bits(80)             # as secrets.randbits(80)

Contracts:

* 48 bits of Unix milliseconds, then 74 random bits (version 7, RFC 4122 variant),
  written as ``str(uuid.UUID(...))`` writes it: a later prompt's id sorts after an
  earlier one's (within one millisecond, in any order). The durable journal keys its
  prompts table by session and prompt id: time-ordered ids land at the end of that
  table's b-tree, on the pages the last commit wrote, where random (version 4) ids
  dirtied a random page per accepted and per settled prompt (in process: ~12 µs less
  of the writer's CPU per prompt, issue #23).
* The random bits come from ``os.urandom``, as before, but ``POOL_BYTES`` at a time
  (one call per ``POOL_BYTES // 10`` ids): ``os.urandom`` lets go of the interpreter
  lock around its system call, so one call per prompt handed the lock to any thread
  waiting for it (granian's runtime thread, the store's writer) and had to win it
  back: 2.4 µs alone, 11 µs per prompt on a loaded server (in process, the REST
  accepted-and-completed load). Never two ids from the same bytes: the pool is taken
  under a lock and thrown away in a forked child.
* As unguessable as needed: a prompt is reached through its session, which the
  caller must own.
* ``uuid4_str`` and ``random_bits`` draw from the same pool (the kernel's CSPRNG, each
  byte handed out once): what ``uuid.uuid4()`` and ``secrets.randbits`` give, without
  their system call each. A session, its bus epoch and its client id, an LMSP task's
  and its response's ids, a connection's id: four or five ``getrandom`` calls per
  prompt or task before, each a hand-over of the interpreter lock.
"""

from __future__ import annotations

import os
import threading
import time

POOL_BYTES = 4096
_ID_BYTES = 10   # 80 bits drawn, 74 used


class _RandomPool:
    __slots__ = ("_lock", "_bytes", "_at")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = b""
        self._at = 0

    def take(self, size: int = _ID_BYTES) -> int:
        """``size`` (≤ ``POOL_BYTES``) random bytes as an integer, never handed out
        twice."""
        with self._lock:
            at = self._at
            if at + size > len(self._bytes):
                self._bytes, at = os.urandom(POOL_BYTES), 0
            self._at = at + size
            return int.from_bytes(self._bytes[at:at + size], "big")

    def forget(self) -> None:
        """In a forked child: new bytes, and a new lock (the parent's may have been
        held by another thread at the fork, and no thread of the child would free it)."""
        self._lock = threading.Lock()
        self._bytes, self._at = b"", 0


_pool = _RandomPool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pool.forget)   # a child draws its own bytes


def new_prompt_id(now_ms: int | None = None) -> str:
    """A new prompt's id (see the module contracts)."""
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    rand = _pool.take()
    return _uuid_text((ms & (1 << 48) - 1) << 80 | 0x7 << 76 | (rand >> 62 & 0xFFF) << 64
                      | 0b10 << 62 | rand & (1 << 62) - 1)


def uuid4_str() -> str:
    """A random UUID, version 4, written as ``str(uuid.uuid4())`` writes it."""
    return _uuid_text((_pool.take(16) & ~(0xF << 76 | 0b11 << 62)) | 0x4 << 76 | 0b10 << 62)


def _uuid_text(value: int) -> str:
    """A 128-bit value written as ``str(uuid.UUID(int=value))`` writes it."""
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def random_bits(k: int) -> int:
    """A random integer ``0 <= x < 2**k`` (``k`` ≤ 8 × ``POOL_BYTES``), as
    ``secrets.randbits(k)``."""
    if k <= 0:
        return 0
    return _pool.take((k + 7) // 8) >> (-k % 8)


__all__ = ["POOL_BYTES", "new_prompt_id", "random_bits", "uuid4_str"]
