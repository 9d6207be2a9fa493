"""``DaemonClient`` against tiny Starlette daemons, for the answers the real server
never gives: a legacy blocking 200, an event stream that just ends, bodies that do
not parse, streams that keep dropping."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from acp_server.client import (DaemonClient, DaemonProtocolError, DaemonStreamEndedError,
                               DaemonStreamError)
from tests.harness import serving

pytestmark = pytest.mark.anyio

ENVELOPE = {"promptId": "p-1", "lastEventId": 4, "eventEpoch": "epoch-202"}


Headers = list[dict[str, str]]


def fake(prompt: Callable[[Request], Response],
         events: Callable[[Request, int], Response] | None = None) -> tuple[Starlette, Headers]:
    """An app answering ``/prompt`` with ``prompt`` and ``/events`` with ``events``
    (given the request and how many event requests came before); the headers of each
    events request are recorded."""
    seen: list[dict[str, str]] = []

    async def prompt_route(request: Request) -> Response:
        return prompt(request)

    async def events_route(request: Request) -> Response:
        seen.append(dict(request.headers))
        assert events is not None
        return events(request, len(seen) - 1)

    app = Starlette(routes=[Route("/session/{sid}/prompt", prompt_route, methods=["POST"]),
                            Route("/session/{sid}/events", events_route, methods=["GET"])])
    return app, seen


def sse(*frames: bytes) -> StreamingResponse:
    async def body():  # type: ignore[no-untyped-def]
        yield b"retry: 3000\n\n"
        for frame in frames:
            yield frame

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"X-Qwen-Event-Epoch": "epoch-202"})


def frame(event_id: int, kind: str, data: dict[str, object]) -> bytes:
    import json

    payload = json.dumps({"id": event_id, "v": 1, "type": kind, "data": data})
    return f"id: {event_id}\nevent: {kind}\ndata: {payload}\n\n".encode()


async def test_blocking_200_releases() -> None:
    app, _ = fake(lambda _r: JSONResponse({"stopReason": "end_turn"}))
    async with serving(app) as url, DaemonClient(url, max_pending_prompts_per_session=1) as client:
        for _ in range(3):  # the slot comes back each time
            result = await client.prompt("s-1", "hi")
            assert result.stop_reason == "end_turn"
            assert client.pending_prompt_count("s-1") == 0


async def test_stream_end_releases() -> None:
    def events(_request: Request, n: int) -> Response:
        if n == 0:
            return sse(frame(5, "session_update", {"sessionId": "s-1"}))
        return JSONResponse({"error": "gone", "code": "session_not_found"}, status_code=404)

    app, seen = fake(lambda _r: JSONResponse(ENVELOPE, status_code=202), events)
    async with serving(app) as url, DaemonClient(url) as client:
        with pytest.raises(DaemonStreamEndedError):
            await client.prompt("s-1", "hi")
        assert client.pending_prompt_count("s-1") == 0
    # the turn subscription started from the 202's cursor and resumed from the last id
    assert (seen[0]["last-event-id"], seen[0]["x-qwen-event-epoch"]) == ("4", "epoch-202")
    assert (seen[1]["last-event-id"], seen[1]["x-qwen-event-epoch"]) == ("5", "epoch-202")


async def test_epoch_header_omitted_without_epoch() -> None:
    def events(_request: Request, _n: int) -> Response:
        return sse(frame(5, "turn_complete", {"promptId": "p-1", "stopReason": "end_turn"}))

    app, seen = fake(lambda _r: JSONResponse({"promptId": "p-1", "lastEventId": 4},
                                             status_code=202), events)
    async with serving(app) as url, DaemonClient(url) as client:
        assert (await client.prompt("s-1", "hi")).stop_reason == "end_turn"
    assert seen[0]["last-event-id"] == "4" and "x-qwen-event-epoch" not in seen[0]


@pytest.mark.parametrize(("status", "body"), [
    (202, b"not json"), (202, b'{"lastEventId": 1}'), (200, b'{"stopReason": 5}')])
async def test_parse_failure_releases(status: int, body: bytes) -> None:
    app, _ = fake(lambda _r: Response(body, status_code=status, media_type="application/json"))
    async with serving(app) as url, DaemonClient(url) as client:
        with pytest.raises(DaemonProtocolError):
            await client.prompt("s-1", "hi")
        assert client.pending_prompt_count("s-1") == 0


async def test_malformed_event_releases() -> None:
    def events(_request: Request, _n: int) -> Response:
        return sse(b"id: 5\nevent: session_update\ndata: {broken\n\n")

    app, _ = fake(lambda _r: JSONResponse(ENVELOPE, status_code=202), events)
    async with serving(app) as url, DaemonClient(url) as client:
        with pytest.raises(DaemonProtocolError):
            await client.prompt("s-1", "hi")
        assert client.pending_prompt_count("s-1") == 0


async def test_reconnects_are_bounded() -> None:
    """A stream that keeps ending without events is given up after the budget."""
    app, seen = fake(lambda _r: Response(status_code=500),
                     lambda _r, _n: sse(b": heartbeat\n\n"))
    async with serving(app) as url, DaemonClient(url) as client:
        stream = client.subscribe_events("s-1", last_event_id=0, max_reconnects=2)
        with pytest.raises(DaemonStreamError):
            async with contextlib.aclosing(stream) as events:
                async for _ in events:
                    pass
    assert len(seen) == 3
    assert all(h["last-event-id"] == "0" for h in seen)


async def test_no_reconnect_ends_with_the_stream() -> None:
    app, seen = fake(lambda _r: Response(status_code=500),
                     lambda _r, _n: sse(frame(1, "session_update", {})))
    async with serving(app) as url, DaemonClient(url) as client, \
            contextlib.aclosing(client.subscribe_events("s-1", reconnect=False)) as events:
        got = [event async for event in events]
    assert [e.id for e in got] == [1] and len(seen) == 1
