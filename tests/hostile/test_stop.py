"""A stop that one client cannot hold up (granian as a child process, where its own stop
waits with no bound; the idle connection's test runs on both servers).

A reader that stops reading its event stream keeps granian's connection open with bytes
queued it will never take; granian's own stop waits for every connection to end, with no
bound. ``GranianServer`` cuts the connections left once the graceful wait
(``GRACEFUL_SHUTDOWN_S``) is over, at once on a second signal, and an idle connection
(nothing in flight) at once: the process exits in seconds, not minutes.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import h2.config
import h2.connection
import h2.settings
import httpx
import pytest

from acp_server.http.servers import GRACEFUL_SHUTDOWN_S
from tests.harness import ServeProcess

BOUND_S = 30       # generous: what is checked is seconds rather than minutes
SLACK_S = 20       # the drain and the exit around the graceful wait, on a loaded machine


def queued_to(server_port: int, client_port: int) -> int:
    """Bytes the server's side of that loopback connection holds unsent or unacknowledged
    (``/proc/net/tcp``'s ``tx_queue``)."""
    local, remote = f"0100007F:{server_port:04X}", f"0100007F:{client_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local and fields[2] == remote:
            return int(fields[4].split(":")[0], 16)
    return 0


def stalled_reader(port: int, path: str, mode: str) -> socket.socket:
    """A connection that asks for ``path`` and never reads a byte (a tiny receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    if mode == "h2":
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
        conn.increment_flow_control_window(2**31 - 1 - 65535)
        conn.send_headers(1, [(":method", "GET"), (":path", path), (":scheme", "http"),
                              (":authority", f"127.0.0.1:{port}")], end_stream=True)
        sock.sendall(conn.data_to_send())
    else:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return sock


@pytest.fixture
def stuck(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServeProcess]:
    """A daemon with an event stream whose reader stopped reading, while a long turn
    runs: bytes stay queued on the connection, that reader will never take."""
    mode = request.param
    # A long header timeout: granian's keep-alive PING (which can end such a connection
    # after twice this) stays out of the picture.
    with ServeProcess(tmp_path, "--session-journal", "memory", "--http-server", "granian",
                      "--header-timeout-ms", "60000") as daemon:   # GranianServer's cut
        client = daemon.http
        sid = client.post("/session", json={}).json()["sessionId"]
        sock = stalled_reader(daemon.port, f"/session/{sid}/events", mode)
        deadline = time.monotonic() + BOUND_S
        while client.get("/daemon/status").json()["runtime"]["transport"][
                "restSseActive"] < 1:
            assert time.monotonic() < deadline, "the event stream never opened"
            time.sleep(0.02)
        posted = client.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": "/chunks 3000 " + "y" * 3000}]})
        assert posted.status_code == 202, posted.text
        client_port = sock.getsockname()[1]
        while queued_to(daemon.port, client_port) < 64 * 1024:
            assert time.monotonic() < deadline, "nothing queued for the stalled reader"
            time.sleep(0.05)
        try:
            yield daemon
        finally:
            sock.close()


def exit_within(daemon: ServeProcess, seconds: float) -> int:
    assert daemon.process is not None
    try:
        return daemon.process.wait(seconds)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running {seconds} s after SIGTERM") from None


@pytest.mark.parametrize("stuck", ["h2"], indirect=True)
def test_a_reader_that_stopped_reading_does_not_hold_the_stop(stuck: ServeProcess) -> None:
    assert stuck.process is not None
    stuck.process.send_signal(signal.SIGTERM)
    assert exit_within(stuck, GRACEFUL_SHUTDOWN_S + SLACK_S) == 0
    log = stuck.stderr_text()
    assert "graceful wait ended" in log and "connection(s) cut" in log, log[-3000:]
    assert "Traceback" not in log


@pytest.mark.parametrize("stuck", ["h2"], indirect=True)
def test_a_second_signal_skips_the_graceful_wait(stuck: ServeProcess) -> None:
    assert stuck.process is not None
    stuck.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + BOUND_S
    while "received SIGTERM: draining" not in stuck.stderr_text():   # the first is taken
        assert time.monotonic() < deadline, stuck.stderr_text()[-3000:]
        time.sleep(0.02)
    stuck.process.send_signal(signal.SIGTERM)
    assert exit_within(stuck, GRACEFUL_SHUTDOWN_S + SLACK_S) == 0
    log = stuck.stderr_text()
    assert "a second signal; " in log and "graceful wait ended" not in log, log[-3000:]


@pytest.mark.parametrize("server", ["granian", "uvicorn"])
def test_an_idle_http2_connection_does_not_delay_the_stop(tmp_path: Path, server: str) -> None:
    """An HTTP/2 connection left idle in a client's pool (it reads nothing while idle,
    so granian's GOAWAY and PING go unanswered): cut at once, not after the wait."""
    # A long header timeout: granian alone would wait for its PING (twice this) to go
    # unanswered.
    with ServeProcess(tmp_path, "--session-journal", "memory", "--http-server", server,
                      "--header-timeout-ms", "60000") as daemon, \
            httpx.Client(base_url=daemon.base_url, http1=False, http2=True) as pooled:
        assert pooled.get("/health").http_version == "HTTP/2"
        assert daemon.process is not None
        daemon.process.send_signal(signal.SIGTERM)
        assert exit_within(daemon, BOUND_S) == 0
        assert "connection(s) cut" not in daemon.stderr_text()   # idle: cut before the wait
