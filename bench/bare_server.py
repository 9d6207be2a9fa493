"""The baseline: a bare Starlette route answering the exact bytes of our 503.

    python -m bench.bare_server    # prints "listening on PORT", serves until killed

Served by uvicorn with the same settings as ``acp-server serve`` (no access log,
lifespan off), so the ratio ours / bare isolates the cost of our route.
"""

from __future__ import annotations

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

BODY = (b'{"error":"Prompt queue full for session \\"00000000-0000-4000-8000-000000000000\\" '
        b'(1/1 pending)","code":"prompt_queue_full","sessionId":'
        b'"00000000-0000-4000-8000-000000000000","limit":1,"pendingCount":1}')


async def prompt(request: Request) -> Response:
    await request.body()
    return Response(BODY, status_code=503, media_type="application/json",
                    headers={"Retry-After": "5"})


app = Starlette(routes=[Route("/session/{session_id}/prompt", prompt, methods=["POST"])])


class _Announcing(uvicorn.Server):
    async def startup(self, sockets=None):  # type: ignore[no-untyped-def]
        await super().startup(sockets=sockets)
        port = self.servers[0].sockets[0].getsockname()[1]
        print(f"listening on {port}", flush=True)


if __name__ == "__main__":
    _Announcing(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", access_log=False,
                               log_level="warning")).run()
