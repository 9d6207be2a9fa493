"""HTTP benchmarks: the 503 and 202 prompt paths against the floors (a raw ASGI callable
and a bare Starlette route, on granian and on uvicorn) and ``qwen serve``, and turn
latency, each server in its own process and the load from another (``wrk`` when
installed, else ``bench.loadgen``).

    python -m bench http
    BENCH_BEFORE=/tmp/main-worktree python -m bench http   # + the old 503 path, same rounds

* 503 path: a session whose queue (cap 1) is held by a ``/sleep`` prompt; every
  POST is refused with ``prompt_queue_full``; on the shipped server (granian) and on
  uvicorn; and on granian with a credential: the bootstrap ``--token``, and a stored
  token (its cache, digest and rate limiter on every request: limits set so high that
  they never refuse), each sending its own session's prompts, both to ONE server in
  alternating slices (``authenticated_503``: the same process, warm-up, ABBA order).
* floors: ``bench.floor_server`` (``raw`` callable, ``bare`` route) returning the same
  503 bytes; qwen serve: ``bench.peer_bench``. Each figure is the median of ``ROUNDS``
  rounds that run every server in turn, each server a new process, loaded for
  ``SECONDS`` after ``WARMUP_S`` of the same load; the spread of the rounds and the
  server's CPU µs per request (all its threads, ``/proc``) are shown beside it.
* placement (``bench.placement``): every server of the run, floors and ``qwen serve``
  included, is pinned to one core and ``wrk`` to the others (``BENCH_PIN=off``: the
  scheduler decides, as before; the figures then swing far more between processes).
* in process (``bench.inprocess``): CPU µs per refusal of our app, the raw callable
  and the bare route called as ASGI, no server: the figure to judge our code by; and
  per prompt of the accepted-and-completed load (the 202 path and the turn).
* 202 path: cap disabled, ``/chunks 1`` prompts that the reference agent finishes at once.
* latency: POST to ``turn_complete`` on an open SSE stream, sequential turns.
* accepted **and completed**: the 202 load, then ``GET /daemon/status`` polled until
  ``pendingPrompts`` is 0; rate = 202s / (first request → queue drained). That server
  runs under ``bench.server --lag-probe``: the event-loop lag p99 is taken from its probe's
  samples inside the same window.
* burst: raw-socket readers of ``/session/{id}/events`` connected before one
  ``/chunks N`` prompt; every ``agent_message_chunk`` must arrive (no
  ``client_evicted``); events/s = frames read / (POST → the last reader's
  ``turn_complete``), once with one reader of ``BURST`` chunks, once with
  ``READERS`` readers of ``FAN_BURST`` chunks (``PER_SESSION`` readers per session,
  one prompt per session, all POSTed together); each the median of ``BURST_RUNS``
  bursts after one of warm-up (``warm_burst``), on new sessions of one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import httpx
from httpx_sse import connect_sse

from acp_server.http.options import DEFAULT_SERVER
from tests.harness import ServeProcess
from bench.server import INTERVAL_S as PROBE_INTERVAL_S
from bench.server import lag_p99
from bench.inprocess import in_subprocess
from bench.loadgen import wrk_load
from bench.placement import cpu_seconds, listener_pid, pin, split_cores
from bench.targets import record

SECONDS = float(os.environ.get("BENCH_SECONDS", "4"))
CONNECTIONS = 16
PROMPT = json.dumps({"prompt": [{"type": "text", "text": "/chunks 1 ping"}]})
TURNS = 300
BURST = 10_000
READERS = 100
FAN_BURST = 2_000
PER_SESSION = 50   # under the bridge's max_subscribers_per_session (64)
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
WARMUP_S = 1.0   # of the same load, unmeasured, before each measured 503 load


@contextlib.contextmanager
def server(argv: list[str], marker: str, env: dict[str, str] | None = None,
           cwd: str | None = None) -> Iterator[int]:
    """The server ``argv`` on a free port (read from the line with ``marker``); its stderr
    (access lines included) goes to a temporary file, shown if it exits early."""
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=log,
                            text=True, env=None if env is None else {**os.environ, **env},
                            cwd=cwd)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if marker in line:
                yield int(line.split(marker, 1)[1].split()[0].rsplit(":", 1)[-1])
                break
        else:
            log.seek(0)
            raise RuntimeError(f"server {argv} exited before listening:\n{log.read()[-4000:]}")
    finally:
        log.close()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def served(workspace: str, *flags: str, knobs: Sequence[str] = ()) -> Iterator[int]:
    """``acp-server serve`` with ``flags`` (through ``bench.server`` and its ``knobs``),
    started by the tests' launcher (``tests.harness.ServeProcess``); yields its port."""
    with ServeProcess(workspace, *flags, state_dir=os.path.join(workspace, ".state"),
                      runner=["-m", "bench.server", *knobs]) as child:
        yield child.port


def acp_server(workspace: str, cap: int, probe: str | None = None, *extra: str,
               source: str | None = None) -> contextlib.AbstractContextManager[int]:
    """``acp-server serve`` with a prompt cap; ``source``: another source tree's server
    (an older checkout, without ``bench.server``), run from its folder so that ``-m
    acp_server`` finds that tree first."""
    if source is not None:
        return server(["-m", "acp_server", "serve", "--port", "0", "--workspace", workspace,
                       "--state-dir", os.path.join(workspace, ".state-before"),
                       "--max-pending-prompts-per-session", str(cap), *extra],
                      "listening on http://", env={"PYTHONPATH": source}, cwd=source)
    knobs = ["--lag-probe", probe] if probe is not None else []
    return served(workspace, "--max-pending-prompts-per-session", str(cap), *extra, knobs=knobs)


def load(port: int, path: str, body: str, seconds: float = SECONDS,
         headers: dict[str, str] | None = None, warmup: float = 0) -> dict:
    """``CONNECTIONS`` keep-alive connections POSTing ``body`` for ``SECONDS``: ``wrk``
    when installed (a client far cheaper than the server), else ``bench.loadgen``.

    The server (whoever listens on ``port``) is pinned to its core and the client runs
    on the others (``bench.placement``; ``BENCH_PIN=off``: not); ``warmup`` seconds of
    the same load come first, unmeasured (the 503 rows: ``WARMUP_S``; a load of
    accepted prompts is measured from its first request, so it has none).
    ``cpu_us``: the server's CPU µs per request over the measured load (all its
    threads), ``None`` when it cannot be read."""
    cores = split_cores()
    pid = listener_pid(port)
    if cores is not None and pid is not None:
        pin(pid, cores.server)
    prefix = cores.client_prefix() if cores is not None else []
    if warmup > 0:
        _load(port, path, body, warmup, headers, prefix)
    before = cpu_seconds(pid) if pid is not None else None
    result = _load(port, path, body, seconds, headers, prefix)
    after = cpu_seconds(pid) if pid is not None else None
    result["cpu_us"] = None if before is None or after is None or not result["requests"] \
        else (after - before) / result["requests"] * 1e6
    return result


def _load(port: int, path: str, body: str, seconds: float, headers: dict[str, str] | None,
          prefix: list[str]) -> dict:
    result = wrk_load(port, "POST", path, body, seconds, CONNECTIONS, headers, prefix)
    if result is not None:
        return result
    out = subprocess.run([*prefix, sys.executable, "-m", "bench.loadgen", "--port", str(port),
                          "--method", "POST", "--path", path, "--body", body,
                          "--seconds", str(seconds), "--connections", str(CONNECTIONS),
                          *(a for k, v in (headers or {}).items()
                            for a in ("--header", f"{k}: {v}"))],
                         capture_output=True, text=True, check=True)
    return {**json.loads(out.stdout), "client": "bench.loadgen"}


def refused_only(result: dict) -> bool:
    statuses = result["statuses"]
    return set(statuses) == {"503"} or (statuses.get("2xx") == 0 and "non-2xx" in statuses)


def accepted_only(result: dict) -> bool:
    statuses = result["statuses"]
    return set(statuses) == {"202"} or statuses.get("non-2xx") == 0




def create_session(client: httpx.Client) -> str:
    return client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]


def latency(port: int) -> tuple[float, float]:
    samples = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        sid = create_session(client)
        with connect_sse(client, "GET", f"/session/{sid}/events") as source:
            events = source.iter_sse()
            for _ in range(TURNS):
                start = time.perf_counter()
                prompt_id = client.post(f"/session/{sid}/prompt", content=PROMPT,
                                        headers={"Content-Type": "application/json"}).json()["promptId"]
                for sse in events:
                    if sse.event == "turn_complete" and json.loads(sse.data)["promptId"] == prompt_id:
                        break
                samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def drained(port: int) -> float:
    """``time.monotonic()`` once ``/daemon/status`` shows no pending prompt."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        while True:
            activity = client.get("/daemon/status").json()["runtime"]["activity"]
            if activity["pendingPrompts"] == 0:
                return time.monotonic()
            time.sleep(0.005)


async def _reader(port: int, sid: str, ready: asyncio.Event, seen: list[int],
                  done_at: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /session/{sid}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 f"Accept: text/event-stream\r\n\r\n".encode())
    await reader.readuntil(b"\r\n\r\n")
    ready.set()
    chunks, tail = 0, b""
    while True:
        data = await reader.read(1 << 16)
        if not data:
            raise RuntimeError("stream closed before turn_complete")
        both = tail + data
        chunks += both.count(b"agent_message_chunk") - tail.count(b"agent_message_chunk")
        if b"client_evicted" in both:
            raise RuntimeError(f"evicted after {chunks} chunks")
        if b"event: turn_complete" in both:
            break
        tail = both[-64:]
    done_at.append(time.perf_counter())
    seen.append(chunks)
    writer.close()


async def _burst(port: int, readers: int, chunks: int) -> tuple[int, float]:
    """Chunk frames read by ``readers`` readers of ``/chunks`` prompts, and seconds: one
    session per ``PER_SESSION`` readers (the bridge's subscriber cap), one prompt each."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        seen: list[int] = []
        done_at: list[float] = []
        tasks, readies, sids = [], [], []
        for first in range(0, readers, PER_SESSION):
            created = await client.post("/session", json={"sessionScope": "thread"})
            sid = created.json()["sessionId"]
            sids.append(sid)
            for _ in range(min(PER_SESSION, readers - first)):
                readies.append(asyncio.Event())
                tasks.append(asyncio.create_task(_reader(port, sid, readies[-1], seen, done_at)))
        await asyncio.gather(*(r.wait() for r in readies))
        body = {"prompt": [{"type": "text", "text": f"/chunks {chunks} " + "w" * chunks}]}
        start = time.perf_counter()
        for sid in sids:
            answer = await client.post(f"/session/{sid}/prompt", json=body)
            assert answer.status_code == 202, answer.text
        await asyncio.gather(*tasks)
    assert seen == [chunks] * readers, (seen[:5], chunks)
    return sum(seen), max(done_at) - start


BURST_RUNS = 3   # each figure: the median of these, after one burst of warm-up


def warm_burst(port: int, readers: int, chunks: int) -> tuple[int, float]:
    """``_burst`` once to warm the process up (discarded: a fresh process's first turn
    pays its one-time costs, as the first seconds of a load do, which every other row
    leaves out), then ``BURST_RUNS`` times (new sessions each): the run of the median
    rate."""
    asyncio.run(_burst(port, readers, chunks))
    runs = sorted((asyncio.run(_burst(port, readers, chunks)) for _ in range(BURST_RUNS)),
                  key=lambda run: run[0] / run[1])
    return runs[len(runs) // 2]


SHIPPED = DEFAULT_SERVER
RSGI_FLAGS = ("--http-server", "granian", "--granian-interface", "rsgi")
HOLD = {"prompt": [{"type": "text", "text": "/sleep 600s hold"}]}
FLOOR_PATH = "/session/00000000-0000-4000-8000-000000000000/prompt"


def refused_503(workspace: str, *extra: str, source: str | None = None) -> dict:
    """The 503 path: a session whose queue (cap 1) a held prompt fills, loaded."""
    with acp_server(workspace, 1, None, *extra, source=source) as port:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            sid = create_session(client)
            client.post(f"/session/{sid}/prompt", json=HOLD)
        result = load(port, f"/session/{sid}/prompt", PROMPT, warmup=WARMUP_S)
    assert refused_only(result), result
    return result


BOOTSTRAP = "bench-bootstrap-token"
# Limits so high they never refuse: the limiter still runs on every request.
AUTH_FLAGS = ("--token", BOOTSTRAP, "--rate-limit-prompt", "100000000")


AUTH_SLICES = 4   # alternating load slices per token and round (ABBA order)


def authenticated_503(workspace: str) -> dict[str, float]:
    """The 503 path with a credential, the bootstrap token against a stored token (of
    the default rate class, so the cache, the digest and the limiter all run), on ONE
    server: each token has its own held session (another principal's would be 404);
    after a warm-up of each, the two loads alternate in ``AUTH_SLICES`` slices each of
    ``SECONDS / AUTH_SLICES`` (A B B A ...), so both meet the same process, the same
    warm caches and the same minutes of the machine. Requests/s per token."""
    headers = {"Authorization": f"Bearer {BOOTSTRAP}"}
    # a state folder of its own: a stored token makes every later server there need one
    own = tempfile.mkdtemp(dir=workspace)
    with acp_server(own, 1, None, "--http-server", SHIPPED, *AUTH_FLAGS) as port:
        paths: dict[str, tuple[str, dict[str, str]]] = {}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as client:
            created = client.post("/tokens", json={"name": "bench"})
            assert created.status_code == 201, created.text
            for name, token in (("bootstrap", BOOTSTRAP), ("stored", created.json()["token"])):
                auth = {"Authorization": f"Bearer {token}"}
                client.headers.update(auth)
                sid = create_session(client)
                client.post(f"/session/{sid}/prompt", json=HOLD)
                paths[name] = (f"/session/{sid}/prompt", auth)
        totals = {name: [0, 0.0] for name in paths}
        slice_s = SECONDS / AUTH_SLICES
        order = list(paths)
        for name in order:   # warm-up
            load(port, paths[name][0], PROMPT, seconds=1, headers=paths[name][1])
        for index in range(AUTH_SLICES):
            for name in (order if index % 2 == 0 else order[::-1]):
                result = load(port, paths[name][0], PROMPT, seconds=slice_s,
                              headers=paths[name][1])
                assert refused_only(result), result
                totals[name][0] += result["requests"]
                totals[name][1] += result["seconds"]
    return {name: requests / seconds for name, (requests, seconds) in totals.items()}


def floor(app: str, http: str) -> dict:
    with server(["-m", "bench.floor_server", app, http], "listening on ") as port:
        result = load(port, FLOOR_PATH, PROMPT, warmup=WARMUP_S)
    assert refused_only(result), result
    return result


@dataclass
class Rounds:
    """One server's figures, a round each: requests/s and its CPU µs per request."""

    rps: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)

    def add(self, result: dict) -> None:
        self.rps.append(result["rps"])
        if result.get("cpu_us") is not None:
            self.cpu_us.append(result["cpu_us"])

    def spread(self) -> str:
        """min–max of requests/s over the rounds, as a share of the median."""
        if len(self.rps) < 2:
            return ""
        median = statistics.median(self.rps)
        return f"{(min(self.rps) - median) / median:+.0%}/{(max(self.rps) - median) / median:+.0%}"


def floors_and_503(workspace: str) -> tuple[dict[str, float], dict[str, Rounds]]:
    """Requests/s of every 503 answer: the median of ``ROUNDS`` rounds that run every
    server in turn (the machine's noise hits each alike), and each server's rounds.
    ``BENCH_BEFORE`` = another source tree (e.g. a worktree of main): its 503 path is
    measured in the same rounds."""
    runs: dict[str, Callable[[], dict]] = {
        "bare/uvicorn": lambda: floor("bare", "uvicorn"),
        "ours/granian": lambda: refused_503(workspace, "--http-server", "granian"),
        "raw/granian": lambda: floor("raw", "granian"),
        "ours/uvicorn": lambda: refused_503(workspace, "--http-server", "uvicorn"),
        "raw/uvicorn": lambda: floor("raw", "uvicorn"),
        "bare/granian": lambda: floor("bare", "granian"),
        "ours/granian-rsgi": lambda: refused_503(workspace, *RSGI_FLAGS),
        "rawrsgi/granian": lambda: floor("rawrsgi", "granian"),
    }
    before = os.environ.get("BENCH_BEFORE")
    if before:
        source = os.path.abspath(before)
        runs["before/shipped"] = lambda: refused_503(workspace, "--http-server", SHIPPED,
                                                     source=source)
        runs["before/granian-rsgi"] = lambda: refused_503(workspace, *RSGI_FLAGS,
                                                          source=source)
    rounds = {name: Rounds() for name in runs}
    auths: list[dict[str, float]] = []
    for _ in range(ROUNDS):
        for name, run in runs.items():
            rounds[name].add(run())
        auths.append(authenticated_503(workspace))
    rps = {name: statistics.median(r.rps) for name, r in rounds.items()}
    # the two tokens: one server, alternating slices; both figures from the round whose
    # total is the median (never each side's median from different rounds)
    auth = sorted(auths, key=lambda a: sum(a.values()))[(len(auths) - 1) // 2]
    rps["auth/bootstrap"], rps["auth/stored"] = auth["bootstrap"], auth["stored"]
    return rps, rounds


def main() -> list[str]:
    os.environ.setdefault("PYTHONHASHSEED", "0")   # the servers' dicts and sets alike
    with tempfile.TemporaryDirectory() as workspace:
        inproc = in_subprocess()
        before = os.environ.get("BENCH_BEFORE")
        inproc_before = in_subprocess(os.path.abspath(before)) if before else None
        rps, rounds = floors_and_503(workspace)
        from bench.peer_bench import qwen_503

        qwen = qwen_503(functools.partial(load, warmup=WARMUP_S))
        lag_file = os.path.join(workspace, "lag.txt")
        with acp_server(workspace, 0, lag_file, "--http-server", SHIPPED) as port:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
                sid = create_session(client)
            pid = listener_pid(port)
            spent = cpu_seconds(pid) if pid is not None else None
            accepted = load(port, f"/session/{sid}/prompt", PROMPT)
            drained_at = drained(port)
            if spent is not None and pid is not None:   # the load and the drain after it
                after = cpu_seconds(pid)
                accepted["cpu_us"] = None if after is None \
                    else (after - spent) / accepted["requests"] * 1e6
            p50, p99 = latency(port)
        bursts = {}
        for name, flags in (("asgi", ("--http-server", SHIPPED)), ("rsgi", RSGI_FLAGS)):
            with acp_server(workspace, 0, None, *flags) as port:
                bursts[name] = (warm_burst(port, 1, BURST),
                                warm_burst(port, READERS, FAN_BURST))
        (one_events, one_s), (fan_events, fan_s) = bursts["asgi"]
        lag50, lag99, lag_n = lag_p99(lag_file, accepted["started_at"], drained_at)
    assert accepted_only(accepted), accepted
    ours = rps[f"ours/{SHIPPED}"]
    completed = accepted["requests"] / (drained_at - accepted["started_at"])
    record(f"503 path ({SHIPPED}) / bare Starlette route on uvicorn", ours / rps["bare/uvicorn"],
           1.0)
    record(f"503 path ({SHIPPED}) / raw ASGI callable on {SHIPPED}",
           ours / rps[f"raw/{SHIPPED}"], 0.7)
    record(f"503 path ({SHIPPED}), stored token / the same with the bootstrap token",
           rps["auth/stored"] / rps["auth/bootstrap"], 0.95)
    record(f"503 path ({SHIPPED}) / qwen serve 0.24.4",
           None if qwen is None else ours / qwen["rps"], 10.0,
           note="" if qwen is not None else "qwen serve not runnable here")
    record(f"REST prompts accepted and completed ({SHIPPED}) / bare route on uvicorn",
           completed / rps["bare/uvicorn"], 0.5)
    record("REST one reader, 10,000-chunk burst, events/s", one_events / one_s, 100_000)
    record(f"REST {READERS} readers of a {FAN_BURST:,}-chunk burst, events/s in total",
           fan_events / fan_s, 300_000)
    record("event-loop lag p99 under the accepted-and-completed load, ms", lag99, 10.0,
           lower_is_better=True)
    client = accepted.get("client", "wrk")
    cores = split_cores()
    placement = ("the scheduler places server and client" if cores is None else
                 f"server pinned to CPU {','.join(map(str, sorted(cores.server)))}, client to "
                 f"CPU {','.join(map(str, sorted(cores.client)))}")
    def mark(server: str) -> str:
        return f"{server} (shipped)" if server == SHIPPED else server

    rows = [(f"raw ASGI callable, {mark('granian')}", "raw/granian"),
            (f"raw ASGI callable, {mark('uvicorn')}", "raw/uvicorn"),
            (f"bare Starlette route, {mark('granian')}", "bare/granian"),
            (f"bare Starlette route, {mark('uvicorn')} (the floor)", "bare/uvicorn"),
            *sorted([(f"**acp-server 503 path, {SHIPPED} (shipped)**", f"ours/{SHIPPED}")]
                    + [(f"acp-server 503 path, {other}", f"ours/{other}")
                       for other in ("granian", "uvicorn") if other != SHIPPED],
                    key=lambda row: row[1] != f"ours/{SHIPPED}"),
            ("acp-server 503 path, granian, `--granian-interface rsgi` (off by default)",
             "ours/granian-rsgi"),
            ("raw callable written for RSGI, granian", "rawrsgi/granian"),
            (f"acp-server 503 path, {SHIPPED}, bootstrap token", "auth/bootstrap"),
            (f"acp-server 503 path, {SHIPPED}, stored token", "auth/stored"),
            (f"acp-server 503 path before this change (BENCH_BEFORE, {SHIPPED})",
             "before/shipped"),
            ("the same before this change, `--granian-interface rsgi`", "before/granian-rsgi")]
    lines = [
        f"## HTTP ({CONNECTIONS} keep-alive connections, {client} in a separate process, "
        f"{SECONDS:g} s each after {WARMUP_S:g} s of warm-up, median of {ROUNDS} interleaved "
        f"rounds; {placement})", "",
        "| server and route (the same 503 bytes) | requests/s | rounds: min/max vs median "
        f"| server CPU µs per request | / bare route on uvicorn | / raw callable on {SHIPPED} |",
        "|---|---:|---:|---:|---:|---:|"]
    for label, key in rows:
        if key in rps:
            spent = rounds.get(key, Rounds())
            cpu = f"{statistics.median(spent.cpu_us):.1f}" if spent.cpu_us else ""
            lines.append(f"| {label} | {rps[key]:.0f} | {spent.spread()} | {cpu} "
                         f"| {rps[key] / rps['bare/uvicorn']:.2f} "
                         f"| {rps[key] / rps[f'raw/{SHIPPED}']:.2f} |")
    if qwen is not None:
        cpu = f"{qwen['cpu_us']:.1f}" if qwen.get("cpu_us") is not None else ""
        lines.append(f"| qwen serve 0.24.4 (node) | {qwen['rps']:.0f} | (one round) | {cpu} "
                     f"| {qwen['rps'] / rps['bare/uvicorn']:.2f} "
                     f"| {qwen['rps'] / rps[f'raw/{SHIPPED}']:.2f} |")
    return [
        *lines, "",
        "The same 503 in process (`bench.inprocess`: the app called as ASGI, no server; "
        "CPU µs of the thread per refusal, best of 5 × 20,000): raw callable "
        f"{inproc['raw']:.2f} µs, bare Starlette route {inproc['bare']:.2f} µs, "
        f"acp-server {inproc['ours']:.2f} µs ({inproc['ours_process']:.2f} µs of the "
        "whole process's CPU)"
        + ("." if inproc_before is None else
           f"; the BENCH_BEFORE tree's {inproc_before['ours']:.2f} µs "
           f"({inproc_before['ours_process']:.2f}; its floors "
           f"{inproc_before['raw']:.2f} / {inproc_before['bare']:.2f} µs)."), "",
        "The accepted-and-completed load in process (`bench.inprocess`: 16 callers, the "
        "app as ASGI, in-memory journal, until every turn ran), CPU µs per prompt: the "
        f"event loop {inproc['accepted']:.1f} (of which the app calls, the 202 path, "
        f"{inproc['accepted_app']:.1f}), the process {inproc['accepted_process']:.1f}"
        + ("." if inproc_before is None or "accepted" not in inproc_before else
           f"; the BENCH_BEFORE tree's {inproc_before['accepted']:.1f} "
           f"({inproc_before['accepted_app']:.1f}) / "
           f"{inproc_before['accepted_process']:.1f}."), "",
        f"| `POST /session/{{id}}/prompt` on {SHIPPED} (durable journal, the default) "
        "| requests/s | ratio to bare (uvicorn) | server CPU µs per prompt |",
        "|---|---|---|---|",
        f"| → 202 (reference agent runs each turn) | {accepted['rps']:.0f} "
        f"| {accepted['rps'] / rps['bare/uvicorn']:.2f} | |",
        f"| the same prompts accepted **and completed** ({accepted['requests']} turns, "
        f"first request → queue drained in {drained_at - accepted['started_at']:.2f} s) "
        f"| {completed:.0f} | {completed / rps['bare/uvicorn']:.2f} "
        f"| {'' if accepted.get('cpu_us') is None else format(accepted['cpu_us'], '.1f')} |",
        "", f"Event-loop lag in the server under that load (probe task sleeping "
        f"{PROBE_INTERVAL_S * 1000:g} ms, {lag_n} samples): p50 {lag50:.2f} ms, "
        f"p99 {lag99:.2f} ms",
        "", "| REST event stream burst (raw-socket readers, every chunk received, no "
        "eviction) | events | seconds | events/s |", "|---|---|---|---|",
        f"| 1 reader, `/chunks {BURST}` | {one_events} | {one_s:.2f} | {one_events / one_s:.0f} |",
        f"| {READERS} readers ({PER_SESSION} per session), `/chunks {FAN_BURST}` each "
        f"| {fan_events} | {fan_s:.2f} "
        f"| {fan_events / fan_s:.0f} |",
        *(f"| the same, {label}, `--granian-interface rsgi` | {events} | {secs:.2f} "
          f"| {events / secs:.0f} |"
          for label, (events, secs) in zip(("1 reader", f"{READERS} readers"),
                                           bursts["rsgi"])),
        "", f"Turn latency, POST → `turn_complete` on SSE ({TURNS} sequential turns): "
        f"p50 {p50:.2f} ms, p99 {p99:.2f} ms",
    ]
