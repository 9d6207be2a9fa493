"""A session's ``GET`` stream refused for now by a proxy (502, 504: a balancer whose
server restarts) is opened again before the message whose reply it carries, as one
refused 429/503 is: a real adapter process over Streamable HTTP to a server (an ASGI
app on a loopback port) whose first answer to each session's stream is the proxy's.
Before, the stream was left unopened and the prompt's reply never came (a hang)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from tests.connect.endpoint import lifespan, read_body
from tests.connect.harness import spawn_adapter
from tests.harness.local import serving

pytestmark = pytest.mark.anyio

INIT = {"protocolVersion": 1, "clientCapabilities": {}}
GUARD_S = 20.0
PROMPT_S1 = {"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
             "params": {"sessionId": "s1", "prompt": [{"type": "text", "text": "hi"}]}}


class Flaky:
    """Each session's first ``GET`` answered ``status`` with an HTML page; the replies
    to ``session/prompt`` go on that session's stream once it is open."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.refused: list[str] = []
        self.replies: dict[str, tuple[Any, Any]] = {}

    def asgi(self) -> Any:
        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await self.serve(scope, receive, send)
        return app

    def _stream_of(self, sid: str) -> tuple[Any, Any]:
        if sid not in self.replies:
            self.replies[sid] = anyio.create_memory_object_stream[bytes](16)
        return self.replies[sid]

    async def serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await lifespan(scope, receive, send):
            return
        headers = dict(scope["headers"])
        sid = headers.get(b"acp-session-id", b"").decode() or None

        async def answer(status: int, body: bytes, kind: bytes = b"application/json",
                         extra: list[tuple[bytes, bytes]] | None = None) -> None:
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", kind), *(extra or [])]})
            await send({"type": "http.response.body", "body": body})

        if scope["method"] == "GET":
            if sid is not None and sid not in self.refused:
                self.refused.append(sid)
                await answer(self.status, b"<html>Bad Gateway</html>", b"text/html",
                             [(b"retry-after", b"0")])
                return
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            await send({"type": "http.response.body", "body": b": hi\n\n", "more_body": True})
            if sid is None:   # the connection's stream: silent
                while (await receive())["type"] != "http.disconnect":
                    pass
                return
            async with self._stream_of(sid)[1] as replies:
                async for frame in replies:
                    await send({"type": "http.response.body", "body": frame,
                                "more_body": True})
            return
        body = await read_body(receive)
        if not body:   # the adapter's DELETE as it ends
            await answer(200, b"")
            return
        msg = json.loads(body)
        if msg.get("method") == "initialize":
            result = {"jsonrpc": "2.0", "id": msg["id"],
                      "result": {"protocolVersion": 1, "agentCapabilities": {}}}
            await answer(200, json.dumps(result).encode(), extra=[(b"acp-connection-id", b"c")])
            return
        if msg.get("method") == "session/prompt":
            reply = {"jsonrpc": "2.0", "id": msg["id"], "result": {"stopReason": "end_turn"}}
            await self._stream_of(msg["params"]["sessionId"])[0].send(
                b"data: " + json.dumps(reply).encode() + b"\n\n")
        await answer(202, b"")


@pytest.mark.parametrize("status", [502, 504])
async def test_a_session_stream_a_proxy_refused_is_opened_again(status: int) -> None:
    flaky = Flaky(status)
    async with serving(flaky.asgi()) as base, \
            spawn_adapter(f"{base}/acp", "--transport", "http1") as adapter:
        assert "result" in await adapter.request("initialize", INIT)
        await adapter.send(PROMPT_S1)
        answer = await adapter.response(2, timeout=GUARD_S)
        assert answer.get("result") == {"stopReason": "end_turn"}, answer
        assert flaky.refused == ["s1"]


class Stuck(Flaky):
    """Session ``s1``'s stream is refused 503 with a long ``Retry-After`` every time;
    every POST's method and session are recorded."""

    def __init__(self) -> None:
        super().__init__(503)
        self.posted: list[tuple[str, str | None]] = []
        self.cancel_arrived = anyio.Event()

    async def serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" \
                and dict(scope["headers"]).get(b"acp-session-id") == b"s1":
            self.refused.append("s1")
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"retry-after", b"60")]})
            await send({"type": "http.response.body", "body": b'{"error":"busy"}'})
            return
        if scope["type"] == "http" and scope["method"] == "GET":
            sid = dict(scope["headers"]).get(b"acp-session-id")
            if sid is not None and sid.decode() not in self.refused:
                self.refused.append(sid.decode())   # the others' streams open at once
        if scope["type"] == "http" and scope["method"] != "GET":
            body = await read_body(receive)
            if not body:   # the adapter's DELETE as it ends
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
            msg = json.loads(body)
            self.posted.append((msg.get("method"), (msg.get("params") or {}).get("sessionId")))
            if msg.get("method") == "session/cancel":
                self.cancel_arrived.set()
            replay = [{"type": "http.request", "body": body, "more_body": False}]

            async def again() -> Any:
                return replay.pop() if replay else await receive()
            await super().serve(scope, again, send)
            return
        await super().serve(scope, receive, send)


async def test_a_cancel_goes_while_a_session_stream_waits_to_be_asked_again() -> None:
    """A prompt waits for its session's stream, refused for now (503, Retry-After 60):
    a cancel of another session goes meanwhile, and a cancel of that prompt withdraws
    it (the server never had it). Before, both waited out the retries (5 x 60 s)."""
    stuck = Stuck()
    async with serving(stuck.asgi()) as base, \
            spawn_adapter(f"{base}/acp", "--transport", "http1") as adapter:
        assert "result" in await adapter.request("initialize", INIT)
        await adapter.send(PROMPT_S1)
        await adapter.send({"jsonrpc": "2.0", "method": "session/cancel",
                            "params": {"sessionId": "s2"}})
        with anyio.fail_after(GUARD_S):
            await stuck.cancel_arrived.wait()
        assert ("session/cancel", "s2") in stuck.posted
        await adapter.send({"jsonrpc": "2.0", "method": "session/cancel",
                            "params": {"sessionId": "s1"}})
        answer = await adapter.response(2, timeout=GUARD_S)
        assert answer.get("result") == {"stopReason": "cancelled"}, answer
        assert ("session/prompt", "s1") not in stuck.posted
        assert "s1" in stuck.refused
