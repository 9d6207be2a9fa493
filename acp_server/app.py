"""The ASGI application over the server's parts: every door, the guard, the request log.

    app = build_app(settings, bridge=bridge, acp=registry, lmsp=service, metrics=metrics)

``acp_server.server.open_server`` owns the parts and calls this; nothing else does.
Mounted: REST + SSE (``acp_server.rest``), ``/acp`` (``acp_server.acp_http``),
``/lmsp/v1`` (``acp_server.lmsp``), ``GET /metrics`` and ``GET /openapi.json``
(``acp_server.ops``), the web console at ``/`` unless ``--no-web``; outside everything
the request log and request metrics (``acp_server.ops.request_log``).

Contracts: the app has no lifespan and no ``app.state``: each door's route factory gets
its typed dependencies here (``rest.routes(bridge, RestConfig)``,
``acp_http.routes(registry, AcpConfig)``, ``lmsp.routes(service)``), built from the
``Settings`` the doors never see. The shared guard (``acp_server.http``) wraps every
door, and each door answers its own errors (``EXCEPTION_HANDLERS``, by path prefix).
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware

from acp_server.acp_http import ACP_PATH, AcpConfig, ConnectionRegistry
from acp_server.acp_http import EXCEPTION_HANDLERS as ACP_HANDLERS
from acp_server.acp_http import routes as acp_routes
from acp_server.http.handlers import by_prefix
from acp_server.http.security import GuardPolicy, SecurityMiddleware
from acp_server.lmsp import CORS_DENIED_PROBLEM, UNAUTHORIZED_PROBLEM, LmspService
from acp_server.lmsp import EXCEPTION_HANDLERS as LMSP_HANDLERS
from acp_server.lmsp import routes as lmsp_routes
from acp_server.lmsp.problems import PROBLEM_JSON
from acp_server.ops import openapi
from acp_server.ops.metrics import Metrics
from acp_server.ops.metrics import routes as metrics_routes
from acp_server.ops.request_log import RequestLogMiddleware
from acp_server.rest import PermissionReport, RestConfig
from acp_server.rest import routes as rest_routes
from acp_server.rest.errors import EXCEPTION_HANDLERS as REST_HANDLERS
from acp_server.routing import IndexedRouter
from acp_server.settings import Settings
from acp_server.web import public_path
from acp_server.web import routes as web_routes
from bridge import Bridge

# Each door answers the errors of its own paths; every other path (REST, /metrics,
# /openapi.json, the web console) gets the REST shape.
EXCEPTION_HANDLERS = by_prefix([("/lmsp/", LMSP_HANDLERS), (ACP_PATH, ACP_HANDLERS),
                                ("", REST_HANDLERS)])


def guard_policy(settings: Settings) -> GuardPolicy:
    return GuardPolicy(token=settings.token, health_needs_auth=settings.health_needs_auth,
                       allow_origins=settings.allow_origins)


def rest_config(settings: Settings) -> RestConfig:
    return RestConfig(
        max_body_bytes=settings.max_body_bytes, heartbeat_s=settings.heartbeat_s,
        agent_name=settings.agent_name, token_configured=settings.token is not None,
        require_auth=settings.require_auth, loopback_bind=settings.loopback,
        allow_origins=settings.allow_origins, header_timeout_ms=settings.header_timeout_ms,
        max_connections=settings.max_connections,
        prompt_deadline_ms=settings.options.prompt_deadline_ms)


def acp_config(settings: Settings) -> AcpConfig:
    return AcpConfig(max_body_bytes=settings.max_body_bytes, heartbeat_s=settings.heartbeat_s,
                     guard=guard_policy(settings), max_connections=settings.max_acp_connections,
                     reap_grace_s=settings.acp_reap_grace_s)


def lmsp_permissions(service: LmspService) -> PermissionReport:
    """``/daemon/status``'s view of how LMSP answered permission requests."""
    runner = service.runner
    return lambda: (runner.permission_policy, dict(runner.permission_decisions))


def build_app(settings: Settings, *, bridge: Bridge, acp: ConnectionRegistry,
              lmsp: LmspService, metrics: Metrics) -> Starlette:
    app = Starlette(exception_handlers=EXCEPTION_HANDLERS,
                    middleware=[Middleware(SecurityMiddleware, policy=guard_policy(settings),
                        unauthorized=[("/lmsp/", PROBLEM_JSON.encode(), UNAUTHORIZED_PROBLEM)],
                        denied=[("/lmsp/", PROBLEM_JSON.encode(), CORS_DENIED_PROBLEM)],
                        public=public_path if settings.web else None)])
    app.router = IndexedRouter(routes=[
        *rest_routes(bridge, rest_config(settings), lmsp_permissions=lmsp_permissions(lmsp),
                     store=lmsp.store),
        *metrics_routes(metrics), *openapi.routes(),
        *acp_routes(acp, acp_config(settings)), *lmsp_routes(lmsp),
        *(web_routes() if settings.web else ())])
    app.add_middleware(RequestLogMiddleware, router_of=lambda: app.router, metrics=metrics)
    return app
