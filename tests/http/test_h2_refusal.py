"""``acp_server.http.h2_refusal`` as a unit, on an injected clock and a recording
transport: how long a refused connection is held, how many at once, and what one that
never says enough is told. (The real server's refusals, HTTP/2 and HTTP/1.1, are in
``tests/hostile/test_connections.py``.)"""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.events

from acp_server.http.h2_machine import PREFACE, Http2Limits
from acp_server.http.h2_refusal import HTTP1_REFUSAL, READ_CAP, Refusals
LIMITS = Http2Limits(idle_s=10.0, max_header_list=65536)


class FakeLoop:
    """``call_later`` on a clock the test moves; its handles can be cancelled."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[Timer] = []

    def call_later(self, delay: float, callback: Any, *args: Any) -> Timer:
        timer = Timer(self, self.now + delay, callback, args)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for timer in sorted((t for t in self.timers if t.at <= self.now), key=lambda t: t.at):
            if timer in self.timers:
                self.timers.remove(timer)
                timer.callback(*timer.args)


class Timer:
    def __init__(self, loop: FakeLoop, at: float, callback: Any, args: tuple[Any, ...]) -> None:
        self.loop, self.at, self.callback, self.args = loop, at, callback, args

    def cancel(self) -> None:
        if self in self.loop.timers:
            self.loop.timers.remove(self)


class Transport:
    def __init__(self) -> None:
        self.written = b""
        self.protocol: Any = None
        self.closed = self.eof = False

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def write(self, data: bytes) -> None:
        self.written += data

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.protocol.connection_lost(None)


def refused(refusals: Refusals, loop: FakeLoop) -> Transport:
    transport = Transport()
    assert refusals.refuse(transport, loop)  # type: ignore[arg-type]
    return transport


def test_refusals_held_at_once_are_bounded_and_each_for_wait_s() -> None:
    loop, refusals = FakeLoop(), Refusals(LIMITS, max_waiting=2, wait_s=1.0)
    silent, half = refused(refusals, loop), refused(refusals, loop)
    assert not refusals.refuse(Transport(), loop)  # type: ignore[arg-type]  # the caller answers
    half.protocol.data_received(PREFACE[:10])
    loop.advance(0.9)
    assert not silent.closed and not half.closed and refusals.waiting == 2
    loop.advance(0.1)
    assert silent.written == HTTP1_REFUSAL and silent.closed   # nothing said: HTTP/1.1
    assert half.written == HTTP1_REFUSAL and half.closed        # (half a preface is not h2)
    assert refusals.waiting == 0


def test_an_http1_request_is_answered_then_read_until_the_client_closes() -> None:
    loop, refusals = FakeLoop(), Refusals(LIMITS, wait_s=1.0)
    transport = refused(refusals, loop)
    transport.protocol.data_received(b"GET / HTTP/1.1\r\n")
    assert transport.written == HTTP1_REFUSAL and transport.eof and not transport.closed
    transport.protocol.data_received(b"Host: x\r\n\r\n")   # read and dropped
    assert transport.protocol.eof_received() is False   # the client closed: closed
    transport.close()
    assert refusals.waiting == 0


def test_an_http2_connection_without_a_request_is_told_by_goaway() -> None:
    """The preface and SETTINGS, then no request for ``wait_s``: GOAWAY (no error,
    last stream 0: nothing was taken), closed."""
    loop, refusals = FakeLoop(), Refusals(LIMITS, wait_s=1.0)
    transport = refused(refusals, loop)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    transport.protocol.data_received(client.data_to_send())
    loop.advance(1.0)
    events = client.receive_data(transport.written)
    goaway = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
    assert len(goaway) == 1 and goaway[0].error_code == 0 and goaway[0].last_stream_id == 0
    assert goaway[0].additional_data == b"too many connections" and transport.closed


def test_an_http2_request_is_answered_503_then_goaway() -> None:
    loop, refusals = FakeLoop(), Refusals(LIMITS, wait_s=1.0)
    transport = refused(refusals, loop)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(1, [(":method", "GET"), (":path", "/"), (":scheme", "http"),
                            (":authority", "x")], end_stream=True)
    transport.protocol.data_received(client.data_to_send())
    events = client.receive_data(transport.written)
    [response] = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
    assert dict(response.headers)[b":status"] == b"503"
    assert dict(response.headers)[b"retry-after"] == b"5"
    [body] = [e for e in events if isinstance(e, h2.events.DataReceived)]
    assert b"connection_limit" in body.data
    [goaway] = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
    assert goaway.error_code == 0 and goaway.last_stream_id == 1
    assert transport.eof and not transport.closed
    loop.advance(1.0)   # the client never closed: closed at wait_s
    assert transport.closed and refusals.waiting == 0


def test_a_control_flood_before_any_request_is_cut_off() -> None:
    """PINGs (each acknowledged) and no request: closed once ``READ_CAP`` bytes were
    read, so the acknowledgements written to a client that may not read stay bounded."""
    loop, refusals = FakeLoop(), Refusals(LIMITS, wait_s=1.0)
    transport = refused(refusals, loop)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    transport.protocol.data_received(client.data_to_send())
    for n in range(READ_CAP // 17 + 1):
        client.ping(n.to_bytes(8, "big"))
        transport.protocol.data_received(client.data_to_send())
        if transport.closed:
            break
    assert transport.closed and refusals.waiting == 0
    assert len(transport.written) <= READ_CAP + 1024
