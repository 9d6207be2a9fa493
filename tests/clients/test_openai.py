"""The official ``openai`` Python SDK against ``/lmsp/v1``: streamed and plain
``responses.create``, the ``responses.stream()`` helper, and a stream that stays silent
past the keep-alive interval.

The sync ``OpenAI`` client runs in a worker thread (``anyio.to_thread``), so the tests
run under both anyio backends (``AsyncOpenAI`` is asyncio-only). Every assertion is on
what the SDK reports.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

openai = pytest.importorskip("openai")

from acp_server.lmsp import LmspConfig  # noqa: E402
from tests.lmsp.server import LmspServer, running_lmsp  # noqa: E402

pytestmark = pytest.mark.anyio

STREAM_TYPES = ["response.created", "response.in_progress", "response.output_item.added",
                "response.content_part.added"]
STREAM_TAIL = ["response.output_text.done", "response.content_part.done",
               "response.output_item.done", "response.completed"]


@pytest.fixture
async def server(tmp_path: Path) -> Any:
    async with running_lmsp(tmp_path) as srv:
        yield srv


def _client(server: LmspServer, **kwargs: Any) -> Any:
    return openai.OpenAI(base_url=server.base_url + "/lmsp/v1", api_key="unused",
                         max_retries=0, timeout=20, **kwargs)


def _check_stream(events: list[Any]) -> None:
    types = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert types[:4] == STREAM_TYPES and types[-4:] == STREAM_TAIL
    assert types[4:-4] == ["response.output_text.delta"] * len(deltas) and deltas
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.status == "completed"
    assert "".join(d.delta for d in deltas) == final.output_text


async def test_create_stream(server: LmspServer) -> None:
    def run() -> list[Any]:
        with _client(server) as client:
            return list(client.responses.create(model="reference", input="/chunks 5 hello there",
                                                stream=True))

    events = await anyio.to_thread.run_sync(run)
    _check_stream(events)
    assert events[-1].response.output_text == "Echo: hello there"
    assert events[-1].response.usage.output_tokens > 0


async def test_stream_helper_final_response(server: LmspServer) -> None:
    def run() -> tuple[list[str], Any]:
        with _client(server) as client:
            with client.responses.stream(model="reference", input="stream me") as stream:
                texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
                return texts, stream.get_final_response()

    texts, final = await anyio.to_thread.run_sync(run)
    assert final.status == "completed" and final.model == "reference"
    assert "".join(texts) == final.output_text == "Echo: stream me"


async def test_plain_create(server: LmspServer) -> None:
    def run() -> Any:
        with _client(server) as client:
            return client.responses.create(model="reference", input="plain")

    response = await anyio.to_thread.run_sync(run)
    assert response.status == "completed" and response.output_text == "Echo: plain"
    assert response.id and response.usage.input_tokens > 0


class _KeepAliveWatch(httpx.BaseTransport):
    """Passes every request through and calls ``on_keepalive`` on each keep-alive
    comment from the ``count``-th on (the bytes the SDK's decoder is fed)."""

    def __init__(self, count: int, on_keepalive: Any) -> None:
        self.inner = httpx.HTTPTransport()
        self.count = count
        self.on_keepalive = on_keepalive
        self.seen = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        watch = self

        class Body(httpx.SyncByteStream):
            def __iter__(self) -> Iterator[bytes]:
                for chunk in response.stream:  # type: ignore[union-attr]
                    found = chunk.count(b": keep-alive\n")
                    watch.seen += found
                    if found and watch.seen >= watch.count:
                        watch.on_keepalive()
                    yield chunk

            def close(self) -> None:
                response.close()

        return httpx.Response(response.status_code, headers=response.headers, stream=Body(),
                              extensions=response.extensions)

    def close(self) -> None:
        self.inner.close()


async def test_stream_silent_past_keepalive(tmp_path: Path) -> None:
    """The streamed response waits, silent, behind a task holding the only running
    slot until keep-alives went through the SDK's decoder; from the second one on, each
    cancels the holder, so the response runs and completes."""
    async with running_lmsp(tmp_path, max_running_tasks=1,
                            config=LmspConfig(keepalive_s=0.05)) as srv:
        holder = await srv.create("/sleep 60s hold the slot")
        granted = threading.Event()

        async def release() -> None:
            if not granted.is_set():
                granted.set()
                await srv.client.post(f"/lmsp/v1/tasks/{holder['id']}/cancel")

        def run() -> list[Any]:
            watch = _KeepAliveWatch(2, lambda: anyio.from_thread.run(release))
            with httpx.Client(transport=watch) as http, _client(srv, http_client=http) as client:
                return list(client.responses.create(model="reference",
                                                    input="wait for me", stream=True))

        events = await anyio.to_thread.run_sync(run)
    assert granted.is_set()
    _check_stream(events)
    assert events[-1].response.output_text.endswith("wait for me")
