"""A prompt whose send failed in a way the next send would repeat is not sent again:
an untrusted certificate, a name that does not resolve, https to a plain HTTP port
raise ``DaemonConnectionError`` at once, naming the cause, while a refused connection
is still sent again (``tests/sdk/test_prompt_reconnect.py``). Over real sockets; the
connection attempts are counted where they arrive, never timed."""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest
from anyio.streams.tls import TLSStream

from acp_server.client import DaemonClient, DaemonConnectionError, DaemonStreamError
from acp_server.client.errors import lasting_failure
from tests.http.test_http2 import make_certificates, needs_openssl
from tests.sdk.cutter import Cutter, cutter
from tests.sdk.harness import daemon

pytestmark = pytest.mark.anyio


@dataclass
class Accepts:
    port: int
    count: int = 0


@contextlib.asynccontextmanager
async def untrusted_tls(tmp_path: Path) -> AsyncIterator[Accepts]:
    """A loopback TLS listener whose certificate is signed by a CA no client trusts;
    it counts the connections it accepts."""
    certs = make_certificates(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs["server"], certs["server-key"])
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    accepts = Accepts(listener.extra(anyio.abc.SocketAttribute.local_port))

    async def handshake(stream: anyio.abc.SocketStream) -> None:
        accepts.count += 1
        try:
            async with await TLSStream.wrap(stream, server_side=True, ssl_context=context):
                pass
        except (anyio.BrokenResourceError, ssl.SSLError, OSError):
            pass   # the client refused the certificate

    async with listener, anyio.create_task_group() as tasks:
        tasks.start_soon(listener.serve, handshake)
        yield accepts
        tasks.cancel_scope.cancel()


@needs_openssl
async def test_a_certificate_that_does_not_verify_is_not_sent_again(tmp_path: Path) -> None:
    async with untrusted_tls(tmp_path) as server, DaemonClient(
            f"https://127.0.0.1:{server.port}", max_retry_wait_s=0) as client:
        with pytest.raises(DaemonConnectionError,
                           match="certificate verify failed: unable to get local issuer"):
            await client.prompt("s-1", "never sent")
        assert server.count == 1 and client.pending_prompt_count("s-1") == 0


@needs_openssl
async def test_an_event_stream_is_not_resumed_after_a_certificate_that_does_not_verify(
        tmp_path: Path) -> None:
    async with untrusted_tls(tmp_path) as server, DaemonClient(
            f"https://127.0.0.1:{server.port}") as client:
        with pytest.raises(DaemonStreamError, match="lost: certificate verify failed"):
            async for _ in client.subscribe_events("s-1"):
                pass
        assert server.count == 1


async def test_https_to_a_plain_port_is_not_sent_again(tmp_path: Path) -> None:
    async with daemon(tmp_path) as srv, cutter(int(srv.url.rsplit(":", 1)[1])) as proxy:
        plain = proxy.url.replace("http://", "https://")
        async with DaemonClient(plain, max_retry_wait_s=0) as client:
            with pytest.raises(DaemonConnectionError,
                               match="TLS handshake failed: wrong version number"):
                await client.prompt("s-1", "never sent")
        assert proxy.connections == 1 and proxy.prompt_posts == 0


async def test_a_name_that_does_not_resolve_is_not_sent_again() -> None:
    """A label may not start with '-': the C library refuses the name before asking any
    resolver (no network needed), and ``.invalid`` resolves nowhere anyway."""
    sends: list[httpx.Request] = []

    async def count(request: httpx.Request) -> None:
        sends.append(request)

    async with DaemonClient("http://-no-such-host.invalid:4170", max_retry_wait_s=0,
                            event_hooks={"request": [count]}) as client:
        with pytest.raises(DaemonConnectionError, match="name not resolved"):
            await client.prompt("s-1", "never sent")
    assert len(sends) == 1


def test_what_is_lasting() -> None:
    """A refused or reset connection, a cut handshake, a resolver out of reach are not."""
    def under(cause: BaseException) -> httpx.ConnectError:
        exc = httpx.ConnectError("failed")
        exc.__cause__ = cause
        return exc

    assert lasting_failure(under(socket.gaierror(socket.EAI_NONAME, "not known")))
    assert lasting_failure(under(ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong")))
    assert not lasting_failure(under(socket.gaierror(socket.EAI_AGAIN, "try again")))
    assert not lasting_failure(under(ssl.SSLEOFError(8, "EOF occurred")))
    assert not lasting_failure(under(ConnectionRefusedError(111, "refused")))
    assert not lasting_failure(under(ConnectionResetError(104, "reset")))


@contextlib.asynccontextmanager
async def tls_front(tmp_path: Path, proxy: Cutter) -> AsyncIterator[tuple[Accepts, Path]]:
    """A loopback TLS front to ``proxy`` (a certificate the client trusts: the CA file
    yielded) that, once a prompt POST has gone through, presents a certificate of a CA
    no client trusts (a balancer restarted with the wrong one); it counts the
    connections it accepts."""
    folders = tmp_path / "trusted", tmp_path / "untrusted"
    for folder in folders:
        folder.mkdir()
    trusted, untrusted = (make_certificates(folder) for folder in folders)
    contexts = []
    for certs in (trusted, untrusted):
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certs["server"], certs["server-key"])
        contexts.append(context)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    accepts = Accepts(listener.extra(anyio.abc.SocketAttribute.local_port))

    async def pump(source: anyio.abc.ByteStream, sink: anyio.abc.ByteStream,
                   both: anyio.CancelScope) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError,
                                 anyio.EndOfStream, ssl.SSLError, OSError):
            async for chunk in source:
                await sink.send(chunk)
        both.cancel()

    async def relay(stream: anyio.abc.SocketStream) -> None:
        accepts.count += 1
        context = contexts[0] if proxy.prompt_posts == 0 else contexts[1]
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError,
                                 anyio.EndOfStream, ssl.SSLError, OSError):
            tls = await TLSStream.wrap(stream, server_side=True, ssl_context=context,
                                       standard_compatible=False)
            upstream = await anyio.connect_tcp("127.0.0.1", proxy.port)
            async with tls, upstream, anyio.create_task_group() as pumps:
                pumps.start_soon(pump, tls, upstream, pumps.cancel_scope)
                pumps.start_soon(pump, upstream, tls, pumps.cancel_scope)
        await stream.aclose()

    async with listener, anyio.create_task_group() as tasks:
        tasks.start_soon(listener.serve, relay)
        yield accepts, trusted["ca"]
        tasks.cancel_scope.cancel()


@needs_openssl
async def test_after_a_cut_a_certificate_that_does_not_verify_is_not_asked_again(
        tmp_path: Path) -> None:
    """A prompt's answer cut on the way; the server's features (``/capabilities``) are
    asked before it goes again, and that connection's certificate does not verify: it
    raises at once, as a send's lasting failure does. Before, it was taken for a server
    out of reach: asked again after each wait, three handshakes for nothing."""
    async with daemon(tmp_path) as srv, cutter(int(srv.url.rsplit(":", 1)[1])) as proxy, \
            tls_front(tmp_path, proxy) as (front, ca):
        verify = ssl.create_default_context(cafile=str(ca))
        async with DaemonClient(f"https://127.0.0.1:{front.port}", max_retry_wait_s=0,
                                transport=httpx.AsyncHTTPTransport(verify=verify)) as client:
            sid = (await client.create_or_attach_session()).session_id
            proxy.cut_prompts = 1
            connections = front.count
            with pytest.raises(DaemonConnectionError, match="certificate verify failed"):
                await client.prompt(sid, "/chunks 1 cut")
            assert proxy.prompt_posts == 1
            assert front.count - connections == 1   # the /capabilities handshake, once
            assert client.pending_prompt_count(sid) == 0
