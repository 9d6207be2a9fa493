"""A child process with three pipes, spawned the same way on every event loop.

    child = open_child(["qwen", "--acp"], cwd="/work", env=None)   # OSError if it cannot
    await child.stdin.send(b'{"jsonrpc":"2.0",...}\\n')
    data = await child.stdout.receive()       # anyio.EndOfStream once the child closed it
    code = await child.wait()
    await child.aclose()

Why not ``anyio.open_process``: under uvloop (what ``acp-server serve`` runs on) it
spawns with libuv, which hands the child its three pipes as inheritable duplicates that
stay open in the child beside its fds 0-2. An agent that closed its stdout and lived on
was never seen to close it (the server's read end waited for ever, and so did the
turn), every other inheritable descriptor of the server reached the child, and a spawn
that failed for want of descriptors kept the pipes it had made (MagicStack/uvloop#185).
``subprocess.Popen`` with ``close_fds`` gives the child its fds 0-2 and nothing else,
and closes what it made when the spawn fails.

Contracts:

* ``open_child`` spawns synchronously (a fork and an exec, as every loop's spawn does)
  in the agent's own process group (``start_new_session``); an ``OSError`` (no such
  file, not executable, ``EMFILE``) leaves no descriptor behind.
* ``Child`` is an ``anyio.abc.Process``: ``stdin`` a ``ByteSendStream``, ``stdout`` and
  ``stderr`` ``ByteReceiveStream``\\ s over non-blocking pipes, each waited on with
  ``anyio.wait_readable`` / ``wait_writable`` (asyncio, uvloop and trio alike). Every
  ``send`` and ``receive`` is a checkpoint. An item is written whole or not at all: a
  ``send`` cancelled after part of it went keeps the rest, written first by the next
  ``send`` (a JSON-RPC line is never cut in two by another), as an asyncio transport's
  buffer does; one cancelled before any of it went is not sent. A receive stream
  closes its descriptor at the end of the stream (``EndOfStream``, then
  ``ClosedResourceError``), as asyncio's pipe transports do: a dead child's pipes are
  given back without an ``aclose``. A write to a pipe whose reader is gone raises
  ``BrokenResourceError``; a stream closed while a task waits on it wakes that task
  with ``ClosedResourceError``.
* ``returncode`` is the exit status once the child was reaped (``None`` before);
  ``wait()`` reaps it, waiting on a pidfd (Linux) or, where there is none, on a worker
  thread; any number of tasks may wait at once.
* ``aclose()`` closes the three streams and waits for the exit; cancelled, it kills
  the child first (as ``anyio``'s processes do).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import IO

import anyio
import anyio.abc
import anyio.lowlevel

READ_BYTES = 65536


class _Pipe:
    """One end of a pipe (the file object ``Popen`` made, which owns the descriptor),
    non-blocking, closed once."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self.fd = file.fileno()
        os.set_blocking(self.fd, False)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            anyio.notify_closing(fd)   # a task waiting on it: ClosedResourceError
            self._file.close()


class PipeReceiveStream(anyio.abc.ByteReceiveStream):
    def __init__(self, file: IO[bytes]) -> None:
        self._pipe = _Pipe(file)

    async def receive(self, max_bytes: int = READ_BYTES) -> bytes:
        await anyio.lowlevel.checkpoint()
        while True:
            fd = self._pipe.fd
            if fd < 0:
                raise anyio.ClosedResourceError
            try:
                data = os.read(fd, max_bytes)
            except BlockingIOError:
                await anyio.wait_readable(fd)
                continue
            except OSError as exc:
                self._pipe.close()
                raise anyio.BrokenResourceError from exc
            if not data:   # its descriptor is given back at once, as a transport's is
                self._pipe.close()
                raise anyio.EndOfStream
            return data

    async def aclose(self) -> None:
        self._pipe.close()
        await anyio.lowlevel.checkpoint()


class PipeSendStream(anyio.abc.ByteSendStream):
    def __init__(self, file: IO[bytes]) -> None:
        self._pipe = _Pipe(file)
        self._rest = memoryview(b"")   # what a send cancelled midway had left to write

    async def send(self, item: bytes) -> None:
        await anyio.lowlevel.checkpoint()
        await self._drain()   # the rest of a send cancelled midway: items stay whole
        self._rest = memoryview(item)
        try:
            await self._drain()
        except anyio.get_cancelled_exc_class():
            if len(self._rest) == len(item):   # none of it written: not sent at all
                self._rest = memoryview(b"")
            raise

    async def _drain(self) -> None:
        """Write ``_rest`` out; cancelled, what is unwritten stays in it."""
        while self._rest:
            fd = self._pipe.fd
            if fd < 0:
                raise anyio.ClosedResourceError
            try:
                self._rest = self._rest[os.write(fd, self._rest):]
            except BlockingIOError:
                await anyio.wait_writable(fd)
            except OSError as exc:   # EPIPE: the child closed its stdin, or is gone
                self._rest = memoryview(b"")
                raise anyio.BrokenResourceError from exc

    async def aclose(self) -> None:
        self._rest = memoryview(b"")
        self._pipe.close()
        await anyio.lowlevel.checkpoint()


class Child(anyio.abc.Process):
    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        assert popen.stdin and popen.stdout and popen.stderr
        self._popen = popen
        self._stdin = PipeSendStream(popen.stdin)
        self._stdout = PipeReceiveStream(popen.stdout)
        self._stderr = PipeReceiveStream(popen.stderr)
        try:
            self._pidfd: int | None = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):   # not Linux, or a kernel before 5.3
            self._pidfd = None
        self._waiting = anyio.Lock()

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    @property
    def stdin(self) -> anyio.abc.ByteSendStream:
        return self._stdin

    @property
    def stdout(self) -> anyio.abc.ByteReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> anyio.abc.ByteReceiveStream:
        return self._stderr

    async def wait(self) -> int:
        async with self._waiting:   # one task waits on the pidfd at a time
            while (code := self._popen.poll()) is None:
                if self._pidfd is not None:
                    await anyio.wait_readable(self._pidfd)
                else:
                    await anyio.to_thread.run_sync(self._popen.wait, abandon_on_cancel=True)
        self._close_pidfd()
        return code

    def terminate(self) -> None:
        self._popen.terminate()

    def kill(self) -> None:
        self._popen.kill()

    def send_signal(self, signal: signal.Signals) -> None:
        self._popen.send_signal(signal)

    async def aclose(self) -> None:
        for stream in (self._stdin, self._stdout, self._stderr):
            await stream.aclose()
        try:
            await self.wait()
        except BaseException:
            self.kill()
            with anyio.CancelScope(shield=True):
                await self.wait()
            raise

    def _close_pidfd(self) -> None:
        pidfd, self._pidfd = self._pidfd, None
        if pidfd is not None:
            anyio.notify_closing(pidfd)
            os.close(pidfd)


def open_child(command: Sequence[str], *, cwd: str | None = None,
               env: Mapping[str, str] | None = None) -> Child:
    """Spawn ``command`` with three pipes (see the module docstring)."""
    popen = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=cwd, env=env, close_fds=True,
                             start_new_session=True, bufsize=0)
    try:
        return Child(popen)
    except BaseException:
        popen.kill()
        popen.wait()
        for file in (popen.stdin, popen.stdout, popen.stderr):
            if file is not None:
                file.close()
        raise
