"""Sessions across instances (issue #24): instances of ``acp-server serve`` on one
PostgreSQL store behind Debian's HAProxy (the tests' harness).

    python -m bench fleet

Rows (one run each; "n/a" without PostgreSQL or HAProxy):

* prompts completed per second, ``SESSIONS`` sessions each sent ``PER_SESSION``
  prompts by its own client (a kept-alive raw HTTP/1.1 connection) as fast as they are
  accepted, until nothing is pending: two instances behind HAProxy (cookie affinity, so
  each session's client stays on the instance that made it) against one instance
  behind its own HAProxy, same run, both running, measured in turns (one, two, two,
  one: ``RATE_ROUNDS`` each, ``BENCH_FLEET_RATE_ROUNDS``) (floor 0.9x);
* forwarding overhead: ``LATENCY_N`` sequential prompts (``POST /prompt`` to its 202)
  sent to the owner, then to the other instance (which forwards them), mean latency;
* reads from the journal: ``LATENCY_N`` sequential ``GET /status`` on the owner, then
  on the other instance (which answers from the journal), mean latency;
* failover: ``ROUNDS`` times, ``kill -9`` of the owner of a session whose client
  streams through the balancer (resuming by ``Last-Event-ID``), then the time to the
  first event served by the new owner (lease TTL ``TTL_MS``); p50 and p99.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.lmsp_bench import fresh_schema, postgres_dsn
from bench.loadgen import build_request, exchange
from bench.targets import record
from tests.harness import ServeProcess
from tests.harness.haproxy import HAProxy, haproxy_binary

SESSIONS, PER_SESSION = 16, 250   # 4,000 prompts: 3-5 s a turn (1.5 s at 100: noise)
LATENCY_N = 300
ROUNDS = int(os.environ.get("BENCH_FAILOVER_ROUNDS", "5"))
TTL_MS, RENEW_MS = 2000, 500
RATE_ROUNDS = int(os.environ.get("BENCH_FLEET_RATE_ROUNDS", "2"))
PROMPT = {"prompt": [{"type": "text", "text": "/chunks 1 ping"}]}
BODY = json.dumps(PROMPT).encode()


@contextlib.contextmanager
def instances(workspace: str, url: str, count: int, tag: str) -> Iterator[list[ServeProcess]]:
    children: list[ServeProcess] = []
    try:
        for n in range(count):
            children.append(ServeProcess(
                workspace, "--store", url, "--max-pending-prompts-per-session", "0",
                "--session-lease-ttl-ms", str(TTL_MS), "--session-lease-renew-ms",
                str(RENEW_MS), "--session-on-restart", "continue",
                state_dir=os.path.join(workspace, f".state-{tag}-{n}")).start())
        yield children
    finally:
        for child in children:
            child.kill()


def _pending(children: list[ServeProcess]) -> int:
    return sum(c.http.get("/daemon/status").json()["runtime"]["activity"]["pendingPrompts"]
               for c in children if c.returncode is None)


async def _completed(base_url: str, children: list[ServeProcess]) -> tuple[int, float]:
    """(prompts, seconds): ``SESSIONS`` new sessions, each sent ``PER_SESSION`` prompts
    by its own client as fast as they are accepted, then all drained. Each client is a
    kept-alive connection that returns HAProxy's affinity cookie (``bench.loadgen``'s
    raw HTTP/1.1: measured, ``httpx`` took 0.8-0.9 ms of CPU per prompt on 2 cores, as
    much as the server and PostgreSQL together, and starved the instances)."""
    url = httpx.URL(base_url)
    host, port = url.host, url.port or 80

    async def one(sid: str, cookie: str) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        request = build_request("POST", host, port, f"/session/{sid}/prompt", BODY,
                                [f"Cookie: {cookie}"])
        try:
            for _ in range(PER_SESSION):
                status, body = await exchange(reader, writer, request)
                assert status == 202, body
        finally:
            writer.close()

    made = []
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        for _ in range(SESSIONS):   # each with the cookie of the instance that made it
            client.cookies.clear()   # the balancer chooses
            sid = (await client.post("/session", json={"sessionScope": "thread"})).json()[
                "sessionId"]
            made.append((sid, "; ".join(f"{k}={v}" for k, v in client.cookies.items())))
    start = time.monotonic()
    await asyncio.gather(*(one(sid, cookie) for sid, cookie in made))
    while _pending(children):
        await asyncio.sleep(0.02)
    return SESSIONS * PER_SESSION, time.monotonic() - start


def _rates(one: tuple[str, list[ServeProcess]], two: tuple[str, list[ServeProcess]]
           ) -> tuple[float, float]:
    """Prompts/s of one instance and of two, both running, measured in turns (one,
    two, two, one, …: ``RATE_ROUNDS`` each) so that the drift of a shared machine
    falls on both alike."""
    totals = {1: [0, 0.0], 2: [0, 0.0]}
    order = [1, 2, 2, 1] * (RATE_ROUNDS // 2) + [1, 2] * (RATE_ROUNDS % 2)
    for count in order:
        base_url, children = one if count == 1 else two
        prompts, seconds = asyncio.run(_completed(base_url, children))
        totals[count][0] += prompts
        totals[count][1] += seconds
    return totals[1][0] / totals[1][1], totals[2][0] / totals[2][1]


def _latency(base_url: str, sid: str) -> float:
    with httpx.Client(base_url=base_url, timeout=30) as client:
        samples = []
        for _ in range(LATENCY_N):
            start = time.perf_counter()
            assert client.post(f"/session/{sid}/prompt", json=PROMPT).status_code == 202
            samples.append(time.perf_counter() - start)
    return statistics.mean(samples) * 1000


def _read_latency(base_url: str, sid: str) -> float:
    """Mean ms of ``GET /session/{id}/status`` (on the owner: its memory; elsewhere: the
    journal)."""
    with httpx.Client(base_url=base_url, timeout=30) as client:
        samples = []
        for _ in range(LATENCY_N):
            start = time.perf_counter()
            assert client.get(f"/session/{sid}/status").status_code == 200
            samples.append(time.perf_counter() - start)
    return statistics.mean(samples) * 1000


def _failover_once(tmp: str, url: str, n: int) -> float:
    """ms from the kill of the owner to the first event its successor serves."""
    with instances(tmp, url, 2, f"f{n}") as children, \
            HAProxy(Path(tmp), [c.base_url for c in children],
                    affinity="cookie") as lb, httpx.Client(base_url=lb.base_url,
                                                           timeout=10) as client:
        lb.wait_up(2)
        sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        owner = next(c for c in children if c.http.get("/daemon/status").json()[
            "runtime"]["instances"]["sessionsOwned"])
        held = client.post(f"/session/{sid}/prompt", json={
            "prompt": [{"type": "text", "text": "/sleep 30s held"}]}).json()
        last, got, stop = [0], threading.Event(), threading.Event()
        killed_at = [0.0]

        def read() -> None:
            with httpx.Client(base_url=lb.base_url, timeout=httpx.Timeout(10, connect=2),
                              cookies=client.cookies) as reader:
                while not stop.is_set():
                    try:
                        with reader.stream("GET", f"/session/{sid}/events",
                                           headers={"Last-Event-ID": str(last[0])}) as stream:
                            for line in stream.iter_lines():
                                if line.startswith("id:"):
                                    last[0] = int(line[3:].strip() or 0)
                                    if killed_at[0]:
                                        got.set()
                                        return
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.02)

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        while last[0] <= held["lastEventId"]:   # the held prompt started
            time.sleep(0.01)
        killed_at[0] = time.monotonic()
        owner.kill()
        got.wait(60)
        stop.set()
        return (time.monotonic() - killed_at[0]) * 1000 if got.is_set() else float("nan")


def main() -> list[str]:
    header = ["## Sessions across instances (PostgreSQL, HAProxy; one run)", ""]
    if haproxy_binary() is None:
        return [*header, "n/a (no HAProxy)"]
    with postgres_dsn() as dsn:
        if dsn is None:
            return [*header, "n/a (no PostgreSQL)"]
        tmp = tempfile.mkdtemp(prefix="acp-bench-fleet.")
        try:
            with instances(tmp, fresh_schema(dsn), 1, "one") as one, \
                    HAProxy(Path(tmp), [one[0].base_url], affinity="cookie") as lb1, \
                    instances(tmp, fresh_schema(dsn), 2, "two") as two, \
                    HAProxy(Path(tmp), [c.base_url for c in two], affinity="cookie") as lb:
                lb1.wait_up(1)
                lb.wait_up(2)
                single, double = _rates((lb1.base_url, one), (lb.base_url, two))
                sid = two[0].http.post("/session", json={"sessionScope": "thread"}).json()[
                    "sessionId"]
                owner_ms = _latency(two[0].base_url, sid)
                forwarded_ms = _latency(two[1].base_url, sid)
                status_ms = _read_latency(two[0].base_url, sid)
                journal_ms = _read_latency(two[1].base_url, sid)
            failovers = [_failover_once(tmp, fresh_schema(dsn), n) for n in range(ROUNDS)]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    p50 = statistics.median(failovers)
    p99 = sorted(failovers)[min(len(failovers) - 1, int(len(failovers) * 0.99))]
    record("sessions: prompts completed/s, two instances behind HAProxy / one", double / single,
           0.9)
    record(f"sessions: failover kill -> first event p99, ms (lease TTL {TTL_MS} ms)", p99,
           10_000, lower_is_better=True)
    return [*header, "| run | figure |", "|---|---:|",
            f"| prompts completed/s, one instance behind HAProxy ({SESSIONS} sessions x "
            f"{PER_SESSION}) | "
            f"{single:,.0f} |",
            f"| prompts completed/s, two instances behind HAProxy | {double:,.0f} "
            f"({double / single:.2f}x) |",
            f"| prompt to the owner, mean ms (202) | {owner_ms:.2f} |",
            f"| prompt to the other instance (forwarded), mean ms | {forwarded_ms:.2f} "
            f"({forwarded_ms / owner_ms:.2f}x) |",
            f"| status on the owner, mean ms | {status_ms:.2f} |",
            f"| status on the other instance (from the journal), mean ms | {journal_ms:.2f} "
            f"({journal_ms / status_ms:.2f}x) |",
            f"| failover kill -9 -> first event from the new owner, p50 / p99 ms "
            f"({ROUNDS} rounds, TTL {TTL_MS} ms) | {p50:,.0f} / {p99:,.0f} |"]
