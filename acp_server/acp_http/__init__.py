"""ACP JSON-RPC over HTTP at ``/acp``: the Streamable HTTP transport and WebSocket.

    registry = ConnectionRegistry(bridge, max_connections=64, grace_s=10.0)
    config = AcpConfig(max_body_bytes=1 << 20, heartbeat_s=15.0)
    app = Starlette(routes=acp_http.routes(registry, config))   # POST/GET/DELETE + WS /acp

The endpoints get the ``ConnectionRegistry`` (which holds the bridge and the live
connections: cap ``max_connections``, default 64; reaping grace ``grace_s``, default
10 s) and the ``AcpConfig`` bound when the routes are built, never from ``app.state``;
the composition (``acp_server.server``) owns the registry and shuts it down on drain.
Errors of the door's routes are answered by ``EXCEPTION_HANDLERS`` (``errors``).

Modules: ``streamable`` (the Streamable HTTP endpoints and status rules), ``websocket``
(the socket), ``dispatch`` (methods → bridge, errors → JSON-RPC), ``access`` (what a
message needs of its principal, whose sessions it may touch), ``connection``
(per-connection and per-session stream state), ``registry`` (cap, lookup, reaping),
``streams`` (the SSE writer), ``frames`` (bus events → JSON-RPC frames).
"""

from __future__ import annotations

from starlette.routing import BaseRoute

from acp_server.acp_http.config import AcpConfig
from acp_server.acp_http.handlers import EXCEPTION_HANDLERS
from acp_server.acp_http.registry import ConnectionRegistry
from acp_server.acp_http.streamable import acp_endpoint
from acp_server.acp_http.websocket import acp_websocket
from acp_server.http.endpoints import route, websocket_route
from acp_server.principals.model import OPEN, PER_MESSAGE, READING, Access

ACP_PATH = "/acp"

__all__ = ["ACP_PATH", "EXCEPTION_HANDLERS", "AcpConfig", "ConnectionRegistry", "access",
           "routes"]


def access(method: str, path: str) -> Access:
    """What an ``/acp`` request needs of its principal, before its message is read: a
    stream (GET; HEAD, answered 405) needs ``read``; closing a connection (DELETE)
    nothing; a POST is decided per JSON-RPC message (``access.message_access``)."""
    if method in ("GET", "HEAD"):
        return READING
    return PER_MESSAGE if method == "POST" else OPEN


def routes(registry: ConnectionRegistry, config: AcpConfig,
           path: str = ACP_PATH) -> list[BaseRoute]:
    """``/acp`` over Streamable HTTP and WebSocket, on one registry of connections."""
    return [route(path, acp_endpoint, ["GET", "POST", "DELETE"], registry=registry,
                  config=config),
            websocket_route(path, acp_websocket, registry=registry, config=config)]
