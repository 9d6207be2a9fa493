"""``acp_server.http.guard`` below uvicorn, as units: the one sweep that times request
heads (``HeadDeadlines``, on an injected clock), and the head caps measured on bytes
as they arrive, whatever the split (hypothesis against a whole-head oracle). The real
server's behaviour is in ``tests/hostile/test_connections.py`` and ``test_heads.py``."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from acp_server.http.guard import (
    HEAD_TOO_LARGE,
    LINE_TOO_LONG,
    SWEEPS,
    HeadDeadlines,
    guarded_protocol,
)


class FakeLoop:
    """``time`` and ``call_later`` on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Any, tuple[Any, ...]]] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Any, *args: Any) -> tuple[Any, ...]:
        timer = (self.now + delay, callback, args)
        self.timers.append(timer)
        return timer   # a handle, as asyncio's

    def advance(self, seconds: float) -> None:
        """Move the clock, running the timers due, in order (new ones included)."""
        self.now += seconds
        while due := sorted((t for t in self.timers if t[0] <= self.now), key=lambda t: t[0]):
            self.timers.remove(due[0])
            due[0][1](*due[0][2])


class Head:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def _head_timeout(self) -> None:
        self.log.append(self.name)


def test_heads_are_cut_by_one_sweep_at_most_a_tick_late() -> None:
    loop, cut = FakeLoop(), []
    deadlines = HeadDeadlines(timeout_s=8.0)
    a, b, c = Head("a", cut), Head("b", cut), Head("c", cut)
    deadlines.arm(a, loop)
    loop.advance(2.0)
    deadlines.arm(b, loop)
    deadlines.arm(c, loop)
    assert len(loop.timers) == 1                  # one timer for all the heads
    deadlines.disarm(c)                           # its head completed
    loop.advance(6.0)                             # a's deadline
    assert cut == ["a"]
    loop.advance(1.9)
    assert cut == ["a"]                           # b's deadline is at 10
    loop.advance(8.0 / SWEEPS)
    assert cut == ["a", "b"] and len(deadlines) == 0
    assert loop.timers == []                      # nothing pending: the sweeps stop
    deadlines.arm(c, loop)                        # and start again with the next head
    assert len(loop.timers) == 1


def test_a_rearmed_head_gets_a_new_deadline_and_a_failing_close_stops_nothing() -> None:
    loop, cut = FakeLoop(), []
    deadlines = HeadDeadlines(timeout_s=1.0)

    class Broken(Head):
        def _head_timeout(self) -> None:
            raise OSError("transport gone")

    first, broken, last = Head("first", cut), Broken("broken", cut), Head("last", cut)
    deadlines.arm(first, loop)
    deadlines.arm(broken, loop)
    loop.advance(0.5)
    deadlines.arm(first, loop)                    # its next request's head: 1.5 now
    deadlines.arm(last, loop)
    loop.advance(0.5 + 1.0 / SWEEPS)              # broken expires, raises, is dropped
    assert cut == [] and len(deadlines) == 2
    loop.advance(0.5)
    assert cut == ["first", "last"] and len(deadlines) == 0


# -- the head caps, whatever the split ----------------------------------------------
MAX_LINE, MAX_BYTES, MAX_HEADERS = 40, 60, 4


class Parent:
    """Enough of uvicorn's protocol for ``_measure``."""


Measured = guarded_protocol(header_timeout_s=1.0, max_connections=1, max_header_bytes=MAX_BYTES,
                            max_headers=MAX_HEADERS, max_request_line=MAX_LINE, base=Parent)


def oracle(head: bytes) -> bytes | None:
    """The verdict on the whole head (request line, fields, the blank line)."""
    newline = head.find(b"\n")
    if newline > MAX_LINE:
        return LINE_TOO_LONG
    rest = head[newline + 1:]
    if len(rest) > MAX_BYTES + 2 * MAX_HEADERS or rest.count(b"\n") > MAX_HEADERS + 1:
        return HEAD_TOO_LARGE
    return None


field = st.builds(lambda n, v: n + b": " + v + b"\r\n",
                  st.binary(min_size=1, max_size=6).map(lambda b: b.replace(b"\n", b"x")),
                  st.binary(max_size=20).map(lambda b: b.replace(b"\n", b"x").replace(b"\r", b"x")))


@settings(max_examples=300, deadline=None)
@given(path=st.integers(0, 60), fields=st.lists(field, max_size=8), body=st.binary(max_size=10),
       cuts=st.lists(st.integers(0, 200), max_size=4))
def test_the_caps_measured_in_pieces_match_the_whole_head(path: int, fields: list[bytes],
                                                          body: bytes, cuts: list[int]) -> None:
    head = b"GET /" + b"p" * path + b" HTTP/1.1\r\n" + b"".join(fields) + b"\r\n"
    data = head + body
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    protocol = Measured()
    verdict = None
    for start, end in zip(bounds, bounds[1:]):
        verdict = protocol._measure(data[start:end])
        if verdict is not None or protocol._line is None and b"\r\n\r\n" in data[:end]:
            break
    assert verdict == oracle(head)
    if verdict is None:   # the exact counts, so that a cap is never off by a byte
        rest = head[head.find(b"\n") + 1:]
        assert (protocol._fields, protocol._lines) == (len(rest), rest.count(b"\n"))


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True

    def get_protocol(self) -> None:
        return None   # as if upgraded: a timed head's clock ends after the parser's call


class Received:
    """Enough of uvicorn's protocol for ``data_received``: the parser's input, no cycle."""

    cycle = None
    loop = FakeLoop()   # the clock of a head that is timed (not moved here)

    def __init__(self) -> None:
        self.parsed: list[bytes] = []
        self.transport = Transport()

    def data_received(self, data: bytes) -> None:
        self.parsed.append(data)


Guarded = guarded_protocol(header_timeout_s=1.0, max_connections=1, max_header_bytes=MAX_BYTES,
                           max_headers=MAX_HEADERS, max_request_line=MAX_LINE, base=Received)


def test_a_whole_head_within_the_caps_is_neither_timed_nor_measured() -> None:
    protocol = Guarded()
    head = b"GET / HTTP/1.1\r\nH:\r\nA:\r\nB:\r\nC:\r\n\r\n"   # 4 fields: the cap
    protocol.data_received(head)
    assert protocol.parsed == [head] and not protocol._timing
    assert len(Guarded.deadlines) == 0 and protocol._line == 0


@settings(deadline=None)   # the verdict, not its speed: a loaded machine may stall one
@given(fields=st.integers(0, 8), path=st.integers(0, 40))
def test_a_whole_head_over_a_cap_is_refused_as_when_measured(fields: int, path: int) -> None:
    head = (b"GET /" + b"p" * path + b" HTTP/1.1\r\n"
            + b"".join(b"F%d: 1\r\n" % i for i in range(fields)) + b"\r\n")
    protocol = Guarded()
    protocol.data_received(head)
    verdict = oracle(head)
    if verdict is None:
        assert protocol.parsed == [head] and protocol.transport.written == []
    else:
        assert protocol.parsed == [] and protocol.transport.written == [verdict]
        assert protocol.transport.closed
