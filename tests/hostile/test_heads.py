"""Hostile request heads and hosts against the real server process, on both HTTP
servers we ship and over HTTP/2 (issue #21 items 3, 4 and 10; #26 HTTP/2 abuse).

Asserted: the refusal (414 / 431 / 421 / 501 in the door's shape, or the connection
closed), and that the process stays healthy afterwards (``/health`` answers, RSS
bounded). The timings of the done-when figures are measured by ``make bench``, not here.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import anyio
import pytest

from tests.acp_http.wsclient import ws_connect
from tests.harness import ServeProcess, read_chunk_burst
from tests.hostile.h2client import H2Client

pytestmark = pytest.mark.anyio
SERVERS = pytest.mark.parametrize("server", ["granian", "uvicorn"])
RSS_LIMIT_KB = 400 * 1024   # far above a healthy daemon, far below an unbounded head


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def complete(answer: bytes) -> bool:
    """Whether ``answer`` holds one whole response: its head and a ``Content-Length``
    body, or a chunked body to its last chunk (other bodies end with the connection)."""
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    fields = {name.strip().lower(): value.strip() for name, _, value in
              (line.partition(b":") for line in head.split(b"\r\n")[1:])}
    if b"chunked" in fields.get(b"transfer-encoding", b"").lower():
        return body.endswith(b"0\r\n\r\n")
    length = fields.get(b"content-length")
    return length is not None and len(body) >= int(length)


async def raw_exchange(daemon: ServeProcess, head: bytes) -> bytes:
    """Sends ``head`` on a new connection; what comes back until one whole response has
    arrived or the server closes the connection. (Not until the close alone: granian
    keeps a connection open after its 431 / 414 until its 10 s keep-alive ends.)"""
    stream = await daemon.raw()
    try:
        await stream.send(head)
    except (anyio.BrokenResourceError, ConnectionResetError, BrokenPipeError):
        pass
    received = b""
    with anyio.fail_after(20):
        try:
            while not complete(received):
                received += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
            pass
        finally:
            await stream.aclose()
    return received


async def flood(daemon: ServeProcess, line: bytes, total: int) -> None:
    """Send header lines until ``total`` bytes or until the server closes."""
    stream = await daemon.raw()
    sent = 0
    try:
        await stream.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        chunk = line * max(1, (1 << 16) // len(line))
        while sent < total:
            await stream.send(chunk)
            sent += len(chunk)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionResetError,
            BrokenPipeError, OSError):
        pass
    finally:
        await stream.aclose()


def status_of(answer: bytes) -> int | None:
    return int(answer[9:12]) if answer.startswith(b"HTTP/1.1 ") else None


@SERVERS
async def test_head_caps_refuse_before_the_app(tmp_path: Path, server: str) -> None:
    async with ServeProcess(tmp_path, "--http-server", server, "--max-headers", "20",
                              "--max-header-bytes", "4096",
                              "--max-request-line-bytes", "2048") as daemon:
        many = await raw_exchange(daemon, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                  + b"X-N: 1\r\n" * 40 + b"\r\n")
        big = await raw_exchange(daemon, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                 + b"X-Big: " + b"b" * 8000 + b"\r\n\r\n")
        long_line = await raw_exchange(daemon, b"GET /" + b"a" * 4000
                                       + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert status_of(many) == 431 and status_of(big) == 431, (many[:80], big[:80])
        assert status_of(long_line) in (414, 431), long_line[:80]
        # In the REST shape when the answer has a body (hyper's own 431 has none).
        for answer in (many, big, long_line):
            body = answer.split(b"\r\n\r\n", 1)[1]
            if body:
                assert json.loads(body)["code"] in ("header_fields_too_large", "uri_too_long")
        # Under the caps the same requests are served.
        fine = await raw_exchange(daemon, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                  b"Connection: close\r\n" + b"X-N: 1\r\n" * 10 + b"\r\n")
        assert status_of(fine) == 200
        assert (await daemon.client.get("/health")).status_code == 200


@SERVERS
async def test_header_floods_keep_the_process_healthy(tmp_path: Path, server: str) -> None:
    """4 connections of 32 MiB of header bytes and 4 of 200,000 header lines (the
    done-when attack is 250 MiB and 1 M lines: ``make bench`` runs that one)."""
    async with ServeProcess(tmp_path, "--http-server", server) as daemon:
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(flood, daemon, b"X-Big: " + b"a" * 8185 + b"\r\n", 32 << 20)
                tg.start_soon(flood, daemon, b"X-N: 1\r\n", 200_000 * 8)
        assert (await daemon.client.get("/health")).json() == {"status": "ok"}
        assert rss_kb(daemon.pid) < RSS_LIMIT_KB


@SERVERS
async def test_foreign_host_is_421_in_each_doors_shape(tmp_path: Path, server: str) -> None:
    async with ServeProcess(tmp_path, "--http-server", server,
                              "--allow-host", "dev.box") as daemon:
        port = daemon.port
        evil = {"Host": f"evil.example:{port}"}
        rest = await daemon.client.get("/capabilities", headers=evil)
        assert rest.status_code == 421 and rest.json()["code"] == "misdirected_request"
        lmsp = await daemon.client.get("/lmsp/v1/tasks", headers=evil)
        assert lmsp.status_code == 421
        assert lmsp.headers["content-type"].startswith("application/problem+json")
        assert lmsp.json()["code"] == "misdirected_request"
        caps = (await daemon.client.get("/capabilities")).json()["workspaces"][0]
        mounts = [f"/workspaces/{caps['id']}/acp",
                  f"/workspaces/{quote(caps['cwd'], safe='')}%2F/acp"]   # its aliases
        for path in ("/acp", *mounts):
            acp = await daemon.client.post(path, headers=evil, json={
                "jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": 1}})
            assert acp.status_code == 421, path
            assert acp.json()["error"]["data"]["errorKind"] == "misdirected_request"
        for fine in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}",
                     "dev.box", "dev.box:8080"):
            assert (await daemon.client.get("/capabilities",
                                            headers={"Host": fine})).status_code == 200, fine
        # The WebSocket handshake gets the same check.
        for path in ("/acp", *mounts):
            answer = await raw_exchange(daemon, (
                f"GET {path} HTTP/1.1\r\nHost: evil.example:{port}\r\nUpgrade: websocket\r\n"
                "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").encode())
            assert status_of(answer) in (421, 403), (path, answer[:80])
            async with ws_connect(daemon.base_url, path):   # a fine Host: accepted
                pass


@SERVERS
async def test_transfer_codings_other_than_chunked_are_501(tmp_path: Path,
                                                          server: str) -> None:
    async with ServeProcess(tmp_path, "--http-server", server) as daemon:
        answer = await raw_exchange(daemon, b"POST /session HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                    b"Content-Type: application/json\r\n"
                                    b"Transfer-Encoding: gzip, chunked\r\nConnection: close"
                                    b"\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
        assert status_of(answer) in (501, 400), answer[:120]   # never served as plain JSON
        assert (await daemon.client.get("/health")).status_code == 200


@SERVERS
async def test_http2_abuse(tmp_path: Path, server: str) -> None:
    """Too many streams, a stream that never reads, headers over the cap: each refused
    or contained; the process and the other streams stay healthy."""
    # The in-memory journal: its bus pushes at publish, so the stream that never reads
    # overflows while granian still buffers its writes (a journaled bus feeds each
    # reader as it takes, and granian's buffering hides this stall from it for 1 MB).
    async with ServeProcess(tmp_path, "--max-header-bytes", "8192",
                            "--session-journal", "memory", "--http-server", server) as daemon:
        sid = (await daemon.client.post("/session", json={})).json()["sessionId"]
        async with await H2Client.connect(daemon.port) as h2:
            # 1. More concurrent streams than the server allows (100).
            streams = [h2.request("GET", f"/session/{sid}/events") for _ in range(150)]
            outcomes = await h2.settle(streams)
            assert outcomes.count(200) <= 100 and "reset" in outcomes, outcomes
        async with await H2Client.connect(daemon.port) as h2:
            # 2. Headers larger than the cap: 431 or a reset, never served.
            big = h2.request("GET", "/health", extra=[(b"x-big", b"a" * 16000)])
            [outcome] = await h2.settle([big])
            assert outcome in (431, "reset", "closed"), outcome
        # 3. A stream that never reads (window 1 byte), beside a reader that reads: the
        # stalled one is evicted, the reader gets every chunk.
        async with await H2Client.connect(daemon.port, window=1) as stalled:
            stalled.request("GET", f"/session/{sid}/events")
            await stalled.flush()
            with anyio.fail_after(20):
                while (await daemon.client.get("/daemon/status")).json()["runtime"][
                        "transport"]["restSseActive"] < 1:
                    await anyio.sleep(0.02)
            chunks, _ = await read_chunk_burst(daemon.base_url, sid, 4000, http2=True)
            assert chunks == 4000
            metrics = (await daemon.client.get("/metrics")).text
            evicted = [line for line in metrics.splitlines()
                       if line.startswith("acp_server_sse_evictions_total")]
            assert evicted and float(evicted[0].split()[-1]) >= 1, evicted
        assert (await daemon.client.get("/health")).json() == {"status": "ok"}
        assert rss_kb(daemon.pid) < RSS_LIMIT_KB


@SERVERS
async def test_two_host_fields_are_400_and_an_http_1_0_request_without_one_is_served(
        tmp_path: Path, server: str) -> None:
    """RFC 9112 §3.2: more than one Host is a 400 (the check read only the last one, so
    ``Host: evil`` then ``Host: 127.0.0.1`` passed); HTTP/1.0 tools send none."""
    async with ServeProcess(tmp_path, "--http-server", server) as daemon:
        for first, second in (("evil.example", "127.0.0.1"), ("127.0.0.1", "evil.example")):
            answer = await raw_exchange(daemon, (
                f"GET /capabilities HTTP/1.1\r\nHost: {first}\r\nHost: {second}\r\n"
                "Connection: close\r\n\r\n").encode())
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400"), answer[:300]
            assert json.loads(body)["code"] == "bad_request", body
        answer = await raw_exchange(daemon, b"GET /health HTTP/1.0\r\n\r\n")
        assert answer.split(b"\r\n", 1)[0].split()[1] == b"200", answer[:300]
        assert b'"status":"ok"' in answer
