"""The floors: a raw ASGI callable and a bare Starlette route answering the exact bytes
of our 503, on either HTTP server we ship: stock uvicorn, or granian embedded as ``acp-server
serve`` runs it.

    python -m bench.floor_server raw granian     # prints "listening on PORT", serves until killed
    python -m bench.floor_server bare uvicorn
    python -m bench.floor_server rawrsgi granian   # the raw callable on granian's RSGI

The ratio ours / floor isolates the cost of our app on that server: ``raw`` is the
least any ASGI app can cost there, ``bare`` what one framework route costs.
"""

from __future__ import annotations

import importlib.util
import socket
import sys
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from acp_server.http.options import HttpOptions
from acp_server.http.servers import Limits, http_server

SESSION = "00000000-0000-4000-8000-000000000000"
PATH = f"/session/{SESSION}/prompt"
BODY = (b'{"error":"Prompt queue full for session \\"00000000-0000-4000-8000-000000000000\\" '
        b'(1/1 pending)","code":"prompt_queue_full","sessionId":'
        b'"00000000-0000-4000-8000-000000000000","limit":1,"pendingCount":1}')
_START = {"type": "http.response.start", "status": 503, "headers": [
    (b"content-type", b"application/json"), (b"retry-after", b"5"),
    (b"content-length", str(len(BODY)).encode())]}


async def raw(scope: Any, receive: Any, send: Any) -> None:
    """The cheapest correct answer: read the body, send the two messages."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send(dict(_START))
    await send({"type": "http.response.body", "body": BODY})


async def prompt(request: Request) -> Response:
    await request.body()
    return Response(BODY, status_code=503, media_type="application/json",
                    headers={"Retry-After": "5"})


class RawRsgi:
    """The raw callable written for granian's RSGI: the body in one call, the answer
    in one call (served with ``--granian-interface rsgi`` semantics)."""

    _headers = [(name.decode(), value.decode()) for name, value in _START["headers"]]

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.proto == "http":
            await proto()
            proto.response_bytes(503, self._headers, BODY)


bare = Starlette(routes=[Route("/session/{session_id}/prompt", prompt, methods=["POST"])])
APPS: dict[str, Any] = {"raw": raw, "bare": bare, "rawrsgi": RawRsgi()}


async def serve(app_name: str, server_name: str) -> None:
    announce = lambda url: print(f"listening on {url.rsplit(':', 1)[1]}", flush=True)  # noqa: E731
    if server_name == "uvicorn":   # stock uvicorn, as a user would run the floor
        import uvicorn

        class Announcing(uvicorn.Server):
            async def startup(self, sockets: Any = None) -> None:
                await super().startup(sockets=sockets)
                announce(f"http://127.0.0.1:{self.servers[0].sockets[0].getsockname()[1]}")

        await Announcing(uvicorn.Config(APPS[app_name], host="127.0.0.1", port=0,
                                        lifespan="off", access_log=False,
                                        log_level="warning")).serve()
        return
    limits = Limits(header_timeout_s=10.0, max_connections=2560, max_header_bytes=65536,
                    max_headers=100, max_request_line=8192, ws_max_bytes=10 << 20)
    sock = socket.create_server(("127.0.0.1", 0), backlog=2048)
    options = HttpOptions(server=server_name,
                          granian_interface="rsgi" if app_name == "rawrsgi" else "asgi")
    server = http_server(APPS[app_name], options, sock, limits=limits)
    await server.serve(announce)


if __name__ == "__main__":
    anyio.run(serve, sys.argv[1], sys.argv[2], backend="asyncio",
              backend_options={"use_uvloop": importlib.util.find_spec("uvloop") is not None})
