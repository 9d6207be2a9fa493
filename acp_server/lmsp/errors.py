"""The LMSP door's answers to what its paths raise instead of answering: problem objects.

    app = Starlette(exception_handlers=by_prefix([("/lmsp/", EXCEPTION_HANDLERS), ...]))

Contracts: the routes answer ``LmspError`` themselves (``routes._endpoint``); what is
left here, under ``/lmsp``, is answered as a §9.3 problem (``application/problem+json``):
no route at the path → 404 ``not_found``; a router 405 → ``method_not_allowed``; any
other router ``HTTPException`` → 400 ``invalid_request``; a client gone during its body
→ the quiet 400; ``StoreUnavailableError`` → 503 ``store_unavailable`` with
``Retry-After``; anything unexpected → 500 ``server_error``, no message of the exception
in the answer, its traceback in the log (``acp_server.lmsp``, ERROR).
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from acp_server.http.body import ClientDisconnected
from acp_server.http.handlers import handle_disconnect, request_line
from acp_server.lmsp.problems import (
    PROBLEM_JSON,
    problem,
    problem_response,
    store_unavailable,
)
from acp_server.lmsp.wire import encode
from acp_server.store.errors import StoreUnavailableError

log = logging.getLogger("acp_server.lmsp")
_CODES = {404: "not_found", 405: "method_not_allowed"}


async def handle_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _CODES.get(exc.status_code, "invalid_request")
    detail = (f"No resource at {request.url.path}." if code == "not_found"
              else f"{request.method} is not allowed on {request.url.path}."
              if code == "method_not_allowed" else str(exc.detail))
    body = encode(problem(code, detail, instance=request.url.path))
    return Response(body, exc.status_code if code != "invalid_request" else 400,
                    exc.headers, PROBLEM_JSON)


async def handle_store(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StoreUnavailableError)
    return problem_response(store_unavailable(exc), instance=request.url.path)


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    # Starlette's ServerErrorMiddleware calls this, then re-raises it to the HTTP server,
    # which logs nothing of it in the daemon (granian runs with its log off): logged here
    log.error("lmsp: %s failed", request_line(request), exc_info=exc)
    body = encode(problem("server_error", "Internal error.", instance=request.url.path))
    return Response(body, 500, media_type=PROBLEM_JSON)


EXCEPTION_HANDLERS: dict[Any, Any] = {
    ClientDisconnected: handle_disconnect,
    ClientDisconnect: handle_disconnect,
    HTTPException: handle_http,
    StoreUnavailableError: handle_store,
    Exception: handle_unexpected,
}
