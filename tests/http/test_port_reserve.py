"""granian binds its own listener after ours is closed: ``reserve_port`` keeps the
port held from that close until granian listens (a CI run saw another socket take a
``port=0`` port in between, and granian's bind fail with "Address already in use")."""

from __future__ import annotations

import asyncio
import queue
import socket
import ssl
import sys
import threading
import urllib.request

import pytest

from acp_server.http.options import HttpOptions
from acp_server.http.servers import Limits, http_server, reserve_port
from tests.http.test_http2 import make_certificates, needs_openssl

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT")


def _listening_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def _bind_refused(port: int, reuse_address: bool = False) -> bool:
    other = socket.socket()
    if reuse_address:   # past the TIME_WAIT of the connections just served
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        other.bind(("127.0.0.1", port))
    except OSError:
        return True
    finally:
        other.close()
    return False


@linux_only
def test_the_reserved_port_cannot_be_taken_and_is_free_once_released() -> None:
    sock = _listening_socket()
    port = sock.getsockname()[1]
    reserved = reserve_port(sock)
    assert reserved is not None and sock.fileno() == -1   # the caller's socket is closed
    assert _bind_refused(port)   # a plain bind, as a client's ephemeral port would be
    assert _bind_refused(port, reuse_address=True)
    with pytest.raises(ConnectionRefusedError):   # it does not listen: nothing queues there
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    reserved.close()
    assert not _bind_refused(port)


@linux_only
def test_granian_starts_beside_the_reservation_and_releases_it() -> None:
    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    limits = Limits(header_timeout_s=10, max_connections=100, max_header_bytes=16384,
                    max_headers=100, max_request_line=8192, ws_max_bytes=1 << 20)
    sock = _listening_socket()
    port = sock.getsockname()[1]
    server = http_server(app, HttpOptions(server="granian"), sock, limits=limits)
    assert _bind_refused(port)   # held between the close and granian's own bind
    listening: queue.Queue[str] = queue.Queue()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete,
                              args=(server.serve(listening.put),), daemon=True)
    thread.start()
    try:
        url = listening.get(timeout=30)
        assert url == f"http://127.0.0.1:{port}"
        assert server._reserved is None   # type: ignore[attr-defined]
        for _ in range(5):   # every connection reaches granian, none the reservation
            assert urllib.request.urlopen(url + "/", timeout=10).read() == b"ok"
    finally:
        loop.call_soon_threadsafe(server.stop, True)
        thread.join(timeout=30)
        loop.close()
    assert not _bind_refused(port, reuse_address=True)   # nothing of ours holds it now


@linux_only
@needs_openssl
def test_a_granian_server_that_cannot_be_made_leaves_no_reservation(tmp_path) -> None:
    """granian's server is made after the port is reserved: when making it fails (the
    certificate, checked when the options were made, replaced since by a file that is
    no PEM certificate), the reservation is closed with it, not left holding the port
    until the exception's frames are collected."""
    certs = make_certificates(tmp_path)
    options = HttpOptions(server="granian", tls_cert=str(certs["server"]),
                          tls_key=str(certs["server-key"]))
    certs["server"].write_text("not a certificate\n")
    limits = Limits(header_timeout_s=10, max_connections=100, max_header_bytes=16384,
                    max_headers=100, max_request_line=8192, ws_max_bytes=1 << 20)
    sock = _listening_socket()
    port = sock.getsockname()[1]
    with pytest.raises(ssl.SSLError) as caught:   # its frames (and their locals) live on
        http_server(None, options, sock, limits=limits)
    assert sock.fileno() == -1
    assert not _bind_refused(port), caught.value
