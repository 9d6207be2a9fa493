"""granian's RSGI interface (``--granian-interface rsgi``, ``acp_server.http.rsgi``) on
the real process: the hot route's refusal, an event stream over HTTP/1.1 and HTTP/2 with
the client's disconnect seen by the server, a streamed body, and the reason it is not the
default: a reader that stops reading is never felt (granian queues without bound)."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from tests.harness import ServeProcess

pytestmark = pytest.mark.anyio
RSGI = ("--http-server", "granian", "--granian-interface", "rsgi")
HOLD = {"prompt": [{"type": "text", "text": "/sleep 600s hold"}]}


async def _sse_active(client: httpx.AsyncClient) -> int:
    status = (await client.get("/daemon/status")).json()
    return int(status["runtime"]["transport"]["restSseActive"])


async def _wait_sse_active(client: httpx.AsyncClient, count: int) -> None:
    with anyio.fail_after(20):
        while await _sse_active(client) != count:
            await anyio.sleep(0.02)


def _evictions(metrics: str) -> float:
    lines = [line for line in metrics.splitlines()
             if line.startswith("acp_server_sse_evictions_total")]
    return float(lines[0].split()[-1]) if lines else 0.0


async def test_hot_refusal_streams_and_disconnects(tmp_path: Path) -> None:
    async with ServeProcess(tmp_path, *RSGI, "--max-pending-prompts-per-session", "1"
                            ) as daemon:
        client = daemon.client
        # a body streamed in chunks (no Content-Length) reaches the app whole
        chunks = [b'{"prompt":[{"type":"text",', b'"text":"', b"z" * 100_000, b'"}]}']

        async def body():  # type: ignore[no-untyped-def]
            for chunk in chunks:
                yield chunk

        sid = (await client.post("/session", json={})).json()["sessionId"]
        streamed = await client.post(f"/session/{sid}/prompt", content=body(),
                                     headers={"Content-Type": "application/json"})
        assert streamed.status_code == 202, streamed.text
        # an event stream over HTTP/1.1 and HTTP/2; the server sees each client leave
        for http2 in (False, True):
            async with httpx.AsyncClient(base_url=daemon.base_url, http1=not http2,
                                         http2=http2, timeout=30) as reader:
                fresh = (await reader.post("/session", json={})).json()["sessionId"]
                async with reader.stream("GET", f"/session/{fresh}/events") as events:
                    assert events.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
                    posted = await reader.post(f"/session/{fresh}/prompt", json={
                        "prompt": [{"type": "text", "text": "/chunks 300 go"}]})
                    assert posted.status_code == 202
                    seen = 0
                    async for line in events.aiter_lines():
                        seen += line.count("agent_message_chunk")
                        if line.startswith("event: turn_complete"):
                            break
                    assert seen == 300
                    assert await _sse_active(client) == 1
            await _wait_sse_active(client, 0)   # http.disconnect reached the stream
        # the hot route through the adapter: 202, then the pre-encoded 503
        held = (await client.post("/session", json={})).json()["sessionId"]
        assert (await client.post(f"/session/{held}/prompt", json=HOLD)).status_code == 202
        refused = await client.post(f"/session/{held}/prompt", json=HOLD)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
        assert refused.json()["code"] == "prompt_queue_full"


async def test_a_stopped_reader_is_not_felt(tmp_path: Path) -> None:
    """Why RSGI is not the default: granian 2.8's RSGI stream transport has no
    back-pressure (an unbounded channel; ``send_bytes`` returns at once). A reader
    that stops reading is never warned nor evicted (on the ASGI interface it is:
    ``tests/hostile/test_bursts.py``, ``test_heads.py``); the frames pile up in the
    server's memory instead. When this test fails, granian bounds the channel: make
    RSGI the default then."""
    async with ServeProcess(tmp_path, *RSGI) as daemon:
        client = daemon.client
        sid = (await client.post("/session", json={})).json()["sessionId"]
        stalled = await daemon.raw()
        await stalled.send(f"GET /session/{sid}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                           .encode())
        await _wait_sse_active(client, 1)
        async with httpx.AsyncClient(base_url=daemon.base_url, timeout=60) as reader:
            seen = 0
            async with reader.stream("GET", f"/session/{sid}/events") as events:
                posted = await reader.post(f"/session/{sid}/prompt", json={"prompt": [
                    {"type": "text", "text": "/chunks 4000 " + "y" * 4000}]})
                assert posted.status_code == 202
                async for line in events.aiter_lines():
                    seen += line.count("agent_message_chunk")
                    assert "client_evicted" not in line
                    if line.startswith("event: turn_complete"):
                        break
        assert seen == 4000
        assert _evictions((await client.get("/metrics")).text) == 0
        assert await _sse_active(client) >= 1   # the stalled reader: still subscribed
        await stalled.aclose()
