"""granian's RSGI interface (``--granian-interface rsgi``, ``acp_server.http.rsgi``) on
the real process: the hot route's refusal, an event stream over HTTP/1.1 and HTTP/2 with
the client's disconnect seen by the server, a streamed body, a dropped Host refused, and
the reason it is not the default: a reader that stops reading is never felt (granian
queues without bound). Then the adapter's edges on granian's embedded server with a small
ASGI app: an app that raises (500; a broken-off stream ends cleanly), a request body that
breaks off (``http.disconnect``), ``receive`` after the response, the scope's
``http_version`` and a dropped Host."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from acp_server.http.policy import split_host
from tests.harness import ServeProcess, read_chunk_burst

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
        # a Host granian drops (not visible ASCII) is refused, not let past the check
        raw = await daemon.raw()
        await raw.send(b"GET /daemon/status HTTP/1.1\r\nHost: h\xc3\xa9.example\r\n"
                       b"Connection: close\r\n\r\n")
        answer = b""
        with anyio.fail_after(20):
            while not answer.startswith(b"HTTP/1.1 ") or b"\r\n" not in answer:
                answer += await raw.receive()
        await raw.aclose()
        assert answer.startswith(b"HTTP/1.1 421 "), answer[:200]


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
        seen, evicted = await read_chunk_burst(daemon.base_url, sid, 4000)
        assert not evicted
        assert seen == 4000
        assert _evictions((await client.get("/metrics")).text) == 0
        assert await _sse_active(client) >= 1   # the stalled reader: still subscribed
        await stalled.aclose()
    log = daemon.stderr_text()   # its stream's next write, at the latest the drain's,
    assert "Traceback" not in log, log[-3000:]   # finds it gone: no error, no traceback


# -- the adapter's edges, on granian's embedded server with a small ASGI app -------------
# granian embeds itself in an asyncio loop: the server runs in a thread of its own, the
# tests talk to it over loopback under either anyio backend.

EVENTS: queue.Queue[tuple[str, Any]] = queue.Queue()


async def _edge_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    start = {"type": "http.response.start", "status": 200,
             "headers": [(b"content-type", b"text/plain")]}
    if path == "/raise-after-start":
        await send(start)
        raise RuntimeError("the app failed after its start")
    if path == "/raise-mid-stream":
        await send(start)
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise RuntimeError("the app failed in the middle of its body")
    received, last = 0, {"type": "http.request", "more_body": True}
    while last["type"] == "http.request" and last.get("more_body"):
        last = await receive()
        received += len(last.get("body", b""))
    EVENTS.put((path, (last["type"], received, scope["http_version"],
                       dict(scope["headers"]).get(b"host"))))
    await send(start)
    await send({"type": "http.response.body", "body": b"ok"})
    if path == "/after":
        EVENTS.put((path, (await receive())["type"]))


@pytest.fixture(scope="module")
def edge_server() -> Iterator[str]:
    from acp_server.http.options import HttpOptions
    from acp_server.http.servers import GranianServer, Limits

    limits = Limits(header_timeout_s=10, max_connections=100, max_header_bytes=16384,
                    max_headers=100, max_request_line=8192, ws_max_bytes=1 << 20)
    server = GranianServer(_edge_app, HttpOptions(granian_interface="rsgi"),
                           host="127.0.0.1", port=0, limits=limits)
    listening: queue.Queue[str] = queue.Queue()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete,
                              args=(server.serve(listening.put),), daemon=True)
    thread.start()
    url = listening.get(timeout=30)
    yield url
    loop.call_soon_threadsafe(server.stop, True)
    thread.join(timeout=30)
    loop.close()


async def _event(path: str) -> Any:
    with anyio.fail_after(20):
        while True:
            try:
                seen, value = EVENTS.get_nowait()
            except queue.Empty:
                await anyio.sleep(0.02)
                continue
            if seen == path:
                return value


async def _raw(url: str, request: bytes) -> anyio.abc.SocketStream:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await anyio.connect_tcp(host, int(port))
    await stream.send(request)
    return stream


async def _answer(url: str, request: bytes) -> bytes:
    """The whole answer to ``request`` on a connection the server closes after it."""
    stream = await _raw(url, request)
    answer = b""
    with anyio.fail_after(20):
        try:
            while True:
                answer += await stream.receive()
        except anyio.EndOfStream:
            pass
    await stream.aclose()
    return answer


async def test_an_app_that_fails_after_its_start_answers_500(edge_server: str) -> None:
    async with httpx.AsyncClient(base_url=edge_server, timeout=30) as client:
        failed = await client.get("/raise-after-start")
        assert failed.status_code == 500 and failed.text == "Internal Server Error"


async def test_a_stream_the_app_breaks_off_still_ends_cleanly(edge_server: str) -> None:
    """granian 2.8's RSGI stream transport cannot abort a body (its channel carries
    data only; dropping it ends the chunked body). When this test fails, granian can:
    make ``HttpExchange.close`` abort, as granian's ASGI side does."""
    async with httpx.AsyncClient(base_url=edge_server, timeout=30) as client:
        broken = await client.get("/raise-mid-stream")
        assert broken.status_code == 200 and broken.content == b"part"


@pytest.mark.parametrize("request_head", [
    b"POST /broken-length HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n"
    + b"a" * 70000,
    b"POST /broken-chunks HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"8000\r\n" + b"b" * 0x8000 + b"\r\n8000\r\n" + b"b" * 100,
], ids=["content-length", "chunked"])
async def test_a_broken_request_body_is_a_disconnect(edge_server: str,
                                                     request_head: bytes) -> None:
    path = request_head.split(b" ")[1].decode()
    stream = await _raw(edge_server, request_head)
    await stream.aclose()
    kind, received, _, _ = await _event(path)
    assert kind == "http.disconnect" and received > 0
    # whole bodies still arrive whole, streamed over HTTP/1.1 and HTTP/2
    for http2 in (False, True):
        async with httpx.AsyncClient(base_url=edge_server, http1=not http2, http2=http2,
                                     timeout=30) as client:
            async def body():  # type: ignore[no-untyped-def]
                yield b"c" * 100_000
                yield b"d" * 10

            assert (await client.post("/whole", content=body())).status_code == 200
            assert await _event("/whole") == ("http.request", 100_010,
                                              "2" if http2 else "1.1", b"127.0.0.1:"
                                              + edge_server.rsplit(":", 1)[1].encode())
            sized = await client.post("/whole", content=b"e" * 100_000)
            assert sized.status_code == 200
            assert (await _event("/whole"))[:2] == ("http.request", 100_000)


async def test_receive_after_the_response_is_a_disconnect_at_once(edge_server: str) -> None:
    stream = await _raw(edge_server, b"POST /after HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                     b"Content-Length: 1\r\n\r\nx")
    try:
        assert (await _event("/after"))[0] == "http.request"
        assert await _event("/after") == "http.disconnect"   # the connection still open
    finally:
        await stream.aclose()


async def test_the_scope_of_an_http_1_0_request_and_of_a_dropped_host(
        edge_server: str) -> None:
    assert await _answer(edge_server, b"GET /old HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
    assert (await _event("/old"))[2] == "1.0"
    # granian drops a header value that is not visible ASCII; a dropped Host stays in the
    # scope as a value no Host check accepts (the door answers 421, test above)
    assert await _answer(edge_server, b"GET /dropped HTTP/1.1\r\nHost: h\xc3\xa9.example\r\n"
                                      b"Connection: close\r\n\r\n")
    host = (await _event("/dropped"))[3]
    assert host is not None and split_host(host.decode("latin-1")) is None
