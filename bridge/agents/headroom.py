"""Room to start a child process: free file descriptors, checked before a spawn.

    ensure_descriptor_headroom()   # OSError(EMFILE) when fewer than SPAWN_HEADROOM are free
    process = await anyio.open_process(argv, stdin=PIPE, stdout=PIPE, stderr=PIPE)

Why: uvloop's spawn (the server's event loop) makes the child's pipes first, and when
a later step fails for want of descriptors it does not close the ones it made
(MagicStack/uvloop#185 and the fix still open, #186; 0.23.0 measured: 3 to 7
descriptors per failed start). So a start refused at the descriptor limit kept what
it had taken, every retry failed, and the agents that died to make room gave their
descriptors to the leak: the server never started an agent again. The standard
library's spawn closes what it made. A start now first opens ``SPAWN_HEADROOM``
descriptors (more than a spawn with three pipes takes at its peak, 11 with uvloop)
and closes them: when they cannot all be had, it is refused with ``EMFILE`` without
trying, and nothing leaks.

Contracts:

* Synchronous, a few microseconds: ``SPAWN_HEADROOM`` opens of ``/dev/null`` and as
  many closes. It leaves the process's descriptors as they were, whatever happens.
* It narrows the leak, it does not close it: a thread that takes descriptors between
  the check and the spawn (another connection accepted) can still make a spawn fail
  in the middle. The headroom leaves room for a few.
"""

from __future__ import annotations

import errno
import os

SPAWN_HEADROOM = 16


def ensure_descriptor_headroom(count: int = SPAWN_HEADROOM) -> None:
    """Raise ``OSError(EMFILE)`` unless ``count`` descriptors can be opened now."""
    taken: list[int] = []
    try:
        for _ in range(count):
            taken.append(os.open(os.devnull, os.O_RDONLY))   # not inherited (PEP 446)
    except OSError as exc:   # any other failure (no /dev/null): the spawn tells
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise OSError(exc.errno, os.strerror(exc.errno)) from None
    finally:
        for fd in taken:
            os.close(fd)


__all__ = ["SPAWN_HEADROOM", "ensure_descriptor_headroom"]
