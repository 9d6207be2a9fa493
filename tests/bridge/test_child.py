"""``bridge.agents.child``: an agent's process and its three pipes, on asyncio (and
uvloop, what ``serve`` runs on) and trio."""

from __future__ import annotations

import json
import os
import signal
import sys

import anyio
import pytest

from bridge.agents.child import open_child

pytestmark = pytest.mark.anyio

UVLOOP = pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")


@pytest.fixture(params=["asyncio", UVLOOP, "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


def script(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def own_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_the_child_gets_fds_0_to_2_and_nothing_else() -> None:
    """Under uvloop's spawn the child kept inheritable copies of its pipes and of the
    server's other inheritable descriptors."""
    inherited = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(inherited, True)
    try:
        child = open_child(script("import os, json; print(json.dumps(sorted("
                                  "int(f) for f in os.listdir('/proc/self/fd'))))"))
        out = b""
        with anyio.fail_after(20):
            try:
                while True:
                    out += await child.stdout.receive()
            except anyio.EndOfStream:
                pass
            assert await child.wait() == 0
        # 0-2 and the descriptor ``listdir`` itself opened
        assert len(json.loads(out)) == 4 and json.loads(out)[:3] == [0, 1, 2]
        await child.aclose()
    finally:
        os.close(inherited)


async def test_a_child_that_closes_its_stdout_and_lives_on_is_seen_to() -> None:
    child = open_child(script("import os, sys, time; os.close(1); sys.stdin.read()"))
    with anyio.fail_after(20):
        with pytest.raises(anyio.EndOfStream):
            while True:
                await child.stdout.receive()
        assert child.returncode is None
        await child.stdin.aclose()           # its read() ends: it exits
        assert await child.wait() == 0


async def test_any_number_of_tasks_wait_for_the_exit() -> None:
    child = open_child(script("import sys; sys.stdin.read(); sys.exit(3)"))
    codes: list[int] = []

    async def wait() -> None:
        codes.append(await child.wait())

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(wait)
            await child.stdin.send(b"bye")
            await child.stdin.aclose()
    assert codes == [3, 3, 3] and child.returncode == 3
    await child.aclose()


async def test_a_close_wakes_a_task_waiting_to_read() -> None:
    child = open_child(script("import sys; sys.stdin.read()"))
    caught: list[BaseException] = []

    async def read() -> None:
        try:
            await child.stdout.receive()
        except anyio.ClosedResourceError as exc:
            caught.append(exc)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()
            await child.stdout.aclose()
        await child.aclose()
    assert len(caught) == 1 and child.returncode == 0


async def test_a_write_to_a_child_gone_is_a_broken_resource() -> None:
    child = open_child(script("pass"))
    with anyio.fail_after(20):
        await child.wait()
        with pytest.raises(anyio.BrokenResourceError):
            for _ in range(64):   # a pipe's buffer may take the first ones
                await child.stdin.send(b"x" * 65536)
    await child.aclose()


async def test_a_spawn_that_fails_leaves_no_descriptor() -> None:
    before = own_fds()
    for _ in range(3):
        with pytest.raises(OSError):
            open_child(["/nonexistent/agent"])
    assert own_fds() == before


async def test_aclose_cancelled_kills_the_child() -> None:
    child = open_child(script("import time; time.sleep(600)"))
    with anyio.move_on_after(0.05) as scope:   # cancels the wait inside aclose
        await child.aclose()
    assert scope.cancelled_caught
    assert child.returncode is not None and child.returncode < 0


async def test_a_send_cancelled_midway_never_cuts_a_line_in_two() -> None:
    """The child reads nothing until told (its pipe fills): a 300 KB line's send is
    cancelled midway, the next line's send writes the rest of it first, and one
    cancelled before any of it went is not sent at all."""
    child = open_child(script(
        "import signal, sys\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\n"
        "print('ready', flush=True)\n"
        "signal.sigwait({signal.SIGUSR1})\n"
        "print([len(line) for line in sys.stdin.buffer], flush=True)\n"))
    with anyio.fail_after(20):
        ready = b""
        while not ready.endswith(b"\n"):   # one write or two (PYTHONUNBUFFERED)
            ready += await child.stdout.receive()
        assert ready == b"ready\n"
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(child.stdin.send, b"x" * 300_000 + b"\n")
                await anyio.wait_all_tasks_blocked()   # the pipe is full
                scope.cancel()
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(child.stdin.send, b"never\n")   # waits for the rest
                await anyio.wait_all_tasks_blocked()
                scope.cancel()
        child.send_signal(signal.SIGUSR1)
        await child.stdin.send(b"second\n")
        await child.stdin.aclose()
        out = b""
        try:
            while True:
                out += await child.stdout.receive()
        except anyio.EndOfStream:
            pass
        assert out == b"[300001, 7]\n"
        await child.aclose()
