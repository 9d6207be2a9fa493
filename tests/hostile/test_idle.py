"""Connections that hold no request, against the real daemon (granian, the default, and
uvicorn with TLS), closed after the header timeout by ``acp_server.http.idle``:

* HTTP/2 connections that answer every PING and never open a stream (granian keeps them
  for ever, and enough of them fill its accept cap: new clients wait in the backlog);
* TLS connections that finished the handshake and send nothing, on either ALPN;
* a TLS handshake left half done (granian: a fixed 10 s; uvicorn: 60 s, before its
  guard sees the connection);
* a connection whose reader stopped reading once its stream ended (its queued bytes
  kept it);

while an HTTP/2 connection that keeps asking is kept past the timeout (one raw socket:
it cannot have been replaced by a new connection).

The header timeout is 1 s (4 s for the asking connection); what is checked is closed within a few seconds (well below
granian's fixed 10 s), and served meanwhile, waited on with a generous bound.
"""

from __future__ import annotations

import selectors
import socket
import ssl
import threading
import time
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import httpx
import pytest

from tests.harness import ServeProcess
from tests.hostile.test_stop import queued_to, stalled_reader
from tests.http.test_http2 import make_certificates, needs_openssl

TIMEOUT_MS = 1000
ASKING_TIMEOUT_MS = 4000   # the asking connection's test: asks every 0.4 s
CLOSED_WITHIN_S = 6    # 1 s timeout + two sweeps of 0.25 s, on a loaded machine
BOUND_S = 30


class PingAnswerers:
    """``n`` HTTP/2 connections that send the preface and answer every frame the server
    sends (its PINGs), and never open a stream, in a thread; ``closed`` counts the ones
    the server ended."""

    def __init__(self, port: int, n: int) -> None:
        self.selector = selectors.DefaultSelector()
        self.closed = 0
        self.stopping = False
        for _ in range(n):
            sock = socket.create_connection(("127.0.0.1", port))
            conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            conn.initiate_connection()
            sock.sendall(conn.data_to_send())
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ, conn)
        self.thread = threading.Thread(target=self._answer, daemon=True)
        self.thread.start()

    def _answer(self) -> None:
        while not self.stopping and self.selector.get_map():
            for key, _ in self.selector.select(0.1):
                sock: socket.socket = key.fileobj   # type: ignore[assignment]
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self.selector.unregister(sock)
                    sock.close()
                    self.closed += 1
                    continue
                key.data.receive_data(data)
                if out := key.data.data_to_send():
                    sock.sendall(out)

    def close(self) -> None:
        self.stopping = True
        self.thread.join(5)
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()   # type: ignore[union-attr]


class Asker:
    """One HTTP/2 connection (a raw socket: it cannot reconnect) that asks ``GET
    /health``, one request at a time, and answers the server's frames as it reads."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND_S)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self._flush()

    def _flush(self) -> None:
        try:
            self.sock.sendall(self.conn.data_to_send())
        except (BrokenPipeError, ConnectionResetError):
            raise AssertionError("the server closed the connection that keeps asking") from None

    def ask(self) -> int:
        """The status of one ``GET /health`` on this connection; ``AssertionError`` when
        the server closed it."""
        stream_id = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream_id, [
            (":method", "GET"), (":path", "/health"), (":scheme", "http"),
            (":authority", f"127.0.0.1:{self.port}")], end_stream=True)
        self._flush()
        status = 0
        while True:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            assert data, "the server closed the connection that keeps asking"
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.ConnectionTerminated):
                    raise AssertionError("the server ended the connection that keeps asking")
                if getattr(event, "stream_id", None) != stream_id:
                    continue
                if isinstance(event, h2.events.ResponseReceived):
                    status = int(dict(event.headers)[b":status"])
                elif isinstance(event, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(event.flow_controlled_length,
                                                        stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    self._flush()
                    return status
            self._flush()   # PING and SETTINGS acks

    def close(self) -> None:
        self.sock.close()


def closed_by_server(sock: socket.socket, within: float) -> float:
    """Seconds until the server ended ``sock`` (reads and drops what it sends)."""
    start = time.monotonic()
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except (ConnectionResetError, ssl.SSLError):
        pass
    except TimeoutError:
        raise AssertionError(f"still open after {within} s") from None
    return time.monotonic() - start


def test_http2_connections_with_no_stream_are_closed_and_do_not_lock_out(
        tmp_path: Path) -> None:
    """More ping-answering HTTP/2 connections than granian's accept cap (2 + 64): all
    closed after the header timeout, and a new client is answered meanwhile."""
    with ServeProcess(tmp_path, "--header-timeout-ms", str(TIMEOUT_MS),
                      "--max-connections", "2", "--http-server", "granian") as daemon:
        holders = PingAnswerers(daemon.port, 70)
        try:
            with httpx.Client(base_url=daemon.base_url, timeout=BOUND_S) as client:
                assert client.get("/health").status_code == 200
            deadline = time.monotonic() + BOUND_S
            while holders.closed < 70:
                assert time.monotonic() < deadline, f"{holders.closed} of 70 closed"
                time.sleep(0.05)
        finally:
            holders.close()
        transport = daemon.http.get("/daemon/status").json()["runtime"]["transport"]
        assert transport["headerTimeouts"] >= 70


def test_an_http2_connection_that_keeps_asking_is_kept(tmp_path: Path) -> None:
    """A connection that keeps asking is kept, however long it lives: it asks on one
    socket until a silent connection opened after it has been closed by the sweep (so
    it has lived past the timeout), and is still answered on that socket. The timeout
    is ``ASKING_TIMEOUT_MS``, not 1 s: the asker asks every tenth of it, and a test
    process stalled for a whole timeout between two asks (a loaded machine) would be
    closed as idle, rightly."""
    with ServeProcess(tmp_path, "--header-timeout-ms", str(ASKING_TIMEOUT_MS),
                      "--http-server", "granian") as daemon:
        asking = Asker(daemon.port)
        silent = PingAnswerers(daemon.port, 1)
        try:
            deadline = time.monotonic() + BOUND_S
            while silent.thread.is_alive():   # ends once its connection is closed
                assert asking.ask() == 200
                assert time.monotonic() < deadline, "the silent connection is kept"
                silent.thread.join(ASKING_TIMEOUT_MS / 1000 / 10)
            assert silent.closed == 1 and asking.ask() == 200
        finally:
            silent.close()
            asking.close()
        transport = daemon.http.get("/daemon/status").json()["runtime"]["transport"]
        assert transport["headerTimeouts"] >= 1


@pytest.fixture
def certs(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "certs").mkdir()
    return make_certificates(tmp_path / "certs")


def tls(sock: socket.socket, alpn: str) -> socket.socket:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols([alpn])
    return context.wrap_socket(sock)


PARTIAL_HELLO = bytes([22, 3, 1, 2, 0]) + bytes([1, 0, 1, 252]) + b"\x03\x03" + b"\0" * 34


@needs_openssl
@pytest.mark.parametrize("server", ["granian", "uvicorn"])
def test_silent_tls_connections_are_closed(tmp_path: Path, certs: dict[str, Path],
                                           server: str) -> None:
    with ServeProcess(tmp_path, "--header-timeout-ms", str(TIMEOUT_MS), "--http-server",
                      server, "--tls-cert", str(certs["server"]),
                      "--tls-key", str(certs["server-key"])) as daemon:
        address = ("127.0.0.1", daemon.port)
        half = socket.create_connection(address)     # half a ClientHello, then silence
        half.sendall(PARTIAL_HELLO)
        silent = socket.create_connection(address)   # not even that
        done = [tls(socket.create_connection(address), alpn)
                for alpn in ("h2", "http/1.1")]
        for sock in (half, silent, *done):
            assert closed_by_server(sock, CLOSED_WITHIN_S) < CLOSED_WITHIN_S
            sock.close()
        assert daemon.http.get("/health").status_code == 200


@pytest.mark.parametrize("server", ["granian", "uvicorn"])
def test_a_reader_that_stopped_reading_loses_its_connection(tmp_path: Path,
                                                             server: str) -> None:
    """The bytes queued for it kept the connection: in the process, or once closed, in
    the kernel (an orphan in FIN_WAIT1 that a reader with a zero window keeps for ever).
    Once nothing moved for the header timeout, its close is a reset."""
    with ServeProcess(tmp_path, "--session-journal", "memory", "--http-server", server,
                      "--header-timeout-ms", str(TIMEOUT_MS)) as daemon:
        client = daemon.http
        sid = client.post("/session", json={}).json()["sessionId"]
        sock = stalled_reader(daemon.port, f"/session/{sid}/events", "h2")
        try:
            client_port = sock.getsockname()[1]
            deadline = time.monotonic() + BOUND_S
            while client.get("/daemon/status").json()["runtime"]["transport"][
                    "restSseActive"] < 1:   # subscribed before the turn: its chunks reach it
                assert time.monotonic() < deadline, "the event stream never opened"
                time.sleep(0.02)
            posted = client.post(f"/session/{sid}/prompt", json={"prompt": [
                {"type": "text", "text": "/chunks 3000 " + "y" * 3000}]})
            assert posted.status_code == 202, posted.text
            while queued_to(daemon.port, client_port) < 64 * 1024:
                assert time.monotonic() < deadline, "nothing queued for the stalled reader"
                time.sleep(0.05)
            # Closed, by hyper's PING or the sweep, and reset: no socket, the process's
            # or an orphan of the kernel's, keeps the queue the reader never took.
            while queued_to(daemon.port, client_port):
                assert time.monotonic() < deadline, "the stalled connection's queue is kept"
                time.sleep(0.1)
            assert client.get("/health").status_code == 200
        finally:
            sock.close()
