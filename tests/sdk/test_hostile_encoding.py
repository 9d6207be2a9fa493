"""``DaemonClient`` and ``TaskClient`` against answers a proxy compressed, and JSON nested
deeper than a decoder recurses. A compressed body is inflated step by step within the
caps (``acp_server.client.bounded``): a gzip or deflate bomb, whose one raw chunk
expands a thousandfold, never makes the client hold more than its cap and a step, for
the answer, the error-body and the event caps alike (the client used to let httpx
inflate a whole raw chunk before counting: 64 KiB became ~64 MiB at once). JSON nested
100 000 deep (msgspec raises ``RecursionError``, not a ``DecodeError``) is the SDK's
``DaemonProtocolError``, or an error body's text, never a crash.

Real loopback HTTP (``tests.sdk.rawserver``); the memory held is measured with
``tracemalloc`` (its peak), a bound not a timing.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import tracemalloc
import zlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from acp_server.client import DaemonClient, DaemonHttpError, DaemonProtocolError
from acp_server.client.tasks import LmspProblem, TaskClient
from tests.sdk.rawserver import Conn, json_answer, raw_server, routes

pytestmark = pytest.mark.anyio

CAP = 64 * 1024
MIB = 1024 * 1024
BOMB_BYTES = 64 * MIB          # what the bomb expands to
HELD = 16 * MIB                # what the client may hold at most while reading one
DEEP = b"[" * 100_000 + b"]" * 100_000
# An unknown field: still decoded (skipped) recursively. Fits an event of either kind.
DEEP_FIELD = b'{"type": "session_update", "sequence_number": 1, "extra": ' + DEEP + b"}"
DEEP_TASK = b'{"id": "task_1", "status": "queued", "extra": ' + DEEP + b"}"


@functools.cache
def bomb(coding: str, prefix: bytes = b'{"status": "') -> bytes:
    plain = prefix + b" " * BOMB_BYTES
    if coding == "gzip":
        return gzip.compress(plain, 9)
    if coding == "deflate":
        return zlib.compress(plain, 9)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)   # raw deflate
    return compressor.compress(plain) + compressor.flush()


def encoded(body: bytes, coding: str, *, status: int = 200,
            content_type: str = "application/json") -> Callable[[Conn], Awaitable[None]]:
    http_coding = "deflate" if coding == "raw-deflate" else coding
    return json_answer(body, status, {"Content-Encoding": http_coding}, content_type)


@contextlib.contextmanager
def held_at_most(limit: int) -> Iterator[None]:
    """Fails when the Python memory allocated at once inside the block passed ``limit``."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < limit, f"the client held {peak} bytes at once (at most {limit} expected)"


@pytest.mark.parametrize("coding", ["gzip", "deflate", "raw-deflate"])
async def test_a_compressed_bomb_is_inflated_within_the_answer_cap(coding: str) -> None:
    body = bomb(coding)
    async with raw_server(encoded(body, coding)) as server, \
            DaemonClient(server.url, max_answer_bytes=CAP) as client:
        with held_at_most(HELD), pytest.raises(DaemonProtocolError,
                                               match="GET /health answered more than"):
            await client.health()


async def test_a_compressed_bomb_as_an_error_body_is_cut_at_the_error_cap() -> None:
    body = bomb("gzip", b'{"error": "')
    async with raw_server(encoded(body, "gzip", status=500)) as server, \
            DaemonClient(server.url) as client:
        with held_at_most(HELD), pytest.raises(DaemonHttpError) as caught:
            await client.health()
    assert caught.value.status == 500


async def test_a_compressed_event_stream_bomb_is_a_line_over_the_cap() -> None:
    body = bomb("gzip", b"data: ")
    events = encoded(body, "gzip", content_type="text/event-stream")
    async with raw_server(routes({"GET /session/s-1/events": events})) as server, \
            DaemonClient(server.url, max_event_bytes=CAP) as client:
        with held_at_most(HELD), pytest.raises(DaemonProtocolError, match="line over"):
            stream = client.subscribe_events("s-1", last_event_id=0, reconnect=False)
            async with contextlib.aclosing(stream) as frames:
                async for _ in frames:
                    pass


async def test_the_task_client_inflates_within_its_cap_too() -> None:
    async with raw_server(encoded(bomb("gzip"), "gzip")) as server, \
            TaskClient(server.url, max_answer_bytes=CAP) as tasks:
        with held_at_most(HELD), pytest.raises(DaemonProtocolError, match="answered more than"):
            await tasks.get("task_1")


@pytest.mark.parametrize("coding", ["gzip", "deflate", "raw-deflate"])
async def test_a_small_compressed_answer_is_read(coding: str) -> None:
    plain = b'{"status": "ok", "pad": "' + b"z" * 300_000 + b'"}'
    body = (gzip.compress(plain) if coding == "gzip" else zlib.compress(plain)
            if coding == "deflate" else bomb_free_raw(plain))
    async with raw_server(encoded(body, coding)) as server, DaemonClient(server.url) as client:
        health = await client.health()
    assert health["status"] == "ok" and len(health["pad"]) == 300_000


def bomb_free_raw(plain: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(plain) + compressor.flush()


async def test_the_client_asks_for_no_compression() -> None:
    """The daemon compresses nothing; a compressed event stream would be held back by the
    proxy's compressor, so the client asks for none (and still reads gzip if sent)."""
    async with raw_server(json_answer(b'{"status": "ok"}')) as server, \
            DaemonClient(server.url) as client, TaskClient(server.url) as tasks:
        await client.health()
        await tasks.capabilities()
    assert [r.headers.get("accept-encoding") for r in server.requests] == ["identity"] * 2


@pytest.mark.parametrize(("coding", "says"), [
    ("br", "encoding the client does not read: 'br'"),
    ("gzip, gzip", "encoding the client does not read: 'gzip, gzip'"),
])
async def test_an_encoding_the_client_does_not_read_is_a_protocol_error(coding: str,
                                                                         says: str) -> None:
    async with raw_server(json_answer(b"\x00garbage", 200, {"Content-Encoding": coding})) \
            as server, DaemonClient(server.url) as client:
        with pytest.raises(DaemonProtocolError, match=says):
            await client.health()


async def test_a_corrupt_gzip_body_is_a_protocol_error() -> None:
    body = gzip.compress(b'{"status": "ok"}')[:10] + b"\x07" * 40   # a reserved block type
    async with raw_server(encoded(body, "gzip")) as server, DaemonClient(server.url) as client:
        with pytest.raises(DaemonProtocolError, match="could not be inflated"):
            await client.health()


# -- JSON nested deeper than a decoder recurses ---------------------------------------------
async def _health(client: DaemonClient, _tasks: TaskClient) -> Any:
    return await client.health()


async def _capabilities(client: DaemonClient, _tasks: TaskClient) -> Any:
    return await client.capabilities()


async def _task(_client: DaemonClient, tasks: TaskClient) -> Any:
    return await tasks.get("task_1")


@pytest.mark.parametrize(("call", "body"), [(_health, DEEP), (_capabilities, DEEP_FIELD),
                                            (_task, DEEP_TASK)])
async def test_deeply_nested_json_is_a_protocol_error(call: Any, body: bytes) -> None:
    async with raw_server(json_answer(body)) as server, \
            DaemonClient(server.url) as client, TaskClient(server.url) as tasks:
        with pytest.raises(DaemonProtocolError, match="nest"):
            await call(client, tasks)


async def test_a_deeply_nested_event_is_a_protocol_error() -> None:
    async def events(conn: Conn) -> None:
        await conn.head()
        await conn.send(b"data: " + DEEP_FIELD + b"\n\n")
        await conn.until_gone()

    async with raw_server(routes({"GET /session/s-1/events": events,
                                  "GET /lmsp/v1/tasks/task_1/events": events})) as server, \
            DaemonClient(server.url) as client, TaskClient(server.url) as tasks:
        with pytest.raises(DaemonProtocolError, match="nest"):
            stream = client.subscribe_events("s-1", last_event_id=0, reconnect=False)
            async with contextlib.aclosing(stream) as frames:
                async for _ in frames:
                    pass
        with pytest.raises(DaemonProtocolError, match="nest"):
            async with contextlib.aclosing(tasks.events("task_1")) as frames:
                async for _ in frames:
                    pass


async def test_a_deeply_nested_error_body_is_kept_as_text() -> None:
    async with raw_server(json_answer(DEEP[:30_000] + DEEP[-30_000:], 500)) as server, \
            DaemonClient(server.url) as client, TaskClient(server.url) as tasks:
        with pytest.raises(DaemonHttpError) as caught:
            await client.health()
        with pytest.raises(LmspProblem) as problem:
            await tasks.get("task_1")
    assert caught.value.status == 500 and isinstance(caught.value.body, str)
    assert problem.value.status == 500 and problem.value.code == "http_500"
