"""The ``/acp`` door's answers to what its routes raise instead of answering.

    app = Starlette(exception_handlers=by_prefix([("/acp", EXCEPTION_HANDLERS), ...]))

Contracts: the routes answer JSON-RPC errors themselves (``routes``, ``dispatch``);
what is left here is HTTP-level, in the door's plain shape ``{"error": message}``
(as its 415 / 406 / 501 answers): a router 405 (``PUT /acp``) → ``{"error":
"Method Not Allowed"}``; a client gone during its body → the quiet 400; anything
unexpected → 500 ``{"error": "Internal error"}``, no message of the exception (it is
logged, with its traceback).
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from acp_server.http.body import ClientDisconnected
from acp_server.http.handlers import handle_disconnect, request_line

log = logging.getLogger("acp_server.acp_http")
_INTERNAL = b'{"error":"Internal error"}'


async def handle_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return Response(msgspec.json.encode({"error": exc.detail}), exc.status_code, exc.headers,
                    "application/json")


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    # Starlette's ServerErrorMiddleware calls this, then re-raises it to the HTTP server,
    # which logs nothing of it in the daemon (granian runs with its log off): logged here
    log.error("acp: %s failed", request_line(request), exc_info=exc)
    return Response(_INTERNAL, 500, media_type="application/json")


EXCEPTION_HANDLERS: dict[Any, Any] = {
    ClientDisconnected: handle_disconnect,
    ClientDisconnect: handle_disconnect,
    HTTPException: handle_http,
    Exception: handle_unexpected,
}
