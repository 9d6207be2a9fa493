"""Hostile connections against the real server process: header timeout, connection
cap, file-descriptor limit (item 6 of the hostile-input pass)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.harness import ServeProcess, read_until_closed

pytestmark = pytest.mark.anyio


async def test_silent_and_partial_heads_are_closed(tmp_path: Path) -> None:
    async with ServeProcess(tmp_path, "--header-timeout-ms", "300") as daemon:
        silent = await daemon.raw()
        partial = await daemon.raw()
        await partial.send(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        keep_alive = await daemon.raw()
        await keep_alive.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        first = await keep_alive.receive()
        assert first.startswith(b"HTTP/1.1 200")
        await keep_alive.send(b"GET /health HTT")   # half of the next head
        with anyio.fail_after(10):
            assert await read_until_closed(silent) == b""
            assert await read_until_closed(partial) == b""
            assert await read_until_closed(keep_alive) == b""
        # A slow but complete request is not cut: the timer ends with the head.
        slow = await daemon.raw()
        await slow.send(b"POST /session HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                        b"\r\nContent-Length: 2\r\n\r\n")
        await slow.send(b"{}")
        assert (await slow.receive()).startswith(b"HTTP/1.1 200")
        transport = (await daemon.client.get("/daemon/status")).json()["runtime"]["transport"]
        assert transport["headerTimeouts"] >= 3


async def test_connection_cap_refuses_at_once(tmp_path: Path) -> None:
    async with ServeProcess(tmp_path, "--max-connections", "4",
                              "--header-timeout-ms", "60000") as daemon:
        held = [await daemon.raw() for _ in range(4)]
        with anyio.fail_after(10):
            while True:   # the 4 are accepted: the next one is refused, not queued
                extra = await daemon.raw()
                await extra.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = await read_until_closed(extra)
                if answer.startswith(b"HTTP/1.1 503"):
                    break
        assert b"retry-after: 5" in answer.lower() and b"connection_limit" in answer
        await held.pop().aclose()
        with anyio.fail_after(10):
            while (await daemon.client.get("/health")).status_code != 200:
                await anyio.sleep(0.01)
        status = (await daemon.client.get("/daemon/status")).json()
        assert status["runtime"]["transport"]["connectionsRefused"] >= 1
        assert status["limits"]["maxConnections"] == 4
        for stream in held:
            await stream.aclose()


async def test_health_with_400_idle_connections_and_fd_limit(tmp_path: Path) -> None:
    async with ServeProcess(tmp_path, shell_prefix="ulimit -Sn 1024;") as daemon:
        limits = Path(f"/proc/{daemon.pid}/limits").read_text()
        row = next(line for line in limits.splitlines() if line.startswith("Max open files"))
        soft, hard = row.split()[3:5]
        assert soft == hard, row   # the soft limit was raised to the hard one
        idle = [await daemon.raw() for _ in range(400)]
        try:
            with anyio.fail_after(10):
                response = await daemon.client.get("/health")
            assert response.json() == {"status": "ok"}
        finally:
            for stream in idle:
                await stream.aclose()
