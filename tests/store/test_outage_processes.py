"""Real store outages against a real server process (``acp-server serve``): SQLite's
disk full on a tiny tmpfs (for tasks, and for the session journal), its file locked by
another process, its file deleted; PostgreSQL restarted (``pg_ctl restart -m fast``)
and its backends terminated mid-load.

Every case checks the same contract: the process survives; each answer is a 202 or a
503 ``store_unavailable`` problem (never a 500, never a dropped connection); every
task acknowledged with 202 reaches a terminal state once the store is back; and
``/health?deep=1`` says the store is down while it is.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from pathlib import Path


import anyio
import httpx
import psycopg
import pytest

from tests.lmsp import stores
from tests.harness import ServeProcess, free_port
from tests.lmsp.server import envelope

pytestmark = pytest.mark.anyio
PG_SCRIPT = Path(__file__).resolve().parents[1] / "lmsp" / "pg.sh"
TERMINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only; the server is its own process


@contextlib.contextmanager
def server(workspace: Path, *flags: str) -> Iterator[tuple[ServeProcess, str]]:
    """``acp-server serve`` with ``flags``; (the process, its base URL)."""
    child = ServeProcess(workspace, *flags).start()
    try:
        yield child, child.base_url
    finally:
        child.kill()


class Load:
    """Creates tasks from ``clients`` connections until ``stop`` (at most ``limit`` each);
    records every answer. Anything but 202 or a 503 ``store_unavailable`` problem, or
    a transport error, is a failure."""

    def __init__(self) -> None:
        self.statuses: Counter[int] = Counter()
        self.accepted: list[str] = []
        self.failures: list[str] = []
        self.stop = anyio.Event()

    async def run(self, url: str, clients: int = 4, limit: int = 400) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client, \
                anyio.create_task_group() as tg:
            for _ in range(clients):
                tg.start_soon(self._client, client, limit)

    async def _client(self, client: httpx.AsyncClient, limit: int) -> None:
        for _ in range(limit):
            if self.stop.is_set():
                return
            try:
                answer = await client.post("/lmsp/v1/tasks", json=envelope("load"))
            except httpx.HTTPError as exc:
                self.failures.append(f"transport: {exc!r}")
                continue
            self.statuses[answer.status_code] += 1
            if answer.status_code == 202:
                self.accepted.append(answer.json()["id"])
            elif answer.status_code == 503 and answer.headers.get("retry-after") and \
                    answer.json().get("code") == "store_unavailable":
                await anyio.sleep(0.05)
            else:
                self.failures.append(f"{answer.status_code}: {answer.text[:200]}")


async def wait_terminal(url: str, ids: list[str], timeout: float = 60) -> Counter[str]:
    """Each task's final status (503s while the store is still coming back are retried)."""
    outcome: Counter[str] = Counter()
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        with anyio.fail_after(timeout):
            for task_id in ids:
                while True:
                    answer = await client.get(f"/lmsp/v1/tasks/{task_id}")
                    assert answer.status_code in (200, 503), answer.text
                    if answer.status_code == 200 and answer.json()["status"] in TERMINAL:
                        outcome[answer.json()["status"]] += 1
                        break
                    await anyio.sleep(0.02)
    return outcome


async def until_created(url: str, tries: int = 500) -> str:
    """A create that is accepted (the store is back), retrying its 503s."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for _ in range(tries):
            answer = await client.post("/lmsp/v1/tasks", json=envelope("after"))
            if answer.status_code == 202:
                return str(answer.json()["id"])
            assert answer.status_code == 503 and answer.json()["code"] == "store_unavailable"
            await anyio.sleep(0.05)
    raise AssertionError("the store never came back")


async def deep_health(url: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        return await client.get("/health", params={"deep": "1"})


# -- SQLite -------------------------------------------------------------------------------
@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[None]:
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                           str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); "
                    f"tests/store/test_outage_http.py covers the case with injected faults")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path) -> None:
    """Write ``path`` until the file system is full (unbuffered: a buffered file would
    flush its refused tail again at close and raise there)."""
    with open(path, "wb", buffering=0) as out:
        chunk = b"\0" * 65536
        while True:
            try:
                out.write(chunk)
                out.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                return


async def test_sqlite_disk_full_on_a_tiny_tmpfs(tmp_path: Path) -> None:
    small = tmp_path / "small"
    # roomy enough that the load before the fill does not fill it: the WAL of 40 tasks
    # is a few MiB, more on a busy machine, where the group commits are smaller
    with tmpfs(small, "64m"), server(tmp_path, "--store", f"sqlite:///{small / 'lmsp.db'}",
                                    "--max-running-tasks", "4") as (proc, url):
        load = Load()
        await load.run(url, clients=2, limit=20)
        assert not load.failures and load.statuses == Counter({202: 40}), load.statuses
        fill(small / "fill")
        full = Load()
        await full.run(url, clients=2, limit=60)
        assert not full.failures, full.failures
        assert full.statuses[503] > 0, full.statuses
        health = await deep_health(url)
        assert health.status_code == 503 and health.json()["store"]["status"] == "down"
        assert proc.returncode is None
        (small / "fill").unlink()
        last = await until_created(url)
        outcome = await wait_terminal(url, [*load.accepted, *full.accepted, last])
        assert sum(outcome.values()) == len(load.accepted) + len(full.accepted) + 1
        assert proc.returncode is None
        assert (await deep_health(url)).status_code == 200


async def test_a_start_on_a_read_only_state_folder_waits_for_it(tmp_path: Path) -> None:
    """The state folder read-only at start (a tmpfs remounted ``ro``): the process
    answers 503 (``/health``: starting) and starts by itself once it is writable."""
    state = tmp_path / "ro"
    with tmpfs(state, "8m"):
        subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
        listen_at = free_port()
        child = ServeProcess(tmp_path, "--state-dir", str(state), "--port", str(listen_at))
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.to_thread.run_sync, child.start)
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{listen_at}",
                                             timeout=10) as client:
                    with anyio.fail_after(30):
                        while "cannot start" not in child.stderr_text():
                            await anyio.sleep(0.05)
                    health = await client.get("/health")
                    assert (health.status_code, health.json()) == (503, {"status": "starting"})
                    subprocess.run(["mount", "-o", "remount,rw", str(state)], check=True)
            assert child.http.post("/lmsp/v1/tasks", json=envelope("after")).status_code == 202
            assert "SQLITE_CANTOPEN" in child.stderr_text() or "Read-only" in child.stderr_text()
            assert "Traceback" not in child.stderr_text()
            assert child.stop() == 0
        finally:
            child.kill()


async def test_sqlite_locked_by_another_process(tmp_path: Path) -> None:
    db = tmp_path / "lmsp.db"
    with server(tmp_path, "--store", f"sqlite:///{db}", "--store-busy-timeout-ms",
                "300") as (proc, url):
        before = await until_created(url)
        holder = sqlite3.connect(db, isolation_level=None, timeout=5)
        holder.execute("BEGIN EXCLUSIVE")   # the writer waits 0.3 s, then gives up
        try:
            load = Load()
            await load.run(url, clients=2, limit=3)
            assert not load.failures, load.failures
            assert load.statuses == Counter({503: 6}), load.statuses
            health = await deep_health(url)
            assert health.status_code == 503 and "locked" in health.json()["store"]["reason"]
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        after = await until_created(url)
        assert sum((await wait_terminal(url, [before, after])).values()) == 2
        assert proc.returncode is None


async def test_sqlite_file_deleted_while_running(tmp_path: Path) -> None:
    db = tmp_path / "lmsp.db"
    with server(tmp_path, "--store", f"sqlite:///{db}") as (proc, url):
        task_id = await until_created(url)
        await wait_terminal(url, [task_id])
        os.unlink(db)
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            for _ in range(3):   # never acknowledged into the unlinked inode
                answer = await client.post("/lmsp/v1/tasks", json=envelope("lost"))
                assert answer.status_code == 503 and answer.headers["retry-after"]
                assert answer.json()["code"] == "store_unavailable"
            assert (await client.get(f"/lmsp/v1/tasks/{task_id}")).status_code == 503
        health = await deep_health(url)
        assert health.status_code == 503
        assert "deleted or replaced" in health.json()["store"]["reason"]
        assert proc.returncode is None


async def test_a_live_session_loads_on_a_lost_store_and_an_unknown_id_is_a_503(
        tmp_path: Path) -> None:
    """Every load reads the session's journal record (``Bridge.recall_owner``: so that
    another principal's id costs the read an unknown one does); with the database file
    deleted under the server (found by the next write), a live session's owner still
    loads it (what this instance
    knows holds), an id it knows nothing of is 503 ``store_unavailable``, and the
    process lives."""
    db = tmp_path / "lmsp.db"
    with server(tmp_path, "--store", f"sqlite:///{db}") as (proc, url):
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            made = await client.post("/session", json={"sessionScope": "thread"})
            assert made.status_code == 200, made.text
            sid = made.json()["sessionId"]
            os.unlink(db)
            lost = await client.post("/session", json={"sessionScope": "thread"})
            assert lost.status_code == 503   # the next write finds the file gone
            loaded = await client.post(f"/session/{sid}/load", json={})
            assert loaded.status_code == 200, loaded.text
            assert loaded.json()["sessionId"] == sid
            unknown = await client.post("/session/never-made/load", json={})
            assert unknown.status_code == 503 and unknown.headers["retry-after"]
            assert unknown.json()["code"] == "store_unavailable"
        assert proc.returncode is None


def test_state_files_are_private(tmp_path: Path) -> None:
    from acp_server.store import prepare_state_dir
    from acp_server.store.sqlite import private_files

    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    prepare_state_dir(str(state))
    assert state.stat().st_mode & 0o777 == 0o700
    db = state / "lmsp.sqlite3"
    for name in (db, state / "lmsp.sqlite3-wal"):
        name.write_bytes(b"")
        os.chmod(name, 0o644)
    private_files(str(db))
    assert {(p.name, p.stat().st_mode & 0o777) for p in state.iterdir()} == {
        ("lmsp.sqlite3", 0o600), ("lmsp.sqlite3-wal", 0o600)}
    fresh = tmp_path / "fresh" / "x.sqlite3"
    prepare_state_dir(str(fresh.parent))
    private_files(str(fresh))
    assert fresh.stat().st_mode & 0o777 == 0o600


# -- PostgreSQL ---------------------------------------------------------------------------
@pytest.fixture
def own_cluster() -> Iterator[Path]:
    """A throwaway PostgreSQL cluster of this test's own (it gets restarted), in a
    folder the ``postgres`` user can reach."""
    directory = Path(tempfile.mkdtemp(prefix="acp-outage-pg."))
    started = subprocess.run(["bash", str(PG_SCRIPT), "start", str(directory),
                              str(free_port())], capture_output=True, text=True)
    if started.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        pytest.skip(f"no PostgreSQL cluster could be started: {started.stderr[-300:]}")
    os.environ["_ACP_OWN_PG"] = started.stdout.strip().split("=", 1)[1]
    try:
        yield directory
    finally:
        subprocess.run(["bash", str(PG_SCRIPT), "stop", str(directory)], capture_output=True)
        os.environ.pop("_ACP_OWN_PG", None)
        shutil.rmtree(directory, ignore_errors=True)


def _pg_args(url: str) -> list[str]:
    return ["--store", url, "--max-running-tasks", "4", *stores.lease_flags()]


async def test_postgres_restarted_idle_and_under_load(tmp_path: Path, own_cluster: Path) -> None:
    url = os.environ["_ACP_OWN_PG"]
    with server(tmp_path, *_pg_args(url)) as (proc, base):
        await anyio.to_thread.run_sync(_restart, own_cluster)   # idle
        first = await until_created(base)
        assert proc.returncode is None
        load = Load()
        async with anyio.create_task_group() as tg:
            tg.start_soon(load.run, base, 4, 150)
            with anyio.fail_after(30):
                while len(load.accepted) < 20:
                    await anyio.sleep(0.01)
            await anyio.to_thread.run_sync(_restart, own_cluster)
            with anyio.fail_after(60):
                seen = len(load.accepted)
                while len(load.accepted) < seen + 20 and not load.stop.is_set():
                    await anyio.sleep(0.01)
            load.stop.set()
        assert not load.failures, load.failures
        outcome = await wait_terminal(base, [first, *load.accepted])
        assert sum(outcome.values()) == len(load.accepted) + 1
        assert proc.returncode is None
        assert (await deep_health(base)).status_code == 200


async def test_a_session_lookup_while_postgresql_is_down_is_503(tmp_path: Path,
                                                               own_cluster: Path) -> None:
    """Sessions across instances ask the store who owns a session that is not live
    here: with PostgreSQL stopped that is a 503 ``store_unavailable`` + ``Retry-After``
    (not a 404 for a session that may run elsewhere); a live session is served from
    memory meanwhile, and the answers come back by themselves with the store."""
    url = os.environ["_ACP_OWN_PG"]
    port = urllib.parse.urlsplit(url).port
    unknown = "0b5e2f64-3c1a-4b7e-9a51-6f0d2c8e4a17"
    with server(tmp_path, *_pg_args(url)) as (proc, base):
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            made = await client.post("/session", json={"sessionScope": "thread"})
            sid = made.json()["sessionId"]
            assert (await client.get(f"/session/{unknown}/status")).status_code == 404
            subprocess.run(["bash", str(PG_SCRIPT), "stop", str(own_cluster)], check=True,
                           capture_output=True)
            down = await client.get(f"/session/{unknown}/status")
            assert down.status_code == 503, down.text
            assert down.json()["code"] == "store_unavailable"
            assert int(down.headers["retry-after"]) > 0
            assert (await client.get(f"/session/{sid}/status")).status_code == 200
            subprocess.run(["bash", str(PG_SCRIPT), "start", str(own_cluster), str(port)],
                           check=True, capture_output=True)
            with anyio.fail_after(60):   # the store is back: so is the answer
                while (await client.get(f"/session/{unknown}/status")).status_code != 404:
                    await anyio.sleep(0.05)
        assert proc.returncode is None


@pytest.mark.parametrize("http_server", ["granian", "uvicorn"])
async def test_a_start_while_postgresql_is_down_waits_for_it(tmp_path: Path, own_cluster: Path,
                                                            http_server: str) -> None:
    """The store down at start: the process does not end. Its socket answers 503 in
    each door's shape (``/health``: starting; over HTTP/2 by prior knowledge too) until
    PostgreSQL is back, then it starts
    and serves; with the store up again, what it made before is there."""
    url = os.environ["_ACP_OWN_PG"]
    port = urllib.parse.urlsplit(url).port
    with server(tmp_path, *_pg_args(url)) as (_, base):
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            before = (await client.post("/session", json={"sessionScope": "thread"})).json()
    subprocess.run(["bash", str(PG_SCRIPT), "stop", str(own_cluster)], check=True,
                   capture_output=True)
    listen_at = free_port()
    child = ServeProcess(tmp_path, *_pg_args(url), "--http-server", http_server,
                         "--port", str(listen_at))
    base = f"http://127.0.0.1:{listen_at}"
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, child.start)
            async with httpx.AsyncClient(base_url=base, timeout=10) as client:
                with anyio.fail_after(30):   # the interpreter's start, then the socket
                    while True:
                        try:
                            health = await client.get("/health")
                            break
                        except httpx.TransportError:
                            await anyio.sleep(0.05)
                assert (health.status_code, health.json()) == (503, {"status": "starting"})
                assert health.headers["retry-after"] == "5"
                rest = await client.post("/session", json={"sessionScope": "thread"})
                assert (rest.status_code, rest.json()["code"]) == (503, "store_unavailable")
                lmsp = await client.get("/lmsp/v1/tasks")
                assert lmsp.headers["content-type"] == "application/problem+json"
                assert (lmsp.status_code, lmsp.json()["code"]) == (503, "store_unavailable")
                acp = await client.post("/acp", json={"jsonrpc": "2.0", "id": 1,
                                                      "method": "initialize", "params": {}})
                assert acp.status_code == 503
                assert acp.json()["error"]["data"]["errorKind"] == "store_unavailable"
                async with httpx.AsyncClient(base_url=base, timeout=10, http1=False,
                                             http2=True) as h2c:   # prior knowledge
                    over_h2 = await h2c.post("/session", json={"sessionScope": "thread"})
                assert over_h2.http_version == "HTTP/2"
                assert (over_h2.status_code, over_h2.json()["code"]) == (503, "store_unavailable")
                assert child.returncode is None
                subprocess.run(["bash", str(PG_SCRIPT), "start", str(own_cluster), str(port)],
                               check=True, capture_output=True)
        assert child.base_url == base   # started: its listening line was read
        restored = child.http.get(f"/session/{before['sessionId']}/status")
        assert restored.status_code == 200, restored.text
        assert child.http.post("/lmsp/v1/tasks", json=envelope("after")).status_code == 202
        assert "cannot start: The task store is unavailable" in child.stderr_text()
        assert "Traceback" not in child.stderr_text()
        assert child.stop() == 0
    finally:
        child.kill()


async def test_a_signal_while_waiting_for_the_store_stops_cleanly(tmp_path: Path,
                                                                 own_cluster: Path) -> None:
    url = os.environ["_ACP_OWN_PG"]
    subprocess.run(["bash", str(PG_SCRIPT), "stop", str(own_cluster)], check=True,
                   capture_output=True)
    child = ServeProcess(tmp_path, *_pg_args(url))
    env = {k: v for k, v in os.environ.items() if k != "ACP_SERVER_TOKEN"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    child.stderr_path.parent.mkdir(parents=True, exist_ok=True)
    with open(child.stderr_path, "a") as stderr:
        process = subprocess.Popen(child.argv, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    try:
        with anyio.fail_after(30):
            while "cannot start" not in child.stderr_text():
                await anyio.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(process.wait, 15) == 0
        assert "Traceback" not in child.stderr_text()
    finally:
        process.kill()
        process.wait()


def _restart(directory: Path) -> None:
    subprocess.run(["bash", str(PG_SCRIPT), "restart", str(directory)], check=True,
                   capture_output=True)


async def test_postgres_backends_terminated_mid_load(tmp_path: Path) -> None:
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    name = f"acp-outage-{os.getpid()}"
    url = stores.postgres_url_for(tmp_path, "terminated")
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query) + [("application_name", name)]
    url = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
    with server(tmp_path, *_pg_args(url)) as (proc, base):
        load = Load()
        killed = 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(load.run, base, 4, 150)
            for round_ in range(3):
                with anyio.fail_after(30):
                    while len(load.accepted) < 15 * (round_ + 1):
                        await anyio.sleep(0.01)
                killed += await anyio.to_thread.run_sync(_terminate, name)
            load.stop.set()
        assert killed > 0
        assert not load.failures, load.failures
        outcome = await wait_terminal(base, load.accepted)
        assert sum(outcome.values()) == len(load.accepted)
        assert proc.returncode is None


def _terminate(application_name: str) -> int:
    dsn = stores.postgres_dsn()
    assert dsn
    with psycopg.connect(dsn, autocommit=True) as admin:
        rows = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE application_name = %s", (application_name,)).fetchall()
    return sum(1 for (ok,) in rows if ok)




async def test_sqlite_disk_full_for_sessions(tmp_path: Path) -> None:
    """The session journal on a full disk (issue #23): a real server whose state folder
    (the store, the agents' records) is a tmpfs. REST prompts acknowledged before the
    fill run; while the disk is full a prompt is answered 202 (SQLite reused its WAL's
    room) or 503 ``store_unavailable`` with ``Retry-After``, never a 500, and the process
    lives; once the fill is deleted, prompts are accepted again by themselves and every
    acknowledged one runs."""
    from tests.store.test_session_restart import read_events

    state = tmp_path / "state"
    with tmpfs(state, "64m"), server(tmp_path, "--max-pending-prompts-per-session",
                                     "0") as (proc, url):
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            sid = (await client.post("/session", json={"sessionScope": "thread"})
                   ).json()["sessionId"]

            async def prompt(text: str) -> httpx.Response:
                return await client.post(f"/session/{sid}/prompt", json={
                    "prompt": [{"type": "text", "text": text}]})

            acked = []
            for n in range(10):
                answer = await prompt(f"before {n}")
                assert answer.status_code == 202, answer.text
                acked.append(answer.json()["promptId"])
            fill(state / "fill")
            refused = 0
            for n in range(500):
                answer = await prompt(f"while full {n}")
                if answer.status_code == 202:
                    acked.append(answer.json()["promptId"])
                    continue
                assert answer.status_code == 503, answer.text
                assert answer.json()["code"] == "store_unavailable"
                assert answer.headers["retry-after"] == "5"
                refused += 1
                if refused == 3:
                    break
            assert refused == 3
            assert proc.returncode is None
            (state / "fill").unlink()
            with anyio.fail_after(60):   # no manual step: the store comes back by itself
                while (answer := await prompt("after")).status_code != 202:
                    assert answer.status_code == 503, answer.text
                    assert answer.json()["code"] == "store_unavailable"
                    await anyio.sleep(0.05)
            last = answer.json()["promptId"]
            events = await read_events(
                client, sid, lambda e: e["type"] == "turn_complete" and e["promptId"] == last,
                last_event_id=0, timeout=60)
            done = [e["promptId"] for e in events if e["type"] == "turn_complete"]
            assert done == [*acked, last]   # every acknowledged prompt ran, in order
            loaded = (await client.post(f"/session/{sid}/load", json={})).json()
            terminals = {t["promptId"]: t["terminal"] for t in loaded["promptTerminals"]}
            assert all(terminals[p] == "completed" for p in [*acked, last])
            assert proc.returncode is None
