"""Where a benchmarked server and its load generator run, and the CPU time the server
spends: the same conditions for every server of an HTTP run (floors, ours, ``qwen serve``).

    cores = split_cores()                 # Cores(server={1}, client={0}) on 2 CPUs, or None
    pid = listener_pid(port)              # the process listening on 127.0.0.1:port
    pin(pid, cores.server)                # every thread of it, granian's Rust threads too
    before = cpu_seconds(pid)             # user + system, all threads
    ... load from ``taskset -c <cores.client>`` ...
    us_per_request = (cpu_seconds(pid) - before) / requests * 1e6

Why: on a 2-core machine the load generator, the server's event loop and (granian) the
server's Rust runtime thread are three busy threads on two cores; where the scheduler
puts them changes from one server process to the next, and two processes of the same
code differed by up to 1.5× in requests/s (the spread in ``docs/benchmarks.md``). With
the server on one core and the client on the other, every server meets the same
placement. ``BENCH_PIN=off`` leaves placement to the scheduler (the old behaviour).

The server's CPU µs per request does not depend on how much of the machine the server
got, only on how much work a request is, so it is also shown: it moves far less than
requests/s when other processes run beside the benchmark.

Contracts: ``split_cores`` is ``None`` with fewer than two usable CPUs or with
``BENCH_PIN=off``; ``listener_pid`` is ``None`` when ``ss`` is missing or the listener is
not ours to see; ``pin`` skips threads that exit meanwhile; Linux only (``/proc``), and
every function returns ``None`` / does nothing elsewhere.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True, slots=True)
class Cores:
    server: frozenset[int]
    client: frozenset[int]

    def client_prefix(self) -> list[str]:
        """``taskset`` argv that runs a command on the client's cores."""
        taskset = shutil.which("taskset")
        if taskset is None:
            return []
        return [taskset, "-c", ",".join(map(str, sorted(self.client)))]


def split_cores() -> Cores | None:
    """The last usable CPU for the server, the others for the client."""
    if os.environ.get("BENCH_PIN", "split") == "off" or not hasattr(os, "sched_getaffinity"):
        return None
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        return None
    return Cores(server=frozenset(usable[-1:]), client=frozenset(usable[:-1]))


def listener_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` (``ss -ltnp``)."""
    ss = shutil.which("ss")
    if ss is None:
        return None
    out = subprocess.run([ss, "-Hltnp", f"sport = :{port}"], capture_output=True,
                         text=True).stdout
    found = re.search(r"pid=(\d+)", out)
    return int(found.group(1)) if found else None


def pin(pid: int, cpus: frozenset[int]) -> None:
    """Every thread of ``pid`` on ``cpus`` (threads started later inherit it)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:   # the thread ended meanwhile
            pass


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid``, all its threads."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS
