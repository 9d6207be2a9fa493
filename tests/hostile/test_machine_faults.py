"""Faults of the machine itself against a real ``acp-server serve`` process: "a fault
never ends the process" (``docs/operations.md``, "Faults of the machine").

* stdout and stderr whose reader is gone (the parent closed its ends of the pipes
  before the listening line): the server serves, and stops cleanly on SIGTERM;
* signals: SIGHUP drains like SIGTERM (one ignored at start, ``nohup``, stays so);
  two SIGTERMs in a row; a SIGINT while the store is still being opened ends the start
  cleanly;
* descriptors run out (a low ``RLIMIT_NOFILE`` set in the child): the silent
  connections that hold them are still closed after the header timeout, a new agent
  that cannot be spawned is a 503 ``agent_unavailable``, the store keeps committing,
  and everything comes back by itself;
* an agent whose executable loses its execute bit: a 503 in each door's shape, and
  the next request after it is restored works.

The store outages, full disks, hung agents and hostile headers are elsewhere
(``tests/store/test_outage_processes.py``, the rest of ``tests/hostile``).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.harness import ServeProcess, free_port, read_until_closed
from tests.harness.process import ROOT
from tests.lmsp.server import envelope

pytestmark = pytest.mark.anyio
SERVERS = pytest.mark.parametrize("server", ["granian", "uvicorn"])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only; the server is its own process


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ACP_SERVER_TOKEN"}
    env["PYTHONPATH"] = str(ROOT)
    return env


def serve_argv(workspace: Path, port: int, *flags: str) -> list[str]:
    return [sys.executable, "-m", "acp_server", "serve", "--port", str(port), "--workspace",
            str(workspace), "--state-dir", str(workspace / "state"), *flags]


async def until_healthy(base: str, process: subprocess.Popen[bytes]) -> None:
    """Poll ``/health`` until a 200 (the process must stay alive meanwhile)."""
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        with anyio.fail_after(30):
            while True:
                assert process.poll() is None, f"the server ended: {process.returncode}"
                try:
                    if (await client.get("/health")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await anyio.sleep(0.05)


def stop(process: subprocess.Popen[bytes], signum: int = signal.SIGTERM) -> int:
    process.send_signal(signum)
    try:
        return process.wait(20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture
def dead_pipes() -> Iterator[tuple[int, int]]:
    """Two pipes whose read ends are already closed: a write to either is EPIPE."""
    ends = []
    for _ in range(2):
        read, write = os.pipe()
        os.close(read)
        ends.append(write)
    try:
        yield ends[0], ends[1]
    finally:
        for fd in ends:
            os.close(fd)


# -- the terminal ---------------------------------------------------------------------------
@SERVERS
async def test_a_closed_stdout_and_stderr_do_not_end_the_server(
        tmp_path: Path, server: str, dead_pipes: tuple[int, int]) -> None:
    """The parent went away or closed its ends of the pipes: the listening line and
    every log line hit EPIPE (SIGPIPE is ignored by Python, so a write raises). The
    server serves every door and stops cleanly on SIGTERM, exit status 0."""
    port = free_port()
    out, err = dead_pipes
    process = subprocess.Popen(serve_argv(tmp_path, port, "--http-server", server),
                               stdout=out, stderr=err, env=child_env())
    try:
        base = f"http://127.0.0.1:{port}"
        await until_healthy(base, process)
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            made = await client.post("/session", json={"sessionScope": "thread"})
            assert made.status_code == 200, made.text
            task = await client.post("/lmsp/v1/tasks", json=envelope("logged into nothing"))
            assert task.status_code == 202, task.text
            missing = await client.get("/session/nope/status")   # logged as well
            assert missing.status_code == 404
        assert process.poll() is None
    finally:
        status = stop(process)
    assert status == 0


# -- agents that cannot be started ----------------------------------------------------------
def script_agent(folder: Path, name: str) -> Path:
    """An executable script that runs the honest fixture agent ``name``."""
    script = folder / f"{name}-agent"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -m tests.agents.fixture_agent "
                      f"--name {name}\n")
    script.chmod(0o755)
    return script


async def acp_session_new(client: httpx.AsyncClient, cwd: Path, agent: str) -> dict[str, Any]:
    """``session/new`` for ``agent`` over ``/acp`` (Streamable HTTP): the JSON-RPC answer."""
    init = await client.post("/acp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                           "params": {"protocolVersion": 1}})
    assert init.status_code == 200, init.text
    conn = {"Acp-Connection-Id": init.headers["acp-connection-id"]}
    async with client.stream("GET", "/acp", headers={**conn, "Accept": "text/event-stream"}
                             ) as stream:
        posted = await client.post("/acp", headers=conn, json={
            "jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {
                "cwd": str(cwd), "mcpServers": [], "_meta": {"acp-server/agent": agent}}})
        assert posted.status_code == 202, posted.text
        with anyio.fail_after(30):
            async for line in stream.aiter_lines():
                if line.startswith("data: "):
                    return json.loads(line[6:])  # type: ignore[no-any-return]
    raise AssertionError("the /acp stream ended")


async def lmsp_outcome(client: httpx.AsyncClient, task_id: str) -> dict[str, Any]:
    with anyio.fail_after(30):
        while True:
            task = (await client.get(f"/lmsp/v1/tasks/{task_id}")).json()
            if task["status"] in ("succeeded", "failed", "cancelled"):
                return task  # type: ignore[no-any-return]
            await anyio.sleep(0.05)


async def test_an_agent_that_lost_its_execute_bit_is_503_in_each_door(tmp_path: Path) -> None:
    """The agent's executable loses its execute bit after start-up (an upgrade half
    done, a wrong chmod): a new session is a 503 ``agent_unavailable`` naming the agent
    and the reason in REST and ``/acp`` (not a 500), an LMSP task for it fails with that
    code rather than hanging; once the bit is back, the next request starts the agent.
    The workspace (the agent's folder) deleted: the same 503, naming the folder."""
    script = script_agent(tmp_path, "flaky")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with ServeProcess(workspace, "--agent", f"flaky={script}", "--agent", "reference",
                            state_dir=tmp_path / "state") as daemon:
        script.chmod(0o644)
        rest = await daemon.client.post("/session", json={"agent": "flaky",
                                                           "sessionScope": "thread"})
        assert rest.status_code == 503, rest.text
        assert rest.headers["retry-after"] == "5"
        body = rest.json()
        assert (body["code"], body["agent"], body["reason"]) == (
            "agent_unavailable", "flaky", "EACCES")
        assert "Cannot start agent 'flaky'" in body["error"]
        answer = await acp_session_new(daemon.client, workspace, "flaky")
        assert answer["id"] == 1 and answer["error"]["code"] == -32603, answer
        assert answer["error"]["data"] == {"errorKind": "agent_unavailable", "agent": "flaky",
                                           "reason": "EACCES", "retryable": True}
        made = await daemon.client.post("/lmsp/v1/tasks", json={
            "type": "response", "input": {"model": "flaky", "input": "hello"}})
        assert made.status_code == 202, made.text
        failed = await lmsp_outcome(daemon.client, made.json()["id"])
        assert failed["status"] == "failed", failed
        assert failed["error"]["code"] == "agent_unavailable", failed
        assert (await daemon.client.post("/session", json={})).status_code == 200  # others go on
        script.chmod(0o755)
        workspace.rmdir()
        gone = await daemon.client.post("/session", json={"agent": "flaky",
                                                           "sessionScope": "thread"})
        assert gone.status_code == 503, gone.text
        assert (gone.json()["code"], gone.json()["reason"]) == ("agent_unavailable", "ENOENT")
        assert f"its folder {workspace} is gone" in gone.json()["error"]
        workspace.mkdir()
        again = await daemon.client.post("/session", json={"agent": "flaky",
                                                            "sessionScope": "thread"})
        assert again.status_code == 200, again.text
        assert daemon.returncode is None


# -- out of file descriptors ----------------------------------------------------------------
FD_LIMIT = 64   # what the child gets (soft = hard: the server cannot raise it)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def test_silent_connections_are_closed_at_the_descriptor_limit(tmp_path: Path) -> None:
    """granian holds a connection that says nothing for ever; the silence sweep closes
    it after the header timeout. With every descriptor taken by such connections the
    sweep cannot open ``/proc/self/fd`` nor duplicate one: it must still close them,
    or the server stays full for as long as the clients like. They are all closed
    (those granian could not accept yet too, once it can), and the server answers."""
    async with ServeProcess(tmp_path, "--header-timeout-ms", "2000", "--http-server",
                            "granian", shell_prefix=f"ulimit -n {FD_LIMIT};") as daemon:
        silent = [await daemon.raw() for _ in range(FD_LIMIT)]
        with anyio.fail_after(10):   # accepted until the process is out of descriptors
            while open_fds(daemon.pid) < FD_LIMIT:
                await anyio.sleep(0.01)
        with anyio.fail_after(30):
            for stream in silent:
                assert await read_until_closed(stream) == b""
        async with httpx.AsyncClient(base_url=daemon.base_url, timeout=10) as client:
            assert (await client.get("/health")).status_code == 200
        assert daemon.returncode is None
        assert "Traceback" not in daemon.stderr_text()


def agent_pid(parent: int, name: str) -> int:
    """The pid of the fixture agent ``--name name`` started by ``parent``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"tests.agents.fixture_agent" in argv \
                and argv[argv.index(b"--name") + 1] == name.encode():
            return int(entry.name)
    raise AssertionError(f"no agent {name} under {parent}")


AGENTS = 16


async def start_until_refused(daemon: ServeProcess) -> tuple[list[str], httpx.Response, int]:
    """Sessions on agents ``a0``, ``a1``, ... until a start is refused: the agents
    started, the refusal, and the server's descriptor count just before it."""
    started: list[str] = []
    for n in range(AGENTS):
        count = open_fds(daemon.pid)
        made = await daemon.client.post("/session", json={"agent": f"a{n}",
                                                          "sessionScope": "thread"})
        if made.status_code != 200:
            return started, made, count
        started.append(f"a{n}")
    raise AssertionError(f"{AGENTS} agents started under {FD_LIMIT} descriptors")


@SERVERS
async def test_out_of_descriptors_agents_wait_and_the_store_commits(tmp_path: Path,
                                                                    server: str) -> None:
    """Agents take descriptors (their pipes) until the process has none: the next
    agent's start is a 503 ``agent_unavailable`` (``EMFILE``), not a 500; an LMSP task
    for that agent is acknowledged and waits (queued again, not failed); on a connection
    already open, LMSP work on another agent commits and ``/health?deep=1`` is 200.
    Half the agents die (descriptors come back): the waiting task runs, the agent starts and
    a connection left in the backlog meanwhile is accepted and answered, with nothing
    done by hand."""
    flags = [f"--agent=a{n}={script_agent(tmp_path, f'a{n}')}" for n in range(AGENTS)]
    async with ServeProcess(tmp_path, *flags, "--agent", "reference", "--http-server", server,
                            shell_prefix=f"ulimit -n {FD_LIMIT};") as daemon:
        client = daemon.client   # its one keep-alive connection, opened now
        assert (await client.get("/health")).status_code == 200
        started, made, _ = await start_until_refused(daemon)
        n = len(started)
        refused = made.json()
        assert made.status_code == 503 and made.headers["retry-after"] == "5", made.text
        assert refused["code"] == "agent_unavailable" and refused["agent"] == f"a{n}"
        assert refused["reason"] in ("EMFILE", "unknown"), refused   # uvloop: -1
        assert len(started) >= 2
        waiting = await client.post("/lmsp/v1/tasks", json={
            "type": "response", "input": {"model": f"a{n}", "input": "when there is room"}})
        assert waiting.status_code == 202, waiting.text
        done = await client.post("/lmsp/v1/tasks", json=envelope("committed meanwhile"))
        assert done.status_code == 202, done.text
        assert (await lmsp_outcome(client, done.json()["id"]))["status"] == "succeeded"
        deep = await client.get("/health", params={"deep": "1"})
        assert deep.status_code == 200, deep.text
        knocking = await daemon.raw()   # in the backlog: no descriptor to accept it with
        await knocking.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        for name in started[: max(2, len(started) // 2)]:   # room for a start or two
            os.kill(agent_pid(daemon.pid, name), signal.SIGKILL)
        try:
            ran = await lmsp_outcome(client, waiting.json()["id"])
        except TimeoutError:   # say what the server was doing (a CI run saw it wait)
            raise AssertionError(f"the waiting task did not run: "
                                 f"{daemon.stderr_text()[-3000:]}") from None
        assert ran["status"] == "succeeded", ran
        with anyio.fail_after(20):
            while (await client.post("/session", json={"agent": f"a{n}"})).status_code != 200:
                await anyio.sleep(0.05)
        with anyio.fail_after(20):   # the accept loop lived through it: answered now
            answer = await read_until_closed(knocking) if server == "uvicorn" else \
                await knocking.receive()
        if server == "granian":
            assert answer.startswith(b"HTTP/1.1 200"), answer
        else:   # its connection cap, lowered to 1 by the limit, is held by ``client``
            assert answer.startswith(b"HTTP/1.1 503") and b"connection_limit" in answer
        assert daemon.returncode is None
        assert "Traceback" not in daemon.stderr_text()


@SERVERS
async def test_a_start_refused_for_want_of_descriptors_leaks_none(tmp_path: Path,
                                                                  server: str) -> None:
    """uvloop's spawn (agents are no longer spawned by it: ``bridge.agents.child``),
    failing in the middle for want of descriptors, kept the pipes it had made
    (MagicStack/uvloop#185): the first start refused at the limit took
    the descriptors that were left for good, and once agents died to make room, each
    start tried took theirs too. Agents fill the process: the start refused (503
    ``EMFILE``), and three more tried, leave its descriptor count as it was. One agent
    dies: the next start succeeds."""
    flags = [f"--agent=a{n}={script_agent(tmp_path, f'a{n}')}" for n in range(AGENTS)]
    async with ServeProcess(tmp_path, *flags, "--http-server", server,
                            shell_prefix=f"ulimit -n {FD_LIMIT};") as daemon:
        client = daemon.client
        started, made, count = await start_until_refused(daemon)
        n = len(started)
        assert len(started) >= 2
        for attempt in range(4):     # the refused start, then three more
            if attempt:
                made = await client.post("/session", json={"agent": f"a{n}",
                                                           "sessionScope": "thread"})
            assert made.status_code == 503 and made.json()["reason"] == "EMFILE", made.text
            assert open_fds(daemon.pid) <= count   # a leak only adds
        os.kill(agent_pid(daemon.pid, started[0]), signal.SIGKILL)
        with anyio.fail_after(20):   # its pipes closed: room for one
            while (await client.post("/session", json={"agent": f"a{n}"})).status_code != 200:
                await anyio.sleep(0.05)
        assert daemon.returncode is None


# -- signals --------------------------------------------------------------------------------
# sessions that end with the process: the drain closes them, their streams end with
# ``session_closed`` (a journaled session's show nothing of the drain)
MEMORY = ("--session-journal", "memory")


async def closed_with(daemon: ServeProcess, signals: list[int]) -> list[str]:
    """Open a session's event stream, send ``signals`` to the server back to back, and
    read the stream to its end: its ``data:`` lines."""
    sid = (await daemon.client.post("/session", json={})).json()["sessionId"]
    lines: list[str] = []
    async with httpx.AsyncClient(base_url=daemon.base_url, timeout=20) as reader:
        async with reader.stream("GET", f"/session/{sid}/events") as events:
            assert events.status_code == 200
            for signum in signals:
                os.kill(daemon.pid, signum)
            with anyio.fail_after(20):
                async for line in events.aiter_lines():
                    if line.startswith("data:"):
                        lines.append(line)
    return lines


@SERVERS
async def test_sighup_drains_like_sigterm(tmp_path: Path, server: str) -> None:
    """The terminal the server was started from goes away (SIGHUP): it drains as on
    SIGTERM (streams end with ``session_closed``: on the in-memory journal, whose
    sessions end with the process; a journaled one's stream ends after its last
    committed event, ``tests/store/test_clean_stop_readers.py``) and exits 0, rather
    than dying of the signal with nothing drained."""
    async with ServeProcess(tmp_path, "--http-server", server, *MEMORY) as daemon:
        lines = await closed_with(daemon, [signal.SIGHUP])
        assert json.loads(lines[-1][5:])["type"] == "session_closed", lines
        assert await anyio.to_thread.run_sync(daemon.process.wait, 20) == 0
        assert "received SIGHUP: draining" in daemon.stderr_text()


async def test_a_sighup_ignored_at_start_stays_ignored(tmp_path: Path) -> None:
    """Started with SIGHUP ignored (``nohup``, ``trap '' HUP``: the caller asked that the
    terminal going away not stop it), the server leaves it ignored (it caught it,
    overriding the inherited ignore, and drained): a SIGHUP then a SIGTERM drain on the
    SIGTERM."""
    async with ServeProcess(tmp_path, shell_prefix="trap '' HUP;") as daemon:
        status = Path(f"/proc/{daemon.pid}/status").read_text()
        ignored = int(next(line for line in status.splitlines()
                           if line.startswith("SigIgn:")).split()[1], 16)
        assert ignored & (1 << (signal.SIGHUP - 1)), status   # not caught: still ignored
        os.kill(daemon.pid, signal.SIGHUP)   # discarded by the kernel, as nohup meant
        os.kill(daemon.pid, signal.SIGTERM)
        assert await anyio.to_thread.run_sync(daemon.process.wait, 20) == 0
        log = daemon.stderr_text()
        assert "received SIGTERM: draining" in log and "SIGHUP" not in log, log[-2000:]


@SERVERS
async def test_two_sigterms_back_to_back_exit_0(tmp_path: Path, server: str) -> None:
    """A second SIGTERM while the first drains skips the wait for open connections:
    still a clean exit 0, the stream ended with ``session_closed`` (the in-memory
    journal: the drain's last event, which the second signal must not cut), no
    traceback."""
    async with ServeProcess(tmp_path, "--http-server", server, *MEMORY) as daemon:
        lines = await closed_with(daemon, [signal.SIGTERM, signal.SIGTERM])
        assert json.loads(lines[-1][5:])["type"] == "session_closed", lines
        assert await anyio.to_thread.run_sync(daemon.process.wait, 20) == 0
        assert "Traceback" not in daemon.stderr_text()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_a_signal_while_the_store_is_being_opened_stops_cleanly(tmp_path: Path,
                                                                     signum: int) -> None:
    """The store is still being opened (its SQLite file locked by another process: the
    open waits its busy timeout) when SIGINT or SIGTERM comes: the start stops once the
    open returns, one log line, exit 0, no ``KeyboardInterrupt`` traceback."""
    db = tmp_path / "lmsp.db"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("CREATE TABLE held (x)")
    holder.execute("BEGIN EXCLUSIVE")
    child = ServeProcess(tmp_path, "--store", f"sqlite:///{db}",
                         "--store-busy-timeout-ms", "2000")
    child.stderr_path.parent.mkdir(parents=True, exist_ok=True)
    with open(child.stderr_path, "a") as stderr:
        process = subprocess.Popen(child.argv, stdout=subprocess.DEVNULL, stderr=stderr,
                                   env=child_env())
    try:
        with anyio.fail_after(30):   # the store's open has begun: the file is open
            while str(db) not in _open_files(process.pid):
                assert process.poll() is None, child.stderr_text()
                await anyio.sleep(0.01)
        process.send_signal(signum)
        assert await anyio.to_thread.run_sync(process.wait, 20) == 0, child.stderr_text()
        log = child.stderr_text()
        assert f"received {signal.Signals(signum).name} while starting: stopping" in log, log
        assert "Traceback" not in log and "KeyboardInterrupt" not in log, log
        assert "trying again" not in log, log   # no next try announced after the stop
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        if process.poll() is None:
            process.kill()
            process.wait()


def _fds(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []


def _open_files(pid: int) -> set[str]:
    """What ``pid``'s descriptors point at now (one closed while looked at is skipped:
    a CI run saw the listing name a descriptor gone by its ``readlink``)."""
    found = set()
    for fd in _fds(pid):
        try:
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return found


# -- the state folder under the server's feet -----------------------------------------------
async def create_tasks(client: httpx.AsyncClient, count: int) -> list[str]:
    ids = []
    for n in range(count):
        made = await client.post("/lmsp/v1/tasks", json=envelope(f"kept {n}"))
        assert made.status_code == 202, made.text
        ids.append(made.json()["id"])
    return ids


async def refused_for_the_store(client: httpx.AsyncClient) -> None:
    answer = await client.post("/lmsp/v1/tasks", json=envelope("never acknowledged"))
    assert answer.status_code == 503, answer.text
    assert answer.json()["code"] == "store_unavailable" and answer.headers["retry-after"]


async def test_the_wal_deleted_while_running_loses_nothing_acknowledged(tmp_path: Path
                                                                        ) -> None:
    """The state folder's ``lmsp.sqlite3-wal`` and ``-shm`` deleted under a running
    server (a clean-up script, another process's last close): what was committed lives
    only in the unlinked WAL, and a crash then lost all of it. The server copies it into
    the database file at once, acknowledges nothing more into the unlinked WAL (503,
    ``/health?deep=1`` says so and what to do) and keeps running; after a ``kill -9``
    and a restart every acknowledged task and the session are there."""
    child = ServeProcess(tmp_path).start()
    state = tmp_path / "state"
    try:
        client = child.http
        sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as aclient:
            kept = await create_tasks(aclient, 5)
            for name in ("lmsp.sqlite3-wal", "lmsp.sqlite3-shm"):
                os.unlink(state / name)
            await refused_for_the_store(aclient)
            health = await aclient.get("/health", params={"deep": "1"})
            assert health.status_code == 503
            reason = health.json()["store"]["reason"]
            assert "WAL" in reason and "restart" in reason, reason
            assert child.returncode is None
    finally:
        child.kill()
    assert "deleted or replaced" in child.stderr_text()
    with ServeProcess(tmp_path) as again:
        for task_id in kept:
            assert again.http.get(f"/lmsp/v1/tasks/{task_id}").status_code == 200
        assert again.http.get(f"/session/{sid}/status").status_code == 200


async def test_the_state_folder_moved_away_and_back(tmp_path: Path) -> None:
    """The state folder renamed away under a running server: it answers 503 for the
    store, says so in ``/health?deep=1``, keeps running, and resumes by itself once the
    folder is back under its name (the very same files); nothing acknowledged is lost."""
    state, away = tmp_path / "state", tmp_path / "state.away"
    child = ServeProcess(tmp_path).start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            kept = await create_tasks(client, 3)
            state.rename(away)
            await refused_for_the_store(client)
            health = await client.get("/health", params={"deep": "1"})
            assert health.status_code == 503
            assert "deleted or replaced" in health.json()["store"]["reason"]
            away.rename(state)
            with anyio.fail_after(20):
                while (answer := await client.post("/lmsp/v1/tasks", json=envelope("back"))
                       ).status_code != 202:
                    assert answer.status_code == 503, answer.text
                    await anyio.sleep(0.05)
            kept.append(answer.json()["id"])
            assert (await client.get("/health", params={"deep": "1"})).status_code == 200
            assert child.returncode is None
    finally:
        child.kill()
    with ServeProcess(tmp_path) as again:
        for task_id in kept:
            assert again.http.get(f"/lmsp/v1/tasks/{task_id}").status_code == 200


async def test_an_agent_starts_while_the_state_disk_is_full(tmp_path: Path) -> None:
    """The state folder's disk is full when an agent is to start: the record of its
    process (kept there so that a crash leaves no agent behind) cannot be written. That
    is no reason to fail, nor to leave the started process without an owner (it was a
    500 with the agent running on, unowned): the agent runs, the session is a 200 or
    the journal's 503 ``store_unavailable`` (its commit needs the disk too), the log
    says what was not recorded; once there is room again sessions on it are created,
    and a clean stop leaves no agent behind."""
    from tests.store.test_outage_processes import fill, tmpfs

    script = script_agent(tmp_path, "late")
    state = tmp_path / "state"
    with tmpfs(state, "16m"):
        async with ServeProcess(tmp_path, "--agent", f"late={script}",
                                "--agent", "reference") as daemon:
            fill(state / "fill")
            made = await daemon.client.post("/session", json={"agent": "late",
                                                               "sessionScope": "thread"})
            assert made.status_code == 200 or made.json()["code"] == "store_unavailable", \
                made.text
            pid = agent_pid(daemon.pid, "late")
            (state / "fill").unlink()
            with anyio.fail_after(20):
                while (await daemon.client.post("/session", json={"agent": "late"})
                       ).status_code != 200:
                    await anyio.sleep(0.05)
            assert agent_pid(daemon.pid, "late") == pid   # the same process serves it
        assert daemon.returncode == 0
        assert "cannot record agent process" in daemon.stderr_text()
        with anyio.fail_after(10):   # stopped with the server, not left running
            while Path(f"/proc/{pid}").exists():
                await anyio.sleep(0.05)
