"""``DaemonClient`` and ``TaskClient`` against daemons (or proxies in front of them) that
send what no daemon should: an event-stream line that never ends, an event that never
closes, an endless JSON answer, a gzip body that expands hugely, an endless error body,
an HTML page where events were asked for. Each ends in the SDK's own error, the client
holding no more than its caps (``acp_server.client.bounded``); it used to read on for
as long as the server sent (httpx_sse's lines and ``response.content`` are unbounded).
Real loopback HTTP (``tests.harness.serving``)."""

from __future__ import annotations

import contextlib
import gzip
from collections.abc import AsyncIterator, Iterator

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from acp_server.client import DaemonClient, DaemonHttpError, DaemonProtocolError
from acp_server.client.bounded import event_data, events
from acp_server.client.tasks import TaskClient
from tests.harness import serving

pytestmark = pytest.mark.anyio

CAP = 64 * 1024
CHUNK = b"x" * 8192
# What an endless body sends at most: 4x the cap, plus a MiB for what the loopback
# socket's buffers may hold that the client never read (about 1.6x the cap is sent today).
BUDGET = 4 * CAP + 1024 * 1024


class Sent:
    """How many bytes an endless body sent before its client let go. It is endless only
    up to ``BUDGET``: past that the server stops, so a client whose cap broke fails the
    test (``within_budget``) instead of reading until CI's timeout."""

    def __init__(self) -> None:
        self.bytes = 0
        self.over_budget = False
        self.ended = anyio.Event()

    def endless(self, head: bytes, chunk: bytes = CHUNK) -> AsyncIterator[bytes]:
        async def body() -> AsyncIterator[bytes]:
            try:
                yield head
                self.bytes += len(head)
                while self.bytes < BUDGET:
                    yield chunk
                    self.bytes += len(chunk)
                    await anyio.sleep(0)
                self.over_budget = True
            finally:
                self.ended.set()
        return body()

    @contextlib.contextmanager
    def within_budget(self) -> Iterator[None]:
        """Fails the block, whatever it raised, when the server sent its whole budget."""
        try:
            yield
        finally:
            assert not self.over_budget, (
                f"the server sent its whole budget ({BUDGET} bytes) and stopped: the "
                f"client did not stop reading at its cap ({CAP} bytes)")


def app_for(events: Response | None = None, health: Response | None = None,
            task_events: Response | None = None) -> Starlette:
    async def events_route(_request: Request) -> Response:
        assert events is not None
        return events

    async def health_route(_request: Request) -> Response:
        assert health is not None
        return health

    async def task_events_route(_request: Request) -> Response:
        assert task_events is not None
        return task_events

    return Starlette(routes=[Route("/session/{sid}/events", events_route),
                             Route("/health", health_route),
                             Route("/lmsp/v1/tasks/{tid}/events", task_events_route)])


async def _read_events(client: DaemonClient) -> list[object]:
    seen = []
    stream = client.subscribe_events("s-1", last_event_id=0, reconnect=False)
    async with contextlib.aclosing(stream) as events:
        async for event in events:
            seen.append(event)
    return seen


@pytest.mark.parametrize("head", [b"data: ", b": a comment that never ends ",
                                  b"id: 1\nevent: session_update\ndata: {\"v\": 1"])
async def test_an_endless_event_stream_line_is_a_protocol_error(head: bytes) -> None:
    sent = Sent()
    app = app_for(events=StreamingResponse(sent.endless(head), media_type="text/event-stream"))
    async with serving(app) as url, DaemonClient(url, max_event_bytes=CAP) as client:
        with sent.within_budget(), anyio.fail_after(30), \
                pytest.raises(DaemonProtocolError, match="line over 64 KiB|line over 65536"):
            await _read_events(client)
        with anyio.fail_after(30):
            await sent.ended.wait()   # the client let go of the connection


async def test_an_event_that_never_closes_is_a_protocol_error() -> None:
    sent = Sent()
    app = app_for(events=StreamingResponse(sent.endless(b"", b"data: " + CHUNK + b"\n"),
                                           media_type="text/event-stream"))
    async with serving(app) as url, DaemonClient(url, max_event_bytes=CAP) as client:
        with sent.within_budget(), anyio.fail_after(30), \
                pytest.raises(DaemonProtocolError, match="an event over"):
            await _read_events(client)


async def test_an_html_page_is_not_an_event_stream() -> None:
    app = app_for(events=Response(b"<html>502 Bad Gateway</html>", media_type="text/html"))
    async with serving(app) as url, DaemonClient(url) as client:
        with pytest.raises(DaemonProtocolError, match="Not an event stream.*text/html"):
            await _read_events(client)


async def test_an_endless_error_body_is_read_only_as_far_as_kept() -> None:
    sent = Sent()
    app = app_for(events=StreamingResponse(sent.endless(b'{"error": "'), status_code=500,
                                           media_type="application/json"))
    async with serving(app) as url, DaemonClient(url) as client:
        with sent.within_budget(), anyio.fail_after(30), \
                pytest.raises(DaemonHttpError) as caught:
            await _read_events(client)
        assert caught.value.status == 500
        with anyio.fail_after(30):
            await sent.ended.wait()


async def test_an_endless_json_answer_is_a_protocol_error() -> None:
    sent = Sent()
    app = app_for(health=StreamingResponse(sent.endless(b'{"status": "'),
                                           media_type="application/json"))
    async with serving(app) as url, DaemonClient(url, max_answer_bytes=CAP) as client:
        with sent.within_budget(), anyio.fail_after(30), \
                pytest.raises(DaemonProtocolError, match="GET /health answered more than"):
            await client.health()
        with anyio.fail_after(30):
            await sent.ended.wait()


async def test_a_gzip_bomb_is_counted_as_it_expands() -> None:
    bomb = gzip.compress(b'{"status": "' + b" " * (16 * CAP) + b'"}')
    assert len(bomb) < CAP // 4
    app = app_for(health=Response(bomb, media_type="application/json",
                                  headers={"Content-Encoding": "gzip"}))
    async with serving(app) as url, DaemonClient(url, max_answer_bytes=CAP) as client:
        with pytest.raises(DaemonProtocolError, match="answered more than"):
            await client.health()


async def test_answers_within_the_caps_are_read_as_before() -> None:
    small = gzip.compress(b'{"status": "ok"}')
    app = app_for(health=Response(small, media_type="application/json",
                                  headers={"Content-Encoding": "gzip"}))
    async with serving(app) as url, DaemonClient(url, max_answer_bytes=CAP) as client:
        assert (await client.health())["status"] == "ok"


async def test_the_task_client_is_bounded_too() -> None:
    sent = Sent()
    app = app_for(task_events=StreamingResponse(sent.endless(b"data: "),
                                                media_type="text/event-stream"))
    async with serving(app) as url, TaskClient(url, max_event_bytes=CAP) as client:
        with sent.within_budget(), anyio.fail_after(30), \
                pytest.raises(DaemonProtocolError, match="line over"):
            async with contextlib.aclosing(client.events("task_1")) as events:
                async for _ in events:
                    pass


STREAM = (b"retry: 3000\r\n\r\n: hi\n\nid: 1\nevent: a\ndata: one\n\n"
          b"data: two\r\ndata:three\r\n\r\ndata\n\ndata: four\r\rdata: five\n\n")


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, len(STREAM)])
async def test_event_data_is_the_same_whatever_the_chunking(size: int) -> None:
    """Lines end in CRLF, LF or CR, split anywhere between chunks (a CR at a chunk's end
    and its LF at the next one's start are one line end)."""
    chunks = [STREAM[i:i + size] for i in range(0, len(STREAM), size)]
    response = httpx.Response(200, content=_Chunks(chunks))
    found = [data async for data in event_data(response, max_bytes=CAP)]
    assert found == ["one", "two\nthree", "", "four", "five"]
    response = httpx.Response(200, content=_Chunks(chunks))
    whole = [event async for event in events(response, max_bytes=CAP)]
    assert whole == [("a", "1", "one"), ("message", None, "two\nthree"), ("message", None, ""),
                     ("message", None, "four"), ("message", None, "five")]


async def test_one_bound_counts_an_events_data_lines_together() -> None:
    """The runner and the SDK read through the same ``events``: many short data lines of
    one event are one event over the cap."""
    lines = b"data: " + b"y" * 1000 + b"\n"
    body = b"event: big\nid: 7\n" + lines * (CAP // len(lines) + 1) + b"\n"
    response = httpx.Response(200, content=_Chunks([body]))
    with pytest.raises(DaemonProtocolError, match="an event over 65536 bytes"):
        async for _ in events(response, max_bytes=CAP):
            pass


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk

