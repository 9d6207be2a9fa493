"""Close the connections that never said enough to be served: granian's missing header
timeout.

    sweep = SilentConnections(port=4170, timeout_s=10.0, stats=guard_stats)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sweep.run)       # until cancelled
        ...

granian (the default server) detects HTTP/1 or HTTP/2 from a connection's first bytes
and has no timer on that wait: a client that connects and sends nothing holds an accept
permit forever, and enough of them leave new clients in the listen backlog. uvicorn's
guard closes such a connection after the header timeout; this gives granian the same
guarantee from outside, since granian runs in this process (``granian.server.embed``):

* every ``interval_s`` the process's own descriptors are listed (``/proc/self/fd``);
  each TCP socket whose local port is the server's and that has a peer is one of the
  server's connections;
* the kernel's ``TCP_INFO`` says how many bytes it received and was sent, and how long
  ago it last received data (for a connection that received none: since it was
  established);
* an established connection that received **fewer bytes than the HTTP/2 preface**
  (``PREFACE_BYTES``: none at all, or ``PRI * HTTP`` and no more, which granian waits
  on with no timer either), was **sent no byte**, and received nothing for
  ``timeout_s`` is shut down (``shutdown(SHUT_RDWR)`` on a duplicate of the
  descriptor: the peer sees the connection end, granian's read returns end-of-file and
  it closes its side), and ``stats["header_timeouts"]`` counts it.

Out of descriptors (``EMFILE`` / ``ENFILE``: the very case where silent connections
hold them all), the sweep needs none of its own: the descriptors are probed by number
up to the soft ``RLIMIT_NOFILE`` (``readlink``, no directory opened) and a connection is
looked at through its own descriptor when it cannot be duplicated (then one closed and
reused between the look and the shutdown could be shut down for what the previous one
was: a window of a few system calls, only at the descriptor limit).

Contracts: only connections that were never answered and said less than the preface
are touched (any other partial head, or an idle keep-alive connection, is hyper's
``header_read_timeout``; no HTTP/1.1 request with its ``Host`` is that short, and one
that is gets hyper's answer before the timeout); a connection is shut down between
``timeout_s`` and ``timeout_s + interval_s`` after its last byte (or its start); a
descriptor closed or reused while it is looked at is only ever acted on for what it is
when looked at (the duplicate pins it). Linux only (``TCP_INFO``, ``/proc``): elsewhere
``run`` returns at once. Nothing here raises out of ``run``: a failed sweep is logged.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import socket
import struct
import sys
from collections.abc import Awaitable, Callable, MutableMapping

import anyio
import anyio.to_thread

log = logging.getLogger("acp_server.http")

TCP_ESTABLISHED = 1
_LAST_DATA_RECV = struct.Struct("=I")     # struct tcp_info: tcpi_last_data_recv at 52
_BYTES_RECEIVED = struct.Struct("=Q")     # tcpi_bytes_received at 128 (Linux >= 4.1)
_DATA_SEGS_OUT = struct.Struct("=I")      # tcpi_data_segs_out at 156 (Linux >= 4.6)
PREFACE_BYTES = 24   # b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_INFO_BYTES = 160
_FD_DIR = "/proc/self/fd"


def silent_for_ms(sock: socket.socket) -> int | None:
    """How long an established connection ``sock`` that received less than the HTTP/2
    preface and was sent nothing has received nothing more (ms), or ``None`` when it
    said more, was answered, is not established, or the kernel cannot say."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_BYTES)
    if len(info) < 136 or info[0] != TCP_ESTABLISHED:
        return None
    received = _BYTES_RECEIVED.unpack_from(info, 128)[0]
    if len(info) < _INFO_BYTES:   # an older kernel: only a connection that said nothing
        if received:
            return None
    elif received >= PREFACE_BYTES or _DATA_SEGS_OUT.unpack_from(info, 156)[0] != 0:
        return None
    return int(_LAST_DATA_RECV.unpack_from(info, 52)[0])


_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE)


def _connection_on(fd: int, port: int) -> tuple[socket.socket, bool] | None:
    """``(socket, owned)`` when ``fd`` is a connection accepted on ``port``, else
    ``None``: a duplicate of it (``owned``: close it), or at the descriptor limit the
    descriptor itself (not owned: detach it, never close it)."""
    try:
        if not os.readlink(f"{_FD_DIR}/{fd}").startswith("socket:"):
            return None
    except OSError:
        return None
    try:
        duplicate: int | None = os.dup(fd)
    except OSError as exc:
        if exc.errno not in _OUT_OF_FDS:
            return None
        duplicate = None   # at the limit: the descriptor itself, not owned
    try:
        sock = socket.socket(fileno=fd if duplicate is None else duplicate)
    except OSError:   # its number reused meanwhile for no socket (a pipe, a file)
        if duplicate is not None:
            os.close(duplicate)
        return None
    owned = duplicate is not None
    try:
        if sock.family in (socket.AF_INET, socket.AF_INET6) \
                and sock.type == socket.SOCK_STREAM and sock.getsockname()[1] == port:
            sock.getpeername()   # a listener has no peer: OSError
            return sock, owned
    except OSError:
        pass
    _release(sock, owned)
    return None


def _release(sock: socket.socket, owned: bool) -> None:
    if owned:
        sock.close()
    else:
        sock.detach()   # the descriptor stays the server's


def _descriptors() -> list[int]:
    """This process's open descriptors: ``/proc/self/fd``, or, when no descriptor is
    left to open it with, every number below the soft limit that names one."""
    try:
        return [int(name) for name in os.listdir(_FD_DIR)]
    except OSError as exc:
        if exc.errno not in _OUT_OF_FDS:
            raise
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    numbers = range(soft if soft != resource.RLIM_INFINITY else 1 << 20)
    return [fd for fd in numbers if _is_open(fd)]


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def sweep_once(port: int, timeout_ms: int) -> int:
    """Shut down this process's connections on ``port`` silent for ``timeout_ms``; how
    many (blocking: run it in a worker thread)."""
    closed = 0
    for fd in _descriptors():
        found = _connection_on(fd, port)
        if found is None:
            continue
        sock, owned = found
        try:
            silent = silent_for_ms(sock)
            if silent is not None and silent >= timeout_ms:
                sock.shutdown(socket.SHUT_RDWR)
                closed += 1
        except OSError:
            pass
        finally:
            _release(sock, owned)
    return closed


class SilentConnections:
    """See the module docstring."""

    def __init__(self, *, port: int, timeout_s: float,
                 stats: MutableMapping[str, int] | None = None,
                 interval_s: float | None = None) -> None:
        self.port = port
        self.timeout_ms = max(1, int(timeout_s * 1000))
        self.interval_s = interval_s if interval_s is not None \
            else min(2.0, max(0.25, timeout_s / 4))
        self.stats = stats

    @staticmethod
    def supported() -> bool:
        return sys.platform.startswith("linux") and hasattr(socket, "TCP_INFO") \
            and os.path.isdir(_FD_DIR)

    async def run(self) -> None:
        """Sweep every ``interval_s`` until cancelled."""
        if self.supported():
            await sweep_every(self.interval_s, lambda: anyio.to_thread.run_sync(
                sweep_once, self.port, self.timeout_ms), self.stats,
                f"silent for {self.timeout_ms} ms")


async def sweep_every(interval_s: float, sweep: Callable[[], Awaitable[int]],
                      stats: MutableMapping[str, int] | None, closed_as: str) -> None:
    """``sweep()`` every ``interval_s`` until cancelled; the connections it closed are
    logged (``closed N connection(s) <closed_as>``) and counted as header timeouts. A
    failed sweep is logged and never ends the loop (nor the server)."""
    while True:
        await anyio.sleep(interval_s)
        try:
            closed = await sweep()
        except Exception as exc:   # noqa: BLE001 - a sweep must never end the server
            log.warning("connection sweep failed: %s", exc)
            continue
        if closed:
            log.info("closed %d connection(s) %s", closed, closed_as)
            if stats is not None:
                stats["header_timeouts"] = stats.get("header_timeouts", 0) + closed
