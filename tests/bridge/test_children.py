"""No agent process outlives the server: process groups and the stale-child record."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from bridge.agents.children import ChildRegistry
from bridge.agents.stdio import StdioAgentFactory
from tests.bridge.fake_agent_client import FakeClient
from tests.harness import ServeProcess


# An agent that answers initialize and session/new, starts a grandchild, and ignores stdin EOF and SIGTERM.
STUBBORN_AGENT = r"""
import json, os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
with open(sys.argv[1], "w") as fh:
    fh.write(str(child.pid))
for line in sys.stdin:
    msg = json.loads(line)
    result = {"initialize": {"protocolVersion": 1}, "session/new": {"sessionId": "s-1"}}
    if msg.get("method") in result:
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result[msg["method"]]}),
              flush=True)
while True:
    time.sleep(1)
"""


def gone(pid: int) -> bool:
    """Not running (absent, or a zombie waiting for a reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def wait_gone(pid: int, timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not gone(pid):
            await anyio.sleep(0.02)


@pytest.mark.anyio
async def test_aclose_stops_the_whole_process_group(tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN_AGENT)
    pid_file = tmp_path / "grandchild.pid"
    registry = ChildRegistry(str(tmp_path / "agents"))
    factory = StdioAgentFactory([sys.executable, str(script), str(pid_file)], cwd=str(tmp_path),
                                shutdown_grace_s=0.3, registry=registry)
    async with anyio.create_task_group() as tg:
        connection = await factory.connect(FakeClient(), tg)
        assert (await connection.request("initialize", {"protocolVersion": 1}))["protocolVersion"] == 1
        recorded = json.loads(Path(registry.path).read_text())
        assert list(recorded) == [str(connection.pid)]
        grandchild = int(pid_file.read_text())
        assert not gone(grandchild)
        await connection.aclose()
    await wait_gone(connection.pid)
    await wait_gone(grandchild)
    assert json.loads(Path(registry.path).read_text()) == {}


def test_reap_stale_kills_only_children_of_dead_servers(tmp_path):
    directory = tmp_path / "agents"
    directory.mkdir()
    argv = [sys.executable, "-c", "import time; time.sleep(300)"]
    orphan = subprocess.Popen(argv, start_new_session=True)
    spared = subprocess.Popen(argv, start_new_session=True)
    dead_server = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_server.wait()
    try:
        (directory / f"agents-{dead_server.pid}.json").write_text(json.dumps({str(orphan.pid): argv}))
        # a live server's record (our parent process stands in for it) is left alone
        (directory / f"agents-{os.getppid()}.json").write_text(json.dumps({str(spared.pid): argv}))
        # a recorded pid whose command line differs (a reused pid) is left alone too
        (directory / "agents-999999999.json").write_text(json.dumps({str(spared.pid): ["other"]}))
        assert ChildRegistry(str(directory)).reap_stale() == [orphan.pid]
        assert orphan.wait(timeout=5) == -signal.SIGKILL
        assert spared.poll() is None
        assert sorted(os.listdir(directory)) == [f"agents-{os.getppid()}.json"]
    finally:
        for proc in (orphan, spared):
            proc.kill()
            proc.wait()


def test_a_killed_server_leaves_no_agent_after_the_next_start(tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN_AGENT)
    agent = f"{sys.executable} {script} {tmp_path / 'grandchild.pid'}"

    def start() -> tuple[subprocess.Popen[str], str]:
        child = ServeProcess(tmp_path, "--agent", agent, cwd=tmp_path).start()
        assert child.process is not None
        return child.process, child.base_url

    import httpx

    first, url = start()
    try:
        response = httpx.post(url + "/session", json={}, timeout=10)
        assert response.status_code == 200, response.text
        agent_pid = int(next(iter(json.loads(
            next((tmp_path / "state" / "agents").glob("agents-*.json")).read_text()))))
        grandchild = int((tmp_path / "grandchild.pid").read_text())
    finally:
        first.kill()
        first.wait()
    assert not gone(agent_pid) and not gone(grandchild)   # the stubborn agent survived the kill
    second, _ = start()
    try:
        deadline = time.monotonic() + 5
        while not (gone(agent_pid) and gone(grandchild)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(agent_pid) and gone(grandchild)
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=10) == 0


def test_a_record_that_cannot_be_written_is_a_warning(tmp_path, caplog):
    """The state folder gone (renamed away): ``record`` and ``forget`` warn and return,
    the folder is not made anew under its name, and the next change once it is back
    writes every entry kept meanwhile."""
    state = tmp_path / "state"
    state.mkdir()
    registry = ChildRegistry(str(state / "agents"))
    state.rename(tmp_path / "away")
    with caplog.at_level(logging.WARNING, logger="bridge.agents.children"):
        registry.record(101, ["agent", "one"])
        registry.record(102, ["agent", "two"])
        registry.forget(101)
    assert not state.exists()
    assert "cannot record agent processes" in caplog.text
    (tmp_path / "away").rename(state)
    registry.record(103, ["agent", "three"])
    assert json.loads(Path(registry.path).read_text()) == {"102": ["agent", "two"],
                                                           "103": ["agent", "three"]}
