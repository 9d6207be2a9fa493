"""review7 #6: a hostile server cannot make the adapter hold more than ``max_bytes`` of
one message: a WebSocket message in endless fragments, an SSE event of endless
``data:`` lines, an endless POST answer. Real sockets, the link on its own."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.abc
import pytest
import wsproto
import wsproto.events

from acp_server.connect.link import INCOMING_TOO_BIG, LinkLost, Target, open_link
from tests.connect.endpoint import lifespan, read_body
from tests.harness.local import serving

pytestmark = pytest.mark.anyio

CAP = 64 * 1024
PIECE = b"x" * 1024
INIT = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                   "params": {"protocolVersion": 1}}).encode()
ANSWER = {"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 1}}


def hostile_http(mode: str) -> Any:
    """``sse``: the connection stream sends one event of endless data lines; ``post``:
    a POST after initialize is answered with an endless body."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await lifespan(scope, receive, send):
            return
        if scope["method"] == "POST":
            body = await read_body(receive)
            if json.loads(body).get("method") == "initialize":
                await send({"type": "http.response.start", "status": 200, "headers": [
                    (b"content-type", b"application/json"), (b"acp-connection-id", b"c1")]})
                await send({"type": "http.response.body", "body": json.dumps(ANSWER).encode()})
                return
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "more_body": True,
                        "body": b'{"jsonrpc": "2.0", "id": 1, "error": {"message": "'})
            for _ in range(4 * CAP // len(PIECE)):
                await send({"type": "http.response.body", "body": PIECE, "more_body": True})
            await send({"type": "http.response.body", "body": b'"}}'})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        if mode == "sse":
            for _ in range(4 * CAP // len(PIECE)):
                await send({"type": "http.response.body", "more_body": True,
                            "body": b"data: " + PIECE + b"\n"})
        await receive()   # until the client goes away
        await send({"type": "http.response.body", "body": b""})

    return app


@pytest.mark.parametrize("mode", ["sse", "post"])
async def test_streamable_http_answers_are_bounded(mode: str) -> None:
    async with serving(hostile_http(mode)) as base:
        target = Target(base + "/acp", transport="http1", max_bytes=CAP)
        async with open_link(target, INIT) as (link, answer):
            assert json.loads(answer) == ANSWER
            with anyio.fail_after(20), pytest.raises(LinkLost) as lost:
                if mode == "sse":
                    await link.receive()
                else:
                    await link.send(b'{"jsonrpc": "2.0", "id": 1, "method": "x"}')
    assert f"over {CAP} bytes" in str(lost.value)


async def ws_server(stream: anyio.abc.SocketStream, fragments: list[int]) -> None:
    """A WebSocket server that answers initialize, then sends one text message in
    fragments that never ends (until the client goes away)."""
    ws = wsproto.WSConnection(wsproto.ConnectionType.SERVER)

    async def events() -> AsyncIterator[wsproto.events.Event]:
        while True:
            data = await stream.receive()
            ws.receive_data(data)
            for event in ws.events():
                yield event

    async with stream:
        try:
            async for event in events():
                if isinstance(event, wsproto.events.Request):
                    await stream.send(ws.send(wsproto.events.AcceptConnection()))
                elif isinstance(event, wsproto.events.TextMessage):
                    await stream.send(ws.send(wsproto.events.TextMessage(json.dumps(ANSWER))))
                    while len(fragments) < 100 * CAP // len(PIECE):
                        await stream.send(ws.send(wsproto.events.TextMessage(
                            PIECE.decode(), message_finished=False)))
                        fragments.append(len(PIECE))
                    return
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            return


async def test_a_websocket_message_in_endless_fragments_is_bounded() -> None:
    fragments: list[int] = []
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, lambda stream: ws_server(stream, fragments))
        target = Target(f"http://127.0.0.1:{port}/acp", transport="websocket", max_bytes=CAP)
        async with open_link(target, INIT) as (link, answer):
            assert json.loads(answer) == ANSWER
            with anyio.fail_after(20), pytest.raises(LinkLost) as lost:
                await link.receive()
        tg.cancel_scope.cancel()
    assert lost.value.code == INCOMING_TOO_BIG
    assert f"over {CAP} bytes" in str(lost.value)


async def test_a_failed_websocket_send_does_not_show_the_message() -> None:
    """review7 #16: wsproto's state errors repr the event, and with it the prompt; the
    reason logged on stderr names the error's type only."""
    from acp_server.connect.link import WebSocketLink

    class Closed:
        async def send_text(self, text: str) -> None:
            raise RuntimeError(f"cannot send Message(data={text!r}) in state CLOSED")

        async def receive(self) -> None:
            raise RuntimeError("closed")

    with pytest.raises(LinkLost) as lost:
        await WebSocketLink(Closed()).send(b'{"secret prompt": 1}')
    assert "secret" not in str(lost.value) and "RuntimeError" in str(lost.value)


async def test_cleartext_http2_is_tried_once(tmp_path: Any, anyio_backend: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """review7 #18: uvicorn (asyncio here) logs "Invalid HTTP request received" for each
    cleartext HTTP/2 try; a server that refused it once is spoken HTTP/1.1 from then
    on, so a reconnecting adapter does not fill its log."""
    import httpx

    from acp_server.connect import link as link_module
    from tests.acp_http.server import running_acp_server

    if anyio_backend == "trio":
        pytest.skip("hypercorn speaks cleartext HTTP/2")
    tries: list[bool] = []

    class Client(httpx.AsyncClient):
        def __init__(self, *args: Any, http2: bool = False, **kwargs: Any) -> None:
            tries.append(http2)
            super().__init__(*args, http2=http2, **kwargs)

    async with running_acp_server(tmp_path) as srv:
        monkeypatch.setattr(link_module.httpx, "AsyncClient", Client)
        target = Target(srv.base_url + "/acp", transport="http")
        for _ in range(3):
            async with open_link(target, INIT) as (link, _answer):
                assert "HTTP/1.1" in link.transport
                await link.close()
    assert tries == [True, False, False, False]
