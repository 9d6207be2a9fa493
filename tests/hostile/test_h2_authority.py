"""HTTP/2's ``:authority`` and a ``host`` field against the real server process, on
both HTTP servers we ship (and granian's RSGI interface), by prior knowledge (h2c).

RFC 9113 §8.3.1: a client MUST NOT send a ``host`` that differs from ``:authority``,
and a server SHOULD treat such a request as malformed. What each server hands the app
decides what the Host check can see (``docs/security.md``, "DNS rebinding"):

* uvicorn (acp-server's own HTTP/2, python-hyper's ``h2``): both fields differing (or
  two ``host`` fields, or neither) is malformed: the stream is reset ``PROTOCOL_ERROR``
  before the app, the connection's other streams served. ``:authority`` alone becomes
  the ``host`` the check reads.
* granian's ASGI: its scope carries the ``host`` field when there is one and
  ``:authority`` only when there is not; the check reads that ``host``. So a ``host``
  naming us beside an ``:authority`` naming another is served: only a client that sets
  both itself can send that (no browser does), and it could send the good ``host``
  alone.
* granian's RSGI (``acp_server.http.rsgi``): RSGI's scope has both, and the adapter
  hands a differing ``:authority`` to the app as a second ``host``: 400, as two
  ``Host`` fields over HTTP/1.1.

Asserted: each outcome as documented, the refusals in the door's own shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest

from tests.harness import ServeProcess

pytestmark = pytest.mark.anyio
SERVERS = pytest.mark.parametrize("flags", [
    pytest.param(("--http-server", "uvicorn"), id="uvicorn"),
    pytest.param(("--http-server", "granian"), id="granian"),
    pytest.param(("--http-server", "granian", "--granian-interface", "rsgi"), id="granian-rsgi"),
])
EVIL = b"evil.example"


class Answer:
    """One stream's outcome: its status, headers and body, or ``reset`` (``status``
    None), or the connection ``closed`` first."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: dict[bytes, bytes] = {}
        self.body = b""
        self.reset = False
        self.closed = False

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return (f"Answer(status={self.status}, reset={self.reset}, closed={self.closed}, "
                f"body={self.body[:200]!r})")


class H2:
    """Requests one at a time on one h2c connection, each head exactly as given (the
    client's own checks off: two ``host`` fields, one differing from ``:authority``)."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False,
            normalize_outbound_headers=False))
        self.conn.initiate_connection()

    async def request(self, fields: list[tuple[bytes, bytes]], method: bytes = b"GET",
                      path: bytes = b"/capabilities", body: bytes | None = None) -> Answer:
        sid = self.conn.get_next_available_stream_id()
        head = [(b":method", method), (b":scheme", b"http"), (b":path", path), *fields]
        if body is not None:
            head += [(b"content-type", b"application/json"),
                     (b"content-length", str(len(body)).encode())]
        self.conn.send_headers(sid, head, end_stream=body is None)
        if body is not None:
            self.conn.send_data(sid, body, end_stream=True)
        answer = Answer()
        await self.stream.send(self.conn.data_to_send())
        with anyio.fail_after(20):
            while not (answer.reset or answer.closed):
                try:
                    data = await self.stream.receive()
                    events = self.conn.receive_data(data)
                except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError,
                        h2.exceptions.ProtocolError):
                    answer.closed = True
                    break
                ended = False
                for event in events:
                    if getattr(event, "stream_id", sid) != sid:
                        continue
                    if isinstance(event, h2.events.ResponseReceived):
                        answer.headers = dict(event.headers)
                        answer.status = int(answer.headers[b":status"])
                    elif isinstance(event, h2.events.DataReceived):
                        answer.body += event.data
                        self.conn.acknowledge_received_data(event.flow_controlled_length,
                                                            sid)
                    elif isinstance(event, h2.events.StreamEnded):
                        ended = True
                    elif isinstance(event, h2.events.StreamReset):
                        answer.reset = answer.status is None   # (after a whole answer: ended)
                        ended = True
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        answer.closed = True
                pending = self.conn.data_to_send()
                if pending and not answer.closed:
                    await self.stream.send(pending)
                if ended:
                    break
        return answer


async def connect(daemon: ServeProcess) -> H2:
    return H2(await daemon.raw())


def authority(value: bytes) -> tuple[bytes, bytes]:
    return (b":authority", value)


def host(value: bytes) -> tuple[bytes, bytes]:
    return (b"host", value)


@SERVERS
async def test_authority_and_host_differing(tmp_path: Path, flags: tuple[str, ...]) -> None:
    """(a) a good ``:authority``, an evil ``host``; (b) the reverse; the same with two
    ``host`` fields; and both equal (served)."""
    uvicorn = flags[1] == "uvicorn"
    async with ServeProcess(tmp_path, *flags) as daemon:
        ours = f"127.0.0.1:{daemon.port}".encode()
        evil = EVIL + f":{daemon.port}".encode()
        h2c = await connect(daemon)
        try:
            a = await h2c.request([authority(ours), host(evil)])
            b = await h2c.request([authority(evil), host(ours)])
            two = await h2c.request([authority(ours), host(ours), host(evil)])
            same = await h2c.request([authority(ours), host(ours)])
        finally:
            await h2c.stream.aclose()
        assert same.status == 200, same
        if uvicorn:   # malformed (RFC 9113 §8.1.1, §8.3.1): that stream alone reset
            assert a.reset and b.reset and two.reset, (a, b, two)
            return
        assert two.status == 400 and two.json()["code"] == "bad_request", two
        if "rsgi" in flags:   # the adapter hands the app both: two Host fields, 400
            assert a.status == 400 and a.json()["code"] == "bad_request", a
            assert b.status == 400 and b.json()["code"] == "bad_request", b
            return
        # granian's ASGI hands the app the ``host`` field, never ``:authority`` beside it
        assert a.status == 421 and a.json()["code"] == "misdirected_request", a
        assert b.status == 200, b   # :authority dropped by granian (docs/security.md)


@SERVERS
async def test_authority_alone_and_host_alone_are_checked(tmp_path: Path,
                                                          flags: tuple[str, ...]) -> None:
    """(c) ``:authority`` alone naming another host: 421 in each door's shape; (d) a
    ``host`` alone: checked as over HTTP/1.1; neither: refused."""
    uvicorn = flags[1] == "uvicorn"
    async with ServeProcess(tmp_path, *flags, "--allow-host", "dev.box") as daemon:
        ours = f"127.0.0.1:{daemon.port}".encode()
        evil = EVIL + f":{daemon.port}".encode()
        h2c = await connect(daemon)
        try:
            rest = await h2c.request([authority(evil)])
            lmsp = await h2c.request([authority(evil)], path=b"/lmsp/v1/tasks")
            acp = await h2c.request([authority(evil)], method=b"POST", path=b"/acp",
                                    body=json.dumps({"jsonrpc": "2.0", "id": 0,
                                                     "method": "initialize", "params": {
                                                         "protocolVersion": 1}}).encode())
            host_evil = await h2c.request([host(evil)])
            fine = [await h2c.request([field(value)]) for field in (authority, host)
                    for value in (ours, b"localhost", b"dev.box:8443")]
            neither = await h2c.request([])
            after = await h2c.request([authority(ours)], path=b"/health")
        finally:
            await h2c.stream.aclose()
        assert rest.status == 421 and rest.json()["code"] == "misdirected_request", rest
        assert lmsp.status == 421, lmsp
        assert lmsp.headers[b"content-type"].startswith(b"application/problem+json")
        assert lmsp.json()["code"] == "misdirected_request", lmsp
        assert acp.status == 421, acp
        assert acp.json()["error"]["data"]["errorKind"] == "misdirected_request", acp
        assert host_evil.status == 421 and host_evil.json()["code"] == "misdirected_request"
        assert [answer.status for answer in fine] == [200] * 6, fine
        # Neither field: malformed to h2 (reset); granian gives an empty ``host`` (421).
        assert neither.reset if uvicorn else neither.status == 421, neither
        assert after.status == 200, after   # the connection still serves
