"""Each door answers its own errors: one Starlette exception-handler table per path prefix.

    app = Starlette(exception_handlers=by_prefix([
        ("/lmsp/", lmsp.EXCEPTION_HANDLERS),   # problem objects
        ("/acp", acp_http.EXCEPTION_HANDLERS),
        ("", rest.EXCEPTION_HANDLERS),          # every other path
    ]))

Contracts:

* ``by_prefix`` returns one table for ``Starlette(exception_handlers=...)``: an
  exception raised while serving a path is answered by the table of the first door
  whose prefix matches (``"/x/"`` and ``"/x"`` both match ``/x`` and ``/x/...``; ``""``
  matches every path, so it goes last), looked up along the exception's MRO as
  Starlette does. Router 404/405 answers (``HTTPException``) are mapped the same way,
  so a path under a door gets that door's error shape.
* Each door's table has an ``Exception`` entry (Starlette installs it in
  ``ServerErrorMiddleware``: the 500). An exception its door has no entry for is
  re-raised, and so reaches that 500.
* Nothing here runs on a request that raises nothing: the routes' fast paths
  (e.g. a refused prompt's 503, answered by the route itself) are untouched.
* ``handle_disconnect``: a client gone in the middle of its body gets one quiet log
  line and an answer nobody reads.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from bridge.loggable import loggable

log = logging.getLogger("acp_server.http")

Handler = Callable[[Request, Exception], Awaitable[Response]]


def _matches(prefix: str, path: str) -> bool:
    if not prefix:
        return True
    base = prefix.rstrip("/")
    return path == base or path.startswith(base + "/")


def _lookup(table: Mapping[Any, Handler], exc: Exception) -> Handler | None:
    for cls in type(exc).__mro__:
        if cls in table:
            return table[cls]
    return None


def by_prefix(doors: Sequence[tuple[str, Mapping[Any, Handler]]]) -> dict[Any, Handler]:
    """One exception-handler table that answers each path with its door's table."""
    doors = tuple(doors)

    async def answer(request: Request, exc: Exception) -> Response:
        path: str = request.scope["path"]
        for prefix, table in doors:
            if _matches(prefix, path):
                handler = _lookup(table, exc)
                if handler is None:
                    raise exc
                return await handler(request, exc)
        raise exc

    return {key: answer for _, table in doors for key in table}


async def handle_disconnect(request: Request, exc: Exception) -> Response:
    # A client gone in the middle of its body: one quiet line, no traceback; the
    # answer is never read.
    log.info("client disconnected during the request body: %s", request_line(request))
    return Response(status_code=400)


def request_line(request: Request) -> str:
    """``METHOD PATH`` as a log line may say it: the client chose both, so each is
    ``loggable`` (no CR/LF to forge a line, no terminal escape, bounded)."""
    return f"{loggable(request.method, 64)} {loggable(request.scope.get('path', ''))}"


__all__ = ["Handler", "by_prefix", "handle_disconnect", "request_line"]
