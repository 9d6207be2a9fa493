"""Hostile methods in the request log (a real ``acp-server serve``): the HTTP server
takes any token as a method, 8 KB long; each was logged whole and kept in the line
cache (``_line_parts``, 4096 entries: ~100 MB from 4096 requests of a second)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from acp_server.ops import request_log as r
from tests.harness import ServeProcess

pytestmark = pytest.mark.anyio


async def test_a_long_unknown_method_is_cut_in_the_line(tmp_path: Path) -> None:
    # granian passes such a method to the app; uvicorn's parser answers it 400 itself
    async with ServeProcess(tmp_path, "--http-server", "granian") as daemon:
        for n in range(3):
            stream = await daemon.raw()
            method = "X" * 7000 + str(n)
            await stream.send(f"{method} /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              "Connection: close\r\n\r\n".encode())
            with anyio.fail_after(10):
                assert (await stream.receive()).startswith(b"HTTP/1.1 405")
            await stream.aclose()
        with anyio.fail_after(10):
            while daemon.stderr_text().count("/health 405") < 3:
                await anyio.sleep(0.02)
        log = daemon.stderr_text()
    lines = [line for line in log.splitlines() if "/health 405" in line]
    assert len(lines) == 3 and all(len(line) < 200 for line in lines), lines
    assert all("acp_server.access: XXXXXXXXXXXXXXXX… /health 405 " in line for line in lines)


def test_the_line_cache_keeps_no_long_method() -> None:
    recorder = r.AccessRecorder(router_of=lambda: None)  # type: ignore[arg-type,return-value]
    writer = r.AccessWriter(__import__("io").StringIO(), "text")
    old, r.access_writer = r.access_writer, writer
    try:
        route = type("Route", (), {"path": "/health"})()
        for n in range(50):
            scope = {"method": "X" * 8000 + str(n), "route": route, "path": "/health"}
            recorder.done("rest", scope, 405, 0.001, None)
        methods = {key[1] for key in r._line_parts}
    finally:
        r.access_writer = old
        writer.close()
    assert max(map(len, methods)) <= r.MAX_METHOD_CHARS + 1, max(map(len, methods))
    assert "GET" == r.method_of({"method": "GET"}) and r.method_of({"method": "Q\x1b"}) == "Q\\x1b"
