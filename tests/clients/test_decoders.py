"""The bytes each door really writes (REST events, an ``/acp`` session stream, LMSP
task events), keep-alives interleaved, read by the SSE decoders of the OpenAI SDK and
of httpx-sse: every event they hand on carries JSON data, the first one ``retry``."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import httpx
import pytest
from httpx_sse._decoders import SSEDecoder as HttpxSseDecoder

from acp_server.lmsp import LmspConfig
from tests.acp_http.server import request, running_acp_server, text
from tests.lmsp.server import running_lmsp
from tests.store.faults import faulty

openai_streaming = pytest.importorskip("openai._streaming")

pytestmark = pytest.mark.anyio
PROMPT = "/sleep 200ms /chunks 3 decode me"


async def _raw(client: httpx.AsyncClient, url: str, done: Callable[[bytes], bool],
               headers: dict[str, str] | None = None, *, keepalive: bytes,
               start: Callable[[], Awaitable[object]]) -> bytes:
    """The stream's bytes until ``done``; ``start`` (what makes the stream speak) runs
    once a keep-alive arrived, so the stream was silent at least once whatever the
    machine's load (a 200 ms turn begun first could be over before the stream opened:
    all replayed at once, no keep-alive)."""
    raw = b""
    started = False
    with anyio.fail_after(10):
        async with client.stream("GET", url, headers=headers) as response:
            assert response.status_code == 200
            async for chunk in response.aiter_raw():
                raw += chunk
                if not started and keepalive in raw:
                    started = True
                    await start()
                if done(raw):
                    return raw
    return raw


def _check(raw: bytes, keepalive: bytes) -> list[object]:
    assert raw.count(keepalive) >= 1          # the stream was silent at least once
    decoder = openai_streaming.SSEDecoder()
    openai_events = list(decoder.iter_bytes(iter([raw])))
    httpx_decoder = HttpxSseDecoder()
    httpx_events = [e for e in map(httpx_decoder.decode, raw.decode().splitlines()) if e]
    for events in (openai_events, httpx_events):
        assert events and events[0].retry == 3000
        assert all(e.data for e in events)
    assert [e.data for e in openai_events] == [e.data for e in httpx_events]
    return [json.loads(e.data) for e in openai_events]


async def test_rest_and_acp_streams(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path, heartbeat_s=0.05) as srv:
        sid = (await srv.client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]

        async def prompt() -> None:
            assert (await srv.client.post(f"/session/{sid}/prompt", json={
                "prompt": text(PROMPT)})).status_code == 202

        rest = await _raw(srv.client, f"/session/{sid}/events",
                          lambda raw: b"event: turn_complete" in raw, {"Last-Event-ID": "0"},
                          keepalive=b": heartbeat\n", start=prompt)
        events = _check(rest, b": heartbeat\n")
        assert [e["type"] for e in events][-1] == "turn_complete"   # type: ignore[index]

        conn_id, _ = await srv.initialize()
        await srv.post(conn_id, request(1, "session/load", {"sessionId": sid, "cwd": srv.workspace,
                                                            "mcpServers": []}))

        async def acp_prompt() -> None:
            await srv.post(conn_id, request(2, "session/prompt", {"sessionId": sid,
                                                                  "prompt": text(PROMPT)}), sid)

        acp = await _raw(srv.client, "/acp", lambda raw: b'"id":2,"result"' in raw,
                         {"Accept": "text/event-stream", "Acp-Connection-Id": conn_id,
                          "Acp-Session-Id": sid}, keepalive=b": hb\n", start=acp_prompt)
        messages = _check(acp, b": hb\n")
        assert messages[-1] == {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}}


async def test_lmsp_stream(tmp_path: Path) -> None:
    # the task's final commit waits at a gate opened once the stream was silent
    store = faulty(tmp_path)
    async with running_lmsp(tmp_path, store=store, config=LmspConfig(keepalive_s=0.05)) as srv:
        gate = store.faults.hold_at("succeeded")
        task = await srv.create(PROMPT)

        async def release() -> None:
            gate.set()

        raw = await _raw(srv.client, f"/lmsp/v1/tasks/{task['id']}/events",
                         lambda raw: b"event: response.completed" in raw,
                         keepalive=b": keep-alive\n", start=release)
        events = _check(raw, b": keep-alive\n")
        assert [e["sequence_number"] for e in events] == list(range(len(events)))  # type: ignore[index]
