"""The ASGI application over the server's parts: every door, the front layer, the
request log.

    app = build_app(settings, bridge=bridge, acp=registry, lmsp=service, metrics=metrics)

``acp_server.server.open_server`` owns the parts and calls this; nothing else does.
Mounted: REST + SSE (``acp_server.rest``), ``/acp`` (``acp_server.acp_http``),
``/lmsp/v1`` (``acp_server.lmsp``), ``GET /metrics`` and ``GET /openapi.json``
(``acp_server.ops``), the web console at ``/`` unless ``--no-web``. Outside everything,
one front layer (``acp_server.http.front``): the guard (``GuardPolicy.check``), CORS,
the hot path, and the hooks of the request log and request metrics
(``acp_server.ops.request_log.AccessRecorder``).

Contracts: the app has no lifespan and no ``app.state``: each door's route factory gets
its typed dependencies here (``rest.routes(bridge, RestConfig)``,
``acp_http.routes(registry, AcpConfig)``, ``lmsp.routes(service)``), built from the
``Settings`` the doors never see. Each door answers its own errors
(``EXCEPTION_HANDLERS``, by path prefix) and renders the front layer's refusals
(``render_refusal``: REST ``{error, code}``, ``/acp`` JSON-RPC error, LMSP problem).
With ``--http-server granian`` the front layer also caps requests in flight at
``--max-connections`` (granian cannot cap connections below ASGI; see
``acp_server.http.servers``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.routing import BaseRoute
from starlette.types import ASGIApp

from acp_server.acp_http import ACP_PATH, AcpConfig, ConnectionRegistry
from acp_server.acp_http import access as acp_access
from acp_server.acp_http import EXCEPTION_HANDLERS as ACP_HANDLERS
from acp_server.acp_http import routes as acp_routes
from acp_server.acp_http.errors import render_refusal as acp_refusal
from acp_server.http.front import Door, FrontLayer, HotRoute
from acp_server.http.clients import ClientResolver
from acp_server.http.guard import GuardStats
from acp_server.http.handlers import by_prefix
from acp_server.http.mounts import WorkspaceMounts
from acp_server.http.policy import GuardPolicy
from acp_server.lmsp import EXCEPTION_HANDLERS as LMSP_HANDLERS
from acp_server.lmsp import LmspService
from acp_server.lmsp import routes as lmsp_routes
from acp_server.lmsp.endpoints import access as lmsp_access
from acp_server.lmsp.endpoints import fast_routes as lmsp_fast_routes
from acp_server.lmsp.problems import render_refusal as lmsp_refusal
from acp_server.ops import openapi
from acp_server.ops.metrics import Metrics
from acp_server.ops.metrics import routes as metrics_routes
from acp_server.ops.request_log import AccessRecorder
from acp_server.rest import PermissionReport, PromptSentAgain, RestConfig, fast_routes
from acp_server.rest import routes as rest_routes
from acp_server.rest.access import access as rest_access
from acp_server.rest.errors import EXCEPTION_HANDLERS as REST_HANDLERS
from acp_server.rest.errors import render_refusal as rest_refusal
from acp_server.rest.workspace import workspace_id
from acp_server.principals import Gate
from acp_server.routing import IndexedRouter
from acp_server.settings import Settings
from acp_server.web import public_path
from acp_server.web import routes as web_routes
from bridge import Bridge

# Each door answers the errors of its own paths; every other path (REST, /metrics,
# /openapi.json, the web console) gets the REST shape.
EXCEPTION_HANDLERS = by_prefix([("/lmsp/", LMSP_HANDLERS), (ACP_PATH, ACP_HANDLERS),
                                ("", REST_HANDLERS)])
# The doors as the front layer sees them: refusals in each door's shape, and the door
# named in logs and metrics.
DOORS = (Door("/lmsp/", "lmsp", lmsp_refusal, lmsp_access),
         Door(ACP_PATH, "acp", acp_refusal, acp_access),
         Door("/metrics", "ops", rest_refusal, rest_access),
         Door("/openapi.json", "ops", rest_refusal, rest_access),
         Door("", "rest", rest_refusal, rest_access))


def guard_policy(settings: Settings, gate: Gate | None = None,
                 forwarded_secret: Callable[[], bytes | None] | None = None) -> GuardPolicy:
    clients = ClientResolver(trusted=settings.http.trusted_proxies, secret=forwarded_secret)
    return GuardPolicy(token=settings.token, gate=gate,
                       clients=clients if clients.active else None,
                       health_needs_auth=settings.health_needs_auth,
                       allow_origins=settings.allow_origins, loopback_bind=settings.loopback,
                       allow_hosts=settings.http.allow_hosts,
                       max_header_bytes=settings.http.max_header_bytes,
                       max_headers=settings.http.max_headers,
                       max_request_line=settings.http.max_request_line,
                       public=public_path if settings.web else None)


def rest_config(settings: Settings, guard_stats: GuardStats | None = None) -> RestConfig:
    return RestConfig(
        max_body_bytes=settings.max_body_bytes, heartbeat_s=settings.heartbeat_s,
        agent_name=settings.agent_name, token_configured=settings.token is not None,
        require_auth=settings.require_auth, loopback_bind=settings.loopback,
        allow_origins=settings.allow_origins, header_timeout_ms=settings.header_timeout_ms,
        max_connections=settings.max_connections,
        prompt_deadline_ms=settings.options.prompt_deadline_ms, guard_stats=guard_stats)


def acp_config(settings: Settings, guard: GuardPolicy | None = None) -> AcpConfig:
    return AcpConfig(max_body_bytes=settings.max_body_bytes, heartbeat_s=settings.heartbeat_s,
                     guard=guard or guard_policy(settings),
                     max_connections=settings.max_acp_connections,
                     reap_grace_s=settings.acp_reap_grace_s)


def lmsp_permissions(service: LmspService) -> PermissionReport:
    """``/daemon/status``'s view of how LMSP answered permission requests."""
    runner = service.runner
    return lambda: (runner.permission_policy, dict(runner.permission_decisions))


class _App(Starlette):
    """Starlette with the front layer outside its whole stack (its error middleware
    included), so that a refusal or a 503 costs one layer."""

    front: Any = None
    recorder: AccessRecorder | None = None   # closed when the server stops (summaries)

    def build_middleware_stack(self) -> Any:
        stack = super().build_middleware_stack()
        return stack if self.front is None else self.front(stack)


def build_app(settings: Settings, *, bridge: Bridge, acp: ConnectionRegistry,
              lmsp: LmspService, metrics: Metrics, gate: Gate | None = None,
              guard_stats: GuardStats | None = None,
              sessions_router: Callable[[ASGIApp], ASGIApp] | None = None,
              instances: Callable[[], dict[str, Any]] | None = None,
              forwarded_secret: Callable[[], bytes | None] | None = None) -> Starlette:
    """``gate``: the principals' gate (stored tokens, scopes, rate limits);
    ``guard_stats``: the guards' counters (the front layer's and the HTTP
    server's), reported by ``/daemon/status``; ``sessions_router``: wraps the app
    inside the front layer (``acp_server.fleet.SessionRouter``: sessions across
    instances), so requests are checked before they are forwarded;
    ``forwarded_secret``: the fleet's shared secret, which proves the client address a
    forwarding instance names (``acp_server.http.clients``)."""
    guard_stats = guard_stats if guard_stats is not None else GuardStats()
    policy = guard_policy(settings, gate, forwarded_secret)
    # The front layer caps requests in flight: granian cannot cap connections below
    # ASGI, and over HTTP/2 one connection carries up to 100 requests on either server
    max_in_flight = settings.max_connections
    config = rest_config(settings, guard_stats)
    app = _App(exception_handlers=EXCEPTION_HANDLERS)
    app.router = IndexedRouter(routes=[
        *rest_routes(bridge, config, lmsp_permissions=lmsp_permissions(lmsp),
                     store=lmsp.store, gate=gate, instances=instances),
        *metrics_routes(metrics), *openapi.routes(),
        *acp_routes(acp, acp_config(settings, policy)), *lmsp_routes(lmsp),
        *(web_routes() if settings.web else ())])
    recorder = app.recorder = AccessRecorder(router_of=lambda: app.router, metrics=metrics)
    fast = {**fast_routes(bridge, config), **lmsp_fast_routes(lmsp)}
    hot = [HotRoute("POST", route, handler, declines) for path, (handler, declines) in
           fast.items() for route in _routes_at(app.router, path)]
    route = sessions_router or (lambda stack: stack)
    mounts = workspace_mounts(bridge.workspace_cwd)
    # REST: a prompt its rate limit refused goes on when sent again under its id
    doors = (*DOORS[:-1], dataclasses.replace(DOORS[-1], resent=PromptSentAgain(bridge, config)))
    app.front = lambda stack: FrontLayer(route(stack), policy, doors=doors, observer=recorder,
                                         max_in_flight=max_in_flight, stats=guard_stats, hot=hot,
                                         aliases=mounts.exact, stray_alias=mounts.of_stray,
                                         body_timeout_s=settings.header_timeout_ms / 1000)
    return app


def workspace_mounts(cwd: str) -> WorkspaceMounts:
    """``qwen serve``'s per-workspace mounts of this daemon's one workspace:
    ``/workspaces/{ws}/acp`` is ``/acp`` and ``/workspaces/{ws}/sessions`` is
    ``/workspace/{id}/sessions``, where ``{ws}`` is the workspace id of ``/capabilities``
    or the workspace's absolute path (URL-encoded, ``%2F``; as the server decodes it).
    Any other ``{ws}`` reaches ``rest.workspace``'s 400 ``workspace_mismatch``
    (``acp_server.http.mounts``). ``/workspace/{path}/sessions`` (the peer's listing
    under the workspace's path, as its SDK's ``listWorkspaceSessions(cwd)`` asks) is
    ``/workspace/{id}/sessions`` too; another path there reaches that route with the
    path as its one segment, answered as qwen's (``rest.workspace``)."""
    wid = workspace_id(cwd)
    listing = f"/workspace/{wid}/sessions"
    return WorkspaceMounts(cwd, wid, {"acp": ACP_PATH, "sessions": listing},
                           by_path={"sessions": listing})


def _routes_at(router: IndexedRouter, path: str) -> list[BaseRoute]:
    return [route for route in router.routes if getattr(route, "path", None) == path]
