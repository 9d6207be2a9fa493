"""Hostile connections against the real server process, on each HTTP server we ship:
header timeout, connection cap, file-descriptor limit (item 6 of the hostile-input pass).

granian (hyper) does not time out a connection that has sent no byte at all (its
HTTP/1-or-2 detection waits for the first bytes): ``acp_server.http.silence`` closes
those for it, so the silent case holds on both; and granian's cap is on requests in flight (SSE streams included), answered by the
front layer, where uvicorn's is on connections, answered before reading
(``acp_server/http/servers.py``)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest

from tests.harness import ServeProcess, read_until_closed

pytestmark = pytest.mark.anyio
CURL = shutil.which("curl")
BOUND_S = 30   # a hang bound: what is waited on is a condition
# Each server once, the client side (the test's own code: the servers are child
# processes) on one backend each.
SERVERS = pytest.mark.parametrize(("server", "anyio_backend"),
                                  [("granian", "asyncio"), ("uvicorn", "trio")])


async def served(daemon: ServeProcess, *parts: bytes) -> tuple[anyio.abc.SocketStream, bytes]:
    """A new connection whose request (``parts``, sent one after the other) was answered
    whole (to its JSON body's end): the connection, kept open, and the answer. The
    header timeout (300 ms here) closes a connection whose head or body has not all
    come in time, as it must: on a loaded machine the test's process may not run for
    that long between its connect and its sends. Such a connection is the timeout's,
    not this request's: another is tried (within a hang bound), so a server that cuts
    a complete request still fails here."""
    with anyio.fail_after(BOUND_S):
        while True:
            stream = await daemon.raw()
            answer = b""
            try:
                for part in parts:
                    await stream.send(part)
                while not answer.endswith(b"}"):   # the head and body may come apart
                    answer += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                if answer:   # cut once it answered: no timeout's doing
                    raise AssertionError(f"cut mid-answer: {answer!r}") from None
                await stream.aclose()
                continue
            return stream, answer


@SERVERS
async def test_silent_and_partial_heads_are_closed(tmp_path: Path, server: str) -> None:
    async with ServeProcess(tmp_path, "--header-timeout-ms", "300",
                              "--http-server", server) as daemon:
        silent = await daemon.raw()
        partial = await daemon.raw()
        await partial.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        keep_alive, first = await served(daemon, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert first.startswith(b"HTTP/1.1 200") and first.endswith(b'{"status":"ok"}'), first
        await keep_alive.send(b"GET /health HTT")   # half of the next head
        with anyio.fail_after(10):
            assert await read_until_closed(silent) == b""
            assert await read_until_closed(partial) == b""
            assert await read_until_closed(keep_alive) == b""
        # A slow but complete request is not cut: the timer ends with the head.
        slow, answer = await served(
            daemon, b"POST /session HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
            b"\r\nContent-Length: 2\r\n\r\n", b"{}")
        assert answer.startswith(b"HTTP/1.1 200"), answer
        await slow.aclose()
        transport = (await daemon.client.get("/daemon/status")).json()["runtime"]["transport"]
        if server == "uvicorn":   # granian's other timeouts happen in Rust, uncounted
            assert transport["headerTimeouts"] >= 3
        else:
            assert transport["headerTimeouts"] >= 1   # the silent one


@pytest.mark.parametrize("anyio_backend", ["trio"])   # the servers are child processes
async def test_silent_connections_do_not_exhaust_granian(tmp_path: Path) -> None:
    """More silent connections than granian's accept cap (``--max-connections`` + 64)
    leave new clients waiting only until the header timeout closes the silent ones;
    meanwhile and after, a request is answered."""
    async with ServeProcess(tmp_path, "--header-timeout-ms", "500", "--max-connections", "8",
                              "--http-server", "granian") as daemon:
        silent = [await daemon.raw() for _ in range(8 + 64 + 8)]
        with anyio.fail_after(20):
            assert (await daemon.client.get("/health")).status_code == 200
            for stream in silent:
                assert await read_until_closed(stream) == b""
        transport = (await daemon.client.get("/daemon/status")).json()["runtime"]["transport"]
        assert transport["headerTimeouts"] >= 1   # granian may close some past its permits


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the servers are child processes
async def test_connection_cap_refuses_at_once(tmp_path: Path) -> None:
    async with ServeProcess(tmp_path, "--max-connections", "4", "--http-server", "uvicorn",
                              "--header-timeout-ms", "60000") as daemon:
        held = [await daemon.raw() for _ in range(4)]
        with anyio.fail_after(10):
            while True:   # the 4 are accepted: the next one is refused, not queued
                extra = await daemon.raw()
                await extra.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
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


async def cap_reached(daemon: ServeProcess) -> None:
    """Until a new HTTP/1.1 connection is refused (the held ones accepted)."""
    with anyio.fail_after(10):
        while True:
            extra = await daemon.raw()
            await extra.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            if (await read_until_closed(extra)).startswith(b"HTTP/1.1 503"):
                return


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the server is a child process
async def test_connection_cap_refuses_http2_in_http2(tmp_path: Path) -> None:
    """Past uvicorn's connection cap, an HTTP/2 client by prior knowledge (httpx with
    ``http2=True``) reads a plain ``503 connection_limit`` with ``Retry-After: 5`` over
    HTTP/2 (its stream answered, then GOAWAY), as an HTTP/1.1 client does. Was the
    HTTP/1.1 bytes: httpx reported a protocol error, not the 503. ``curl
    --http2-prior-knowledge`` reads the same 503 when installed."""
    async with ServeProcess(tmp_path, "--max-connections", "2", "--http-server", "uvicorn",
                              "--header-timeout-ms", "60000") as daemon:
        held = [await daemon.raw() for _ in range(2)]
        await cap_reached(daemon)
        for _ in range(3):   # each a new connection, each refused the same way
            async with httpx.AsyncClient(base_url=daemon.base_url, http1=False, http2=True,
                                         timeout=20) as h2:
                refused = await h2.get("/health")
            assert refused.http_version == "HTTP/2" and refused.status_code == 503
            assert refused.headers["retry-after"] == "5", refused.headers
            assert refused.json()["code"] == "connection_limit"
        if CURL is not None:
            done = await anyio.run_process([CURL, "-s", "--http2-prior-knowledge", "-o",
                                            "/dev/null", "-w", "%{http_code}",
                                            f"{daemon.base_url}/health"], check=False)
            assert done.stdout == b"503", done
        for stream in held:
            await stream.aclose()
        with anyio.fail_after(10):
            while (await daemon.client.get("/health")).status_code != 200:
                await anyio.sleep(0.01)
        status = (await daemon.client.get("/daemon/status")).json()
        assert status["runtime"]["transport"]["connectionsRefused"] >= 4
        assert "Traceback" not in daemon.stderr_text()


@pytest.mark.parametrize("anyio_backend", ["trio"])   # the servers are child processes
async def test_request_cap_refuses_at_once_on_granian(tmp_path: Path) -> None:
    """Four event streams in flight: the fifth request is answered 503 at once."""
    async with ServeProcess(tmp_path, "--max-connections", "4", "--http-server", "granian",
                              ) as daemon:
        sid = (await daemon.client.post("/session", json={})).json()["sessionId"]
        streams = []
        for _ in range(4):
            stream = await daemon.raw()
            await stream.send(f"GET /session/{sid}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              f"Accept: text/event-stream\r\n\r\n".encode())
            assert (await stream.receive()).startswith(b"HTTP/1.1 200")
            streams.append(stream)
        refused = await daemon.client.get("/health")
        assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
        assert refused.json()["code"] == "connection_limit"
        await streams.pop().aclose()
        with anyio.fail_after(10):
            while (await daemon.client.get("/health")).status_code != 200:
                await anyio.sleep(0.01)
        status = (await daemon.client.get("/daemon/status")).json()
        assert status["runtime"]["transport"]["connectionsRefused"] >= 1
        for stream in streams:
            await stream.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the server is a child process
async def test_request_cap_holds_over_one_http2_connection_on_uvicorn(tmp_path: Path) -> None:
    """One HTTP/2 connection carries many requests, so uvicorn's connection cap alone
    would not bound them: with four event streams in flight on it, a fifth request on
    the same connection is answered 503 ``connection_limit`` at once."""
    async with ServeProcess(tmp_path, "--max-connections", "4", "--http-server", "uvicorn",
                              ) as daemon:
        async with httpx.AsyncClient(base_url=daemon.base_url, http1=False, http2=True,
                                     timeout=20) as h2, contextlib.AsyncExitStack() as streams:
            sid = (await h2.post("/session", json={})).json()["sessionId"]
            for _ in range(4):
                stream = await streams.enter_async_context(
                    h2.stream("GET", f"/session/{sid}/events"))
                assert stream.status_code == 200 and stream.http_version == "HTTP/2"
            refused = await h2.get("/health")
            assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
            assert refused.json()["code"] == "connection_limit"
        with anyio.fail_after(10):   # the connection closed: its streams end
            while (await daemon.client.get("/health")).status_code != 200:
                await anyio.sleep(0.01)


@SERVERS
async def test_health_with_400_idle_connections_and_fd_limit(tmp_path: Path,
                                                             server: str) -> None:
    async with ServeProcess(tmp_path, "--http-server", server,
                              shell_prefix="ulimit -Sn 1024;") as daemon:
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
