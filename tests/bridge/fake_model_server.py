"""A fake OpenAI-compatible model server (the model is fake, the HTTP is real).

The last user message drives it: ``ERROR`` → 500; ``LENGTH`` → ``finish_reason:
"length"``; ``SLOW`` → 50 chunks 100 ms apart (for cancel); otherwise the reply
``pong: <message>`` streamed in three chunks, then a usage chunk and ``[DONE]``.
``state.requests`` records request bodies; ``state.closed_early`` counts streams the
client closed before the end.
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


def _chunk(content: str | None = None, finish: str | None = None,
           usage: dict[str, int] | None = None) -> bytes:
    body: dict[str, Any] = {"object": "chat.completion.chunk", "choices": []}
    if content is not None or finish is not None:
        body["choices"] = [{"index": 0, "delta": {"content": content} if content else {},
                            "finish_reason": finish}]
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def build_fake_model_app(state: FakeModelState) -> Starlette:
    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "fake-small", "object": "model"},
                                                        {"id": "fake-large", "object": "model"}]})

    async def completions(request: Request) -> Response:
        body = await request.json()
        state.requests.append(body)
        last = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        if "ERROR" in last:
            return JSONResponse({"error": {"message": "fake failure"}}, status_code=500)
        slow = "SLOW" in last
        finish = "length" if "LENGTH" in last else "stop"
        reply = f"pong: {last}"
        third = len(reply) // 3
        pieces = ["x"] * 50 if slow else [reply[:third], reply[third:2 * third], reply[2 * third:]]

        async def stream() -> AsyncIterator[bytes]:
            done = False
            try:
                for piece in pieces:
                    if slow:
                        await anyio.sleep(0.1)
                    yield _chunk(piece)
                yield _chunk(finish=finish)
                yield _chunk(usage={"prompt_tokens": 7, "completion_tokens": len(pieces),
                                    "total_tokens": 7 + len(pieces)})
                yield b"data: [DONE]\n\n"
                done = True
            finally:
                if done:
                    state.finished += 1
                else:
                    state.closed_early += 1

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models, methods=["GET"]),
                             Route("/v1/chat/completions", completions, methods=["POST"])])
