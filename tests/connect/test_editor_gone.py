"""An editor that goes away on the stdout side: the adapter as a real process beside a
real ``acp-server serve``, its stdout a pipe the test closes, or never reads.

Before: a closed stdout made every later message of the server a traceback on stderr
(thousands in a streamed turn) while the adapter went on relaying for nobody; an
editor that closed stdin and read no more kept the adapter from ever exiting (its
last writes waited for ever)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import anyio
import pytest

from acp_server.connect.stdio import EditorWriter
from tests.connect.harness import ROOT
from tests.harness import ServeProcess

pytestmark = pytest.mark.anyio
LONG_TURN = "/chunks 20000 " + "y" * 20000   # streams for a while


def _adapter(url: str, stderr: IO[bytes]) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "ACP_SERVER_TOKEN"}
    return subprocess.Popen([sys.executable, "-m", "acp_server.connect.cli", url],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                            env={**env, "PYTHONPATH": ROOT})


def _send(process: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    assert process.stdin is not None
    process.stdin.write(json.dumps(message).encode() + b"\n")
    process.stdin.flush()


def _answer(process: subprocess.Popen[bytes], rpc_id: int) -> dict[str, Any]:
    assert process.stdout is not None
    while True:
        message: dict[str, Any] = json.loads(process.stdout.readline())
        if message.get("id") == rpc_id and "method" not in message:
            return message


def _turn_running(process: subprocess.Popen[bytes], workspace: Path) -> str:
    _send(process, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": 1}})
    _answer(process, 1)
    _send(process, {"jsonrpc": "2.0", "id": 2, "method": "session/new",
                    "params": {"cwd": str(workspace), "mcpServers": []}})
    sid: str = _answer(process, 2)["result"]["sessionId"]
    _send(process, {"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
                    "params": {"sessionId": sid,
                               "prompt": [{"type": "text", "text": LONG_TURN}]}})
    assert process.stdout is not None
    process.stdout.readline()   # the turn's first update: it streams now
    return sid


def _turn_ended(status: Any) -> bool:
    """The session closed (404), or open with no prompt running (``SessionStatus``)."""
    return bool(status.status_code == 404 or not status.json()["hasActivePrompt"])


def test_a_closed_stdout_stops_the_adapter_with_one_line(tmp_path: Path) -> None:
    log = tmp_path / "adapter.err"
    with ServeProcess(tmp_path) as server, log.open("wb") as stderr:
        process = _adapter(f"{server.base_url}/acp", stderr)
        try:
            sid = _turn_running(process, tmp_path)
            assert process.stdout is not None
            process.stdout.close()            # the editor's end of the pipe
            assert process.wait(timeout=30) == 0
            # its turn was cancelled (and the connection closed, as DELETE would); the
            # server closes the connection's sessions soon after its 202, not before it
            deadline = time.monotonic() + 30
            while not _turn_ended(server.http.get(f"/session/{sid}/status")):
                assert time.monotonic() < deadline, "the turn still runs"
        finally:
            process.kill()
            process.wait()
    said = log.read_text()
    assert "Traceback" not in said, said[:2000]
    assert said.count("closed its end of stdout") == 1, said


def test_an_editor_that_closes_stdin_and_reads_no_more_lets_it_exit(tmp_path: Path) -> None:
    log = tmp_path / "adapter.err"
    with ServeProcess(tmp_path) as server, log.open("wb") as stderr:
        process = _adapter(f"{server.base_url}/acp", stderr)
        try:
            sid = _turn_running(process, tmp_path)
            # unread, the pipe and the adapter's queue fill up (a few thousand updates)
            deadline = time.monotonic() + 60
            while server.http.get(f"/session/{sid}/status").json()["lastEventId"] < 4000:
                assert time.monotonic() < deadline
            assert process.stdin is not None
            process.stdin.close()             # stdout stays open, unread, full
            assert process.wait(timeout=60) == 0
        finally:
            process.kill()
            process.wait()
    assert "Traceback" not in log.read_text()


async def test_the_writer_drops_quietly_once_the_editor_is_gone() -> None:
    written: list[bytes] = []
    gone: list[bool] = []

    async def write(data: bytes) -> None:
        if written:
            raise BrokenPipeError(32, "Broken pipe")
        written.append(data)

    async with EditorWriter(write) as out:
        out.on_gone = lambda: gone.append(True)
        await out.send(b"one")
        with anyio.fail_after(10):
            while not out.gone:
                await out.send(b"more")
                await anyio.sleep(0)
        for _ in range(2000):   # past the queue: nothing waits, nothing raises
            await out.send(b"dropped")
    # one write went through (what was queued by then, in one batch), then none
    assert len(written) == 1 and written[0].startswith(b"one\n") and gone == [True]


async def test_leaving_the_writer_is_bounded_when_nothing_is_read() -> None:
    async def write(data: bytes) -> None:
        await anyio.sleep_forever()   # an editor that never reads

    with anyio.fail_after(10):
        async with EditorWriter(write, flush_s=0.2) as out:
            await out.send(b"never read")
