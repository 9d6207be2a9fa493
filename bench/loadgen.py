"""A small HTTP/1.1 keep-alive load generator, run in its own process.

    python -m bench.loadgen --port 4170 --method POST --path /session/S/prompt \\
        --body '{"prompt":[{"type":"text","text":"x"}]}' --seconds 3 --connections 16

Prints one JSON line: ``{"requests": N, "seconds": S, "rps": R, "statuses": {...},
"started_at": T}`` (``T``: ``time.monotonic()`` at the first request, comparable across
processes on one machine).
Each connection sends one request at a time (no pipelining) and reads the whole
response (``Content-Length`` bodies only), so the figure is the server's throughput
for that route, not the client's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from collections.abc import Sequence


async def _connection(host: str, port: int, request: bytes, stop_at: float,
                      statuses: Counter[int]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < stop_at:
            status, _ = await exchange(reader, writer, request)
            statuses[status] += 1
    finally:
        writer.close()


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   request: bytes) -> tuple[int, bytes]:
    """Send ``request`` on a kept-alive connection, read its whole response
    (``Content-Length`` bodies only): (status, body)."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return int(head[9:12]), await reader.readexactly(length) if length else b""


async def run(host: str, port: int, request: bytes, seconds: float, connections: int) -> dict:
    statuses: Counter[int] = Counter()
    started_at = time.monotonic()
    start = time.perf_counter()
    stop_at = start + seconds
    await asyncio.gather(*(_connection(host, port, request, stop_at, statuses)
                           for _ in range(connections)))
    elapsed = time.perf_counter() - start
    total = sum(statuses.values())
    return {"requests": total, "seconds": elapsed, "rps": total / elapsed,
            "statuses": {str(k): v for k, v in statuses.items()}, "started_at": started_at}


def build_request(method: str, host: str, port: int, path: str, body: bytes,
                  headers: list[str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: keep-alive"]
    lines += headers
    if body or method in ("POST", "PUT", "PATCH"):
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--method", default="GET")
    parser.add_argument("--path", default="/")
    parser.add_argument("--body", default="")
    parser.add_argument("--header", action="append", default=[])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    request = build_request(args.method, args.host, args.port, args.path, args.body.encode(),
                            args.header)
    result = asyncio.run(run(args.host, args.port, request, args.seconds, args.connections))
    print(json.dumps(result))


if __name__ == "__main__":
    main()


WRK_SCRIPT = """wrk.method = "{method}"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
{headers}
done = function(summary, latency, requests)
  io.write(string.format("STATUS-ERRORS %d %d\\n", summary.errors.status, summary.requests))
end
"""


def wrk_load(port: int, method: str, path: str, body: str, seconds: float,
             connections: int, headers: dict[str, str] | None = None,
             prefix: Sequence[str] = ()) -> dict | None:
    """The same load from ``wrk`` (C, one thread) when it is installed, else ``None``:
    a client far cheaper than this one, so the figure is the server's on 2 cores.
    ``statuses`` has ``"non-2xx"`` and ``"2xx"`` counts only (wrk reports no more).
    ``prefix``: argv that wrk runs under (``taskset -c 0``: the client's cores)."""
    import shutil
    import subprocess
    import tempfile

    wrk = shutil.which("wrk")
    if wrk is None:
        return None
    seconds = max(1, round(seconds))   # wrk's -d takes whole seconds
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        extra = "\n".join(f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}"
                          for k, v in (headers or {}).items())
        script.write(WRK_SCRIPT.format(method=method, body=json.dumps(body), headers=extra))
        script.flush()
        started_at = time.monotonic()
        out = subprocess.run([*prefix, wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s",
                              script.name, f"http://127.0.0.1:{port}{path}"],
                             capture_output=True, text=True, check=True).stdout
    rps = float(next(line.split()[1] for line in out.splitlines()
                     if line.startswith("Requests/sec:")))
    errors, total = next(map(int, line.split()[1:]) for line in out.splitlines()
                         if line.startswith("STATUS-ERRORS"))   # type: ignore[misc]
    return {"requests": total, "seconds": seconds, "rps": rps, "started_at": started_at,
            "statuses": {"non-2xx": errors, "2xx": total - errors}, "client": "wrk"}
