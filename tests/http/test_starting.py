"""``acp_server.http.starting``: the socket's 503 while the store keeps the server from
starting, over a real loopback socket on both backends, with hostile heads."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_server.app import DOORS
from acp_server.http.starting import MAX_HEAD_BYTES, answer_starting, request_path
from tests.http.test_http2 import needs_openssl

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(("head", "path"), [
    (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", "/health"),
    (b"POST /lmsp/v1/tasks?x=1 HTTP/1.0\r\n\r\n", "/lmsp/v1/tasks"),
    (b"GET http://h:1/acp?x HTTP/1.1\r\n\r\n", "/acp"),
    (b"GET http://h:1 HTTP/1.1\r\n\r\n", "/"),
    (b"GET /a b HTTP/1.1\r\n\r\n", None),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", None),
    (b"\x16\x03\x01\x02\x00\x01", None),
    (b"", None),
])
def test_request_path(head: bytes, path: str | None) -> None:
    assert request_path(head) == path


async def _ask(port: int, data: bytes) -> bytes:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(data)
        answer = b""
        with anyio.fail_after(10):
            while True:
                try:
                    answer += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return answer


async def test_each_door_gets_its_503_and_hostile_heads_get_nothing() -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    answers: dict[str, bytes] = {}
    with sock:
        async with anyio.create_task_group() as tg:
            async def serve() -> None:
                await answer_starting(sock, DOORS, seconds=30)   # cancelled below

            tg.start_soon(serve)
            idle = await anyio.connect_tcp("127.0.0.1", port)   # sends nothing
            for name, head in [("health", b"GET /health HTTP/1.1\r\n\r\n"),
                               ("lmsp", b"GET /lmsp/v1/tasks HTTP/1.1\r\n\r\n"),
                               ("acp", b"POST /acp HTTP/1.1\r\n\r\n"),
                               ("rest", b"GET /session/x/status HTTP/1.1\r\n\r\n"),
                               ("huge", b"GET /x HTTP/1.1\r\nX: " + b"a" * MAX_HEAD_BYTES),
                               ("garbage", b"\x00\xff garbage\r\n\r\n")]:
                answers[name] = await _ask(port, head)
            await idle.aclose()
            tg.cancel_scope.cancel()
        # the socket still listens for the server that takes it next
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    assert answers["huge"] == answers["garbage"] == b""
    bodies = {}
    for name in ("health", "lmsp", "acp", "rest"):
        head, _, body = answers[name].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ")
        assert b"\r\nretry-after: 5" in head and b"\r\nconnection: close" in head
        bodies[name] = json.loads(body)
    assert bodies["health"] == {"status": "starting"}
    assert bodies["lmsp"]["code"] == bodies["rest"]["code"] == "store_unavailable"
    assert bodies["acp"]["error"]["data"]["errorKind"] == "store_unavailable"
    assert b"application/problem+json" in answers["lmsp"]


# -- over TLS (--tls-cert, --tls-client-ca): the real process, its store down ----------
@needs_openssl
def test_a_tls_port_answers_starting_over_tls_only(tmp_path: Path) -> None:
    """With ``--tls-cert`` and ``--tls-client-ca``, while the store is down at start, the
    port speaks TLS only, with the client certificate required: a cleartext request gets
    no byte of HTTP, a client without a certificate no answer, and one with it the 503."""
    import ssl
    import time

    from tests.harness import ServeProcess
    from tests.harness.process import free_port
    from tests.http.test_http2 import make_certificates

    certs = make_certificates(tmp_path)
    port = free_port()
    child = ServeProcess(tmp_path / "ws", "--port", str(port),
                         "--store", "postgresql://acp@127.0.0.1:1/acp",
                         "--tls-cert", str(certs["server"]), "--tls-key",
                         str(certs["server-key"]), "--tls-client-ca", str(certs["ca"]))
    (tmp_path / "ws").mkdir()
    child.spawn()
    try:
        deadline = time.monotonic() + 30
        while "answering 503" not in child.stderr_text():
            assert child.returncode is None and time.monotonic() < deadline, \
                child.stderr_text()[-2000:]
            time.sleep(0.05)

        def exchange(wrap: Any) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
                sock = wrap(raw)
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
                received = b""
                try:
                    while chunk := sock.recv(65536):
                        received += chunk
                except (ConnectionError, ssl.SSLError):
                    pass
                return received

        clear = exchange(lambda raw: raw)
        assert b"HTTP/1.1" not in clear and b"starting" not in clear, clear

        def client(cert: bool) -> Any:
            context = ssl.create_default_context(cafile=str(certs["ca"]))
            if cert:
                context.load_cert_chain(str(certs["client"]), str(certs["client-key"]))
            return lambda raw: context.wrap_socket(raw, server_hostname="localhost")

        with pytest.raises((ssl.SSLError, ConnectionError)):
            if not exchange(client(cert=False)):   # TLS 1.3: refused after the handshake
                raise ConnectionError("no answer")
        answer = exchange(client(cert=True))
        assert answer.startswith(b"HTTP/1.1 503") and answer.endswith(b'{"status":"starting"}')
    finally:
        child.kill()


# -- HTTP/2 by prior knowledge (h2c), as both servers will speak it ----------------------
async def test_an_http2_client_gets_each_doors_503_in_http2() -> None:
    """``httpx`` with prior knowledge (``http2=True``, no HTTP/1.1) reads the same 503s
    an HTTP/1.1 client does (it got none before: the preface was no HTTP/1.1 head);
    a connection that breaks the protocol after the preface gets a GOAWAY
    PROTOCOL_ERROR, and the socket still listens afterwards."""
    import h2.connection
    import h2.errors
    import h2.events
    import httpx

    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    with sock:
        async with anyio.create_task_group() as tg:
            async def serve() -> None:
                await answer_starting(sock, DOORS, seconds=30)   # cancelled below

            tg.start_soon(serve)
            answers = {}
            for name, method, path in [("health", "GET", "/health"),
                                       ("lmsp", "GET", "/lmsp/v1/tasks?x=1"),
                                       ("acp", "POST", "/acp"),
                                       ("rest", "GET", "/session/x/status")]:
                async with httpx.AsyncClient(http1=False, http2=True,
                                             base_url=f"http://127.0.0.1:{port}") as client:
                    answers[name] = await client.request(method, path)
            # the preface, then a DATA frame on stream 0 (a connection error)
            garbage = await _ask(port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00" * 9)
            tg.cancel_scope.cancel()
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    for name, answer in answers.items():
        assert answer.http_version == "HTTP/2", name
        assert answer.status_code == 503 and answer.headers["retry-after"] == "5", name
    assert answers["health"].json() == {"status": "starting"}
    assert answers["lmsp"].json()["code"] == answers["rest"].json()["code"] \
        == "store_unavailable"
    assert answers["lmsp"].headers["content-type"] == "application/problem+json"
    assert answers["acp"].json()["error"]["data"]["errorKind"] == "store_unavailable"
    client_side = h2.connection.H2Connection()
    client_side.initiate_connection()
    events = client_side.receive_data(garbage)
    assert any(isinstance(e, h2.events.ConnectionTerminated)
               and e.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR for e in events), events
