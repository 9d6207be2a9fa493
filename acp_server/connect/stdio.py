"""The editor's side of the adapter: newline-delimited messages on stdin and stdout.

    lines = LineReader(read_chunk, max_bytes=32 << 20)
    async for line in lines:          # bytes without the newline, or TooLong(size)
        ...
    async with EditorWriter(write) as out:
        await out.send(payload)       # one line, in order; batched into few writes

Contracts:

* ``LineReader`` never holds more than ``max_bytes`` of one line: past it the line is
  reported once as ``TooLong`` and its remaining bytes are skipped up to the next
  newline. Empty lines (and a lone ``\\r`` before the newline) are skipped. The
  iteration ends at end of input (a last line without a newline counts).
* ``EditorWriter`` is the only writer of stdout: every payload becomes one line; the
  queue in front of it is bounded (``send`` waits when the editor does not read).
  Once a write fails (the editor closed its end), ``send`` drops what it is given, one
  line goes to stderr and ``on_gone`` is called once (the relay stops as on a closed
  stdin); before, every message after it was a traceback on stderr. Leaving it writes
  what is queued within ``FLUSH_S`` (an editor that closed stdin and reads no more
  kept the adapter from ever exiting).
* ``stdin_reader`` / ``stdout_writer`` read and write the process's file descriptors
  without blocking the event loop: polled when non-blocking (pipes, terminals),
  else on worker threads; a cancelled read or write leaves nothing behind.
  ``restore_blocking`` gives the descriptors their blocking mode back at exit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType

import anyio
import anyio.abc
import anyio.to_thread

CHUNK = 64 * 1024
QUEUE = 1024
FLUSH_S = 10.0   # at exit, the longest wait for the editor to read what is queued
log = logging.getLogger("acp_server.connect")


class TooLong:
    """A line longer than the cap (its bytes were skipped)."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size


class LineReader:
    def __init__(self, read_chunk: Callable[[], Awaitable[bytes]], *, max_bytes: int) -> None:
        self._read = read_chunk
        self.max_bytes = max_bytes

    async def __aiter__(self) -> AsyncIterator[bytes | TooLong]:
        buffer = bytearray()
        skipping = 0          # > 0: inside a line that is too long (bytes seen so far)
        while True:
            chunk = await self._read()
            if not chunk:
                break
            start = 0
            while True:
                end = chunk.find(b"\n", start)
                piece = chunk[start:] if end < 0 else chunk[start:end]
                if skipping:
                    skipping += len(piece)
                elif len(buffer) + len(piece) > self.max_bytes:
                    skipping = len(buffer) + len(piece)
                    buffer.clear()
                else:
                    buffer += piece
                if end < 0:
                    break
                if skipping:
                    yield TooLong(skipping)
                    skipping = 0
                else:
                    line = bytes(buffer).rstrip(b"\r")
                    buffer.clear()
                    if line.strip():
                        yield line
                start = end + 1
        if skipping:
            yield TooLong(skipping)
        elif bytes(buffer).strip():
            yield bytes(buffer).rstrip(b"\r")


class EditorWriter:
    def __init__(self, write: Callable[[bytes], Awaitable[None]], *,
                 flush_s: float = FLUSH_S) -> None:
        self._write = write
        self._send, self._receive = anyio.create_memory_object_stream[bytes](QUEUE)
        self._tg: anyio.abc.TaskGroup | None = None
        self.flush_s = flush_s
        self.gone = False
        self.on_gone: Callable[[], None] | None = None

    async def __aenter__(self) -> EditorWriter:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._drain)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        self._send.close()   # the drain writes what is queued, then ends
        assert self._tg is not None
        # an editor that closed stdin and reads no more: the drain gives up past flush_s
        self._tg.cancel_scope.deadline = anyio.current_time() + self.flush_s
        return await self._tg.__aexit__(exc_type, exc, tb)

    async def send(self, payload: bytes) -> None:
        if self.gone:
            return
        try:
            await self._send.send(payload)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return   # the editor went away meanwhile (``_drain``)

    async def _drain(self) -> None:
        async with self._receive:
            async for payload in self._receive:
                batch = [payload, b"\n"]
                while True:
                    try:
                        batch += [self._receive.receive_nowait(), b"\n"]
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                try:
                    await self._write(b"".join(batch))
                except OSError as exc:   # the editor is gone: nothing more can reach it
                    self._gone(exc)
                    return

    def _gone(self, exc: OSError) -> None:
        self.gone = True
        log.warning("the editor closed its end of stdout (%s): stopping", exc.strerror or exc)
        if self.on_gone is not None:
            self.on_gone()


def stdin_reader(fd: int | None = None) -> Callable[[], Awaitable[bytes]]:
    """Reads of ``fd`` (default stdin): non-blocking and polled where the descriptor
    can be polled (a pipe, a socket, a terminal), else on a worker thread."""
    source = sys.stdin.buffer.fileno() if fd is None else fd
    polled = _nonblocking(source)

    async def read() -> bytes:
        if not polled:
            return await anyio.to_thread.run_sync(os.read, source, CHUNK,
                                                  abandon_on_cancel=True)
        while True:
            try:
                return os.read(source, CHUNK)
            except BlockingIOError:
                await anyio.wait_readable(source)

    return read


def stdout_writer(fd: int | None = None) -> Callable[[bytes], Awaitable[None]]:
    """Whole writes to ``fd`` (default stdout), polled like ``stdin_reader``."""
    target = sys.stdout.buffer.fileno() if fd is None else fd
    polled = _nonblocking(target)

    def write_all(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(target, view):]

    async def write(data: bytes) -> None:
        if not polled:
            await anyio.to_thread.run_sync(write_all, data)
            return
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(target, view):]
            except BlockingIOError:
                await anyio.wait_writable(target)

    return write


_made_nonblocking: dict[int, bool] = {}   # fd -> blocking before we changed it


def _nonblocking(fd: int) -> bool:
    """Make ``fd`` non-blocking when it is a pipe, socket or character device (what
    the event loop can poll); ``False`` for anything else (a regular file). The mode
    is shared with whoever else holds the descriptor (the shell's terminal):
    ``restore_blocking`` puts it back."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)):
        return False
    _made_nonblocking.setdefault(fd, os.get_blocking(fd))
    os.set_blocking(fd, False)
    return True


def restore_blocking() -> None:
    """Give every descriptor ``stdin_reader`` / ``stdout_writer`` changed its blocking
    mode back (at exit: a terminal left non-blocking breaks the shell after us)."""
    while _made_nonblocking:
        fd, blocking = _made_nonblocking.popitem()
        with contextlib.suppress(OSError):
            os.set_blocking(fd, blocking)
