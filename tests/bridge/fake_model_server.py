"""A fake OpenAI-compatible model server (the model is fake, the HTTP is real).

The last message (after its last blank line: the newest prompt) drives it: ``ERROR`` → 500; ``LENGTH`` → ``finish_reason:
"length"``; ``SLOW`` → 50 chunks 100 ms apart (for cancel); ``WRITE`` → a
``write_file`` tool call for ``state.write_path`` (what coding agents such as
``qwen --acp`` run as a tool); a ``tool`` message → ``Tool done.``; otherwise the reply
``pong: <message>`` streamed in three chunks, then a usage chunk and ``[DONE]``.
``stream: false`` gets the whole reply as one ``chat.completion``. The Anthropic
Messages shape (``POST /v1/messages``, what ``claude-agent-acp`` calls) streams the same
``pong: <message>`` reply.
``state.requests`` records request bodies; ``state.closed_early`` counts streams the
client closed before the end. ``GET /v1/models`` lists ``state.models`` (change it to
add or remove a model), answers ``state.models_status`` when it is not 200, waits for
``state.models_gate`` when set; ``state.models_asked`` counts the listings.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


class FakeModelState:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.closed_early = 0
        self.finished = 0
        self.write_path = "/tmp/acp-server-fake-model-write.txt"
        self.models = ["fake-small", "fake-large"]
        self.models_status = 200
        self.models_gate: anyio.Event | None = None
        self.models_asked = 0


def chunk(content: str | None = None, finish: str | None = None,
           usage: dict[str, int] | None = None) -> bytes:
    body: dict[str, Any] = {"object": "chat.completion.chunk", "choices": []}
    if content is not None or finish is not None:
        body["choices"] = [{"index": 0, "delta": {"content": content} if content else {},
                            "finish_reason": finish}]
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _tool_call(path: str) -> AsyncIterator[bytes]:
    arguments = json.dumps({"file_path": path, "content": "written via ACP\n"})
    for delta in ({"role": "assistant", "content": ""},
                  {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                   "function": {"name": "write_file", "arguments": ""}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}):
        yield b"data: " + json.dumps({"object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": delta, "finish_reason": None}]}).encode() + b"\n\n"
    yield chunk(finish="tool_calls")
    yield b"data: [DONE]\n\n"


def build_fake_model_app(state: FakeModelState) -> Starlette:
    async def models(request: Request) -> Response:
        state.models_asked += 1
        if state.models_gate is not None:
            await state.models_gate.wait()
        if state.models_status != 200:
            return JSONResponse({"error": {"message": "models unavailable"}},
                                status_code=state.models_status)
        return JSONResponse({"object": "list", "data": [{"id": m, "object": "model"}
                                                        for m in state.models]})

    async def completions(request: Request) -> Response:
        body = await request.json()
        state.requests.append(body)
        message = body["messages"][-1]
        content = message.get("content")
        last = content if isinstance(content, str) else json.dumps(content)
        last = last.rsplit("\n\n", 1)[-1]   # the newest prompt of a joined message
        if message["role"] == "tool":
            last = "Tool done."
        if "ERROR" in last:
            return JSONResponse({"error": {"message": "fake failure"}}, status_code=500)
        slow = "SLOW" in last
        finish = "length" if "LENGTH" in last else "stop"
        reply = "Tool done." if message["role"] == "tool" else f"pong: {last}"
        if not body.get("stream"):
            return JSONResponse({"object": "chat.completion", "model": body.get("model"), "choices": [
                {"index": 0, "finish_reason": finish,
                 "message": {"role": "assistant", "content": reply}}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})
        if "WRITE" in last and message["role"] == "user":
            return StreamingResponse(_tool_call(state.write_path), media_type="text/event-stream")
        third = len(reply) // 3
        pieces = ["x"] * 50 if slow else [reply[:third], reply[third:2 * third], reply[2 * third:]]

        async def stream() -> AsyncIterator[bytes]:
            done = False
            try:
                for piece in pieces:
                    if slow:
                        await anyio.sleep(0.1)
                    yield chunk(piece)
                yield chunk(finish=finish)
                yield chunk(usage={"prompt_tokens": 7, "completion_tokens": len(pieces),
                                    "total_tokens": 7 + len(pieces)})
                yield b"data: [DONE]\n\n"
                done = True
            finally:
                if done:
                    state.finished += 1
                else:
                    state.closed_early += 1

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def messages(request: Request) -> Response:
        body = await request.json()
        state.requests.append(body)
        message = body["messages"][-1]
        content = message.get("content")
        last = content if isinstance(content, str) else json.dumps(content)
        return _anthropic_reply(body, f"pong: {last[:200]}")

    async def count_tokens(request: Request) -> Response:
        return JSONResponse({"input_tokens": 10})

    return Starlette(routes=[Route("/v1/models", models, methods=["GET"]),
                             Route("/v1/chat/completions", completions, methods=["POST"]),
                             Route("/v1/messages", messages, methods=["POST"]),
                             Route("/v1/messages/count_tokens", count_tokens, methods=["POST"])])


def _anthropic_reply(body: dict[str, Any], reply: str) -> Response:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": body.get("model"),
               "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": 10, "output_tokens": 1}}
    if not body.get("stream"):
        return JSONResponse({**message, "content": [{"type": "text", "text": reply}],
                             "stop_reason": "end_turn"})

    def event(kind: str, data: dict[str, Any]) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()

    async def stream() -> AsyncIterator[bytes]:
        yield event("message_start", {"message": message})
        yield event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        for piece in (reply[:len(reply) // 2], reply[len(reply) // 2:]):
            yield event("content_block_delta", {"index": 0,
                                                "delta": {"type": "text_delta", "text": piece}})
        yield event("content_block_stop", {"index": 0})
        yield event("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                      "usage": {"output_tokens": 2}})
        yield event("message_stop", {})

    return StreamingResponse(stream(), media_type="text/event-stream")
