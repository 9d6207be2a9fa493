"""ACP JSON-RPC over HTTP at ``/acp``: the Streamable HTTP transport and WebSocket.

    app = build_app(settings, bridge)
    app.router.routes.extend(acp_routes())     # POST/GET/DELETE /acp + WebSocket /acp

The endpoints read ``app.state.bridge`` and ``app.state.acp_config`` (an ``AcpConfig``,
set by ``acp_server.app.build_app``) and keep their connections in a
``ConnectionRegistry`` created lazily on ``app.state.acp_registry`` (cap
``max_connections``, default 64; reaping grace ``reap_grace_s``, default 10 s).
Errors of the door's routes are answered by ``EXCEPTION_HANDLERS`` (``errors``).

Modules: ``routes`` (HTTP endpoints and status rules), ``websocket`` (the socket),
``dispatch`` (methods → bridge, errors → JSON-RPC), ``connection`` (per-connection
and per-session stream state), ``registry`` (cap, lookup, reaping), ``streams``
(the SSE writer), ``frames`` (bus events → JSON-RPC frames).
"""

from __future__ import annotations

from starlette.routing import BaseRoute, Route, WebSocketRoute

from acp_server.acp_http.config import AcpConfig
from acp_server.acp_http.handlers import EXCEPTION_HANDLERS
from acp_server.acp_http.registry import ConnectionRegistry, registry_for
from acp_server.acp_http.routes import acp_endpoint
from acp_server.acp_http.websocket import acp_websocket

ACP_PATH = "/acp"

__all__ = ["ACP_PATH", "EXCEPTION_HANDLERS", "AcpConfig", "ConnectionRegistry", "acp_routes",
           "registry_for"]


def acp_routes(path: str = ACP_PATH) -> list[BaseRoute]:
    return [Route(path, acp_endpoint, methods=["GET", "POST", "DELETE"]),
            WebSocketRoute(path, acp_websocket)]
