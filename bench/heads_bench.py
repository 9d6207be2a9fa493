"""The header attack of issue #21 item 3, on each HTTP server we ship: server RSS and
``/health`` latency while it runs.

    python -m bench heads

Attack (loopback only, bounded in bytes and time): 4 connections send header lines of
8 KiB until 250 MiB each went out, and 4 connections send 1 M short header lines
each; a connection the server closes is reopened and the sending goes on, for at least
``MIN_SECONDS`` (the server refuses each head within its first 64 KiB). Meanwhile
one keep-alive connection asks ``GET /health`` in a loop and a thread samples the
server's RSS (``/proc/PID/status``) every 20 ms. Done-when: peak RSS < 150 MB and
``/health`` p99 < 50 ms.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

BYTES_PER_CONNECTION = int(os.environ.get("BENCH_HEAD_BYTES", str(250 << 20)))
LINES_PER_CONNECTION = int(os.environ.get("BENCH_HEAD_LINES", "1000000"))
DEADLINE_S = float(os.environ.get("BENCH_HEAD_SECONDS", "60"))
MIN_SECONDS = 5.0   # a refused head ends fast: the attack goes on at least this long
HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def _flood(port: int, line: bytes, total: int, stop_at: float, sent: list[int]) -> None:
    chunk = line * max(1, (1 << 16) // len(line))
    done = 0
    busy_until = time.monotonic() + MIN_SECONDS

    def more() -> bool:
        now = time.monotonic()
        return (done < total or now < busy_until) and now < stop_at

    while more():
        try:
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(HEAD)
                while more():
                    sock.sendall(chunk)
                    done += len(chunk)
        except OSError:
            continue   # closed by the server: open another one
    sent.append(done)


def _health(port: int, stop: threading.Event, samples: list[float]) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    while not stop.is_set():
        start = time.perf_counter()
        sock.sendall(request)
        data = b""
        while not data.endswith(b'{"status":"ok"}'):
            more = sock.recv(4096)
            if not more:
                raise RuntimeError("health connection closed")
            data += more
        samples.append((time.perf_counter() - start) * 1000)
        time.sleep(0.005)
    sock.close()


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def attack(server: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as workspace:
        proc = subprocess.Popen(
            [sys.executable, "-m", "acp_server", "serve", "--port", "0", "--workspace",
             workspace, "--state-dir", os.path.join(workspace, ".state"), "--http-server",
             server], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            port = int(line.split("listening on http://", 1)[1].split()[0].rsplit(":", 1)[1])
            before = _rss_mb(proc.pid)
            stop, samples, rss, sent = threading.Event(), [], [before], []
            probe = threading.Thread(target=_health, args=(port, stop, samples))
            probe.start()

            def sample_rss() -> None:
                while not stop.is_set():
                    rss.append(_rss_mb(proc.pid))
                    time.sleep(0.02)

            sampler = threading.Thread(target=sample_rss)
            sampler.start()
            stop_at = time.monotonic() + DEADLINE_S
            start = time.monotonic()
            floods = [threading.Thread(target=_flood, args=(
                port, b"X-Big: " + b"a" * 8183 + b"\r\n", BYTES_PER_CONNECTION, stop_at, sent))
                for _ in range(4)]
            floods += [threading.Thread(target=_flood, args=(
                port, b"X-N: 1\r\n", LINES_PER_CONNECTION * 8, stop_at, sent))
                for _ in range(4)]
            for thread in floods:
                thread.start()
            for thread in floods:
                thread.join()
            seconds = time.monotonic() - start
            stop.set()
            probe.join()
            sampler.join()
            alive = proc.poll() is None
        finally:
            proc.terminate()
            proc.wait(15)
    samples.sort()
    return {"before_mb": before, "peak_mb": max(rss), "seconds": seconds,
            "sent_mib": sum(sent) / (1 << 20), "p50": samples[len(samples) // 2],
            "p99": samples[min(len(samples) - 1, int(len(samples) * 0.99))],
            "probes": len(samples), "alive": float(alive)}


def main() -> list[str]:
    from bench.targets import record

    lines = ["## Header attack (issue #21 item 3: 4 × 250 MiB of header bytes + "
             "4 × 1 M header lines, reconnecting when closed)", "",
             "| server | sent MiB | seconds | RSS before → peak MB | /health p50 / p99 ms "
             "(probes) | alive |", "|---|---|---|---|---|---|"]
    for server in ("granian", "uvicorn"):
        r = attack(server)
        record(f"header attack ({server}): peak RSS MB", r["peak_mb"], 150.0,
               lower_is_better=True)
        record(f"header attack ({server}): /health p99 ms", r["p99"], 50.0,
               lower_is_better=True)
        lines.append(f"| {server} | {r['sent_mib']:.0f} | {r['seconds']:.1f} "
                     f"| {r['before_mb']:.0f} → {r['peak_mb']:.0f} | {r['p50']:.2f} / "
                     f"{r['p99']:.2f} ({r['probes']}) | {'yes' if r['alive'] else '**no**'} |")
    return lines


if __name__ == "__main__":
    print("\n".join(main()))
