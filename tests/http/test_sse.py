"""The one SSE framing (``acp_server.http.sse``) read by the decoders clients use: the
OpenAI SDK's and httpx-sse's. Both dispatch on every blank line once a field was
set (and keep the last event id), so a data-less frame would reach their callers
as an empty event; ours never makes one."""

from __future__ import annotations

import json

import pytest
from httpx_sse._decoders import SSEDecoder as HttpxSseDecoder

from acp_server.http.sse import RETRY_LINE, frame, keepalive

openai_streaming = pytest.importorskip("openai._streaming")

# What a stream of any door can look like: the retry line, keep-alives before and
# between frames, frames with and without id (LMSP ids start at 0) and event.
STREAM = b"".join([
    RETRY_LINE, keepalive(b"heartbeat"),
    frame(b'{"n":1}', event="session_update", event_id=1),
    keepalive(b"hb"), keepalive(b"hb"),
    frame(b'{"n":2}'),                       # a synthetic frame or a JSON-RPC reply
    frame(b'{"n":3}', event="response.created", event_id=0),
    keepalive(b"keep-alive"),
])


def _lines(data: bytes) -> list[str]:
    return data.decode().splitlines()


def _openai(data: bytes) -> list[tuple[str | None, str | None, str, int | None]]:
    decoder = openai_streaming.SSEDecoder()
    events = decoder.iter_bytes(iter([data[i:i + 7] for i in range(0, len(data), 7)]))
    return [(e.event, e.id, e.data, e.retry) for e in events]


def _httpx_sse(data: bytes) -> list[tuple[str, str, str, int | None]]:
    decoder = HttpxSseDecoder()
    out = []
    for line in _lines(data):
        sse = decoder.decode(line)
        if sse is not None:
            out.append((sse.event, sse.id, sse.data, sse.retry))
    return out


def test_openai_decoder_sees_only_data_events() -> None:
    events = _openai(STREAM)
    assert [json.loads(data)["n"] for _e, _i, data, _r in events] == [1, 2, 3]
    assert events[0] == ("session_update", "1", '{"n":1}', 3000)   # retry joins frame 1
    assert events[2][:2] == ("response.created", "0")


def test_httpx_sse_decoder_sees_only_data_events() -> None:
    events = _httpx_sse(STREAM)
    assert [json.loads(data)["n"] for _e, _i, data, _r in events] == [1, 2, 3]
    assert events[0] == ("session_update", "1", '{"n":1}', 3000)


def test_the_old_framing_gave_these_decoders_empty_events() -> None:
    """``retry: 3000\\n\\n`` and ``: keep-alive\\n\\n`` after an id: what broke the
    OpenAI SDK (``json.loads("")``)."""
    old = b"retry: 3000\n\n" + frame(b"{}", event_id=1) + b": keep-alive\n\n"
    assert [data for _e, _i, data, _r in _openai(old)] == ["", "{}", ""]
    assert [data for _e, _i, data, _r in _httpx_sse(old)] == ["", "{}", ""]


def test_frame_bytes_are_exact_with_and_without_id_and_event():
    assert frame(b'{"a":1}', event="turn_complete", event_id=7) == \
        b'id: 7\nevent: turn_complete\ndata: {"a":1}\n\n'
    assert frame(b"{}", event="response.created", event_id=0) == \
        b"id: 0\nevent: response.created\ndata: {}\n\n"
    assert frame(b"{}", event_id=3) == b"id: 3\ndata: {}\n\n"
    assert frame(b"{}", event="x") == b"event: x\ndata: {}\n\n"
    assert frame(b"{}") == b"data: {}\n\n"
