"""A client that disconnects in the middle of a body is one quiet log line, not a
traceback (the real server process, every door)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.harness import ServeProcess

pytestmark = pytest.mark.anyio


async def test_disconnect_mid_body_logs_one_quiet_line(tmp_path: Path) -> None:
    """Every door, and ``/acp``'s per-workspace alias (logged as ``/acp``: its target)."""
    async with ServeProcess(tmp_path) as daemon:
        wid = (await daemon.client.get("/capabilities")).json()["workspaces"][0]["id"]
        paths = ["/session", "/acp", "/lmsp/v1/tasks", f"/workspaces/{wid}/acp"]
        for path in paths:
            stream = await daemon.raw()
            await stream.send(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                              "\r\nContent-Length: 1000\r\n\r\n{\"cwd\":".encode())
            await stream.aclose()
        with anyio.fail_after(10):
            while daemon.stderr_text().count("client disconnected during the request body") \
                    < len(paths):
                await anyio.sleep(0.02)
        assert (await daemon.client.get("/health")).status_code == 200
        log = daemon.stderr_text()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log
    for path in paths[:3]:
        assert f"client disconnected during the request body: POST {path}\n" in log
    assert log.count("client disconnected during the request body: POST /acp\n") == 2


@pytest.mark.parametrize("server", ["granian", "uvicorn"])
async def test_a_prompt_whose_body_was_cut_short_is_not_admitted(tmp_path: Path,
                                                                 server: str) -> None:
    """The prompt route's fast path read a body whose client went away before its
    Content-Length: a prefix that is valid JSON was admitted as a prompt (helper-51)."""
    async with ServeProcess(tmp_path, "--http-server", server) as daemon:
        made = await daemon.client.post("/session", json={"sessionScope": "thread"})
        sid = made.json()["sessionId"]
        body = b'{"prompt":[{"type":"text","text":"/sleep 3s cut short"}]}'
        stream = await daemon.raw()
        await stream.send(f"POST /session/{sid}/prompt HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          f"Content-Type: application/json\r\nContent-Length: {len(body) + 100}"
                          "\r\n\r\n".encode() + body)
        await stream.aclose()
        line = f"client disconnected during the request body: POST /session/{sid}/prompt"
        with anyio.fail_after(10):
            while line not in daemon.stderr_text():
                await anyio.sleep(0.02)
        status = (await daemon.client.get(f"/session/{sid}/status")).json()
        assert status["pendingPrompts"] == 0 and status["lastEventId"] == 0, status


async def test_the_disconnect_line_escapes_the_clients_path(tmp_path: Path) -> None:
    """The path is the client's (percent-decoded): a terminal escape, a CR or a NUL in it
    reached the log raw, and a path of 8 KB whole; now each is escaped and it is cut."""
    async with ServeProcess(tmp_path) as daemon:
        stream = await daemon.raw()
        junk = "%1b[31m%1b]0;owned%07%0dFORGED%00" + "x" * 3000
        await stream.send(f"POST /session/{junk}/prompt HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"a\":"
                          .encode())
        await stream.aclose()
        with anyio.fail_after(10):
            while "client disconnected during the request body" not in daemon.stderr_text():
                await anyio.sleep(0.02)
        log = daemon.stderr_text()
    line = next(line for line in log.splitlines() if "client disconnected" in line)
    decoded = "/session/\x1b[31m\x1b]0;owned\x07\rFORGED\x00"   # 32 characters
    assert line.endswith("POST /session/\\x1b[31m\\x1b]0;owned\\x07\\rFORGED\\x00"
                         + "x" * (512 - len(decoded)) + "…"), line
    assert not any(c in log for c in "\x1b\x07\r\x00"), repr(log)
