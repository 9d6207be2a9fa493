"""Routes whose endpoints get their dependencies bound once, when a door's routes are built.

    def routes(bridge: Bridge, config: RestConfig) -> list[BaseRoute]:
        return [route("/session", create_session, ["POST"], bridge=bridge, config=config)]

    async def create_session(request: Request, *, bridge: Bridge, config: RestConfig
                             ) -> Response: ...

Contracts: each door has a route factory over its typed dependencies (``rest.routes``,
``acp_http.routes``, ``lmsp.routes``); the composition (``acp_server.server``) calls it
with the parts it owns. An endpoint reads nothing from ``app.state``: what it needs are
keyword arguments, bound here (``functools.partial``, which Starlette unwraps to treat
the endpoint as a function of the request). The route keeps the endpoint's own name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from starlette.routing import Route, WebSocketRoute


def route(path: str, endpoint: Callable[..., Any], methods: list[str], **deps: Any) -> Route:
    """``Route(path, endpoint, methods)`` with ``deps`` bound as keyword arguments."""
    return Route(path, functools.partial(endpoint, **deps), methods=methods,
                 name=endpoint.__name__)


def websocket_route(path: str, endpoint: Callable[..., Any], **deps: Any) -> WebSocketRoute:
    """``WebSocketRoute(path, endpoint)`` with ``deps`` bound as keyword arguments."""
    return WebSocketRoute(path, functools.partial(endpoint, **deps), name=endpoint.__name__)
