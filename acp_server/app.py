"""The ASGI application: routes, error mapping and the network guard, composed.

    settings = Settings(workspace="/ws")
    async with Bridge(settings.agent_factory(), workspace_cwd=settings.workspace,
                      options=settings.options) as bridge:
        app = build_app(settings, bridge)          # REST + SSE, /acp, the web console at /
        install_lmsp(app, lmsp_service)             # /lmsp/v1, when LMSP runs (cli.serve)
        await uvicorn.Server(uvicorn.Config(app, port=0)).serve()

Also mounted: ``GET /metrics`` (``acp_server.ops.metrics``, the bridge's observer),
``GET /openapi.json`` (``acp_server.ops.openapi``), and outside everything the request
log and request metrics (``acp_server.ops.request_log``).

Contracts: ``build_app`` has no lifespan of its own. The caller owns the ``Bridge``
and its ``async with`` (so the CLI can drain it on a signal and tests can serve it
on any backend). The composition is here: the shared guard (``acp_server.http``)
wraps every door; each door gets its own values (``app.state.rest_config``,
``app.state.acp_config``; the LMSP service carries its own) and answers its own
errors (``EXCEPTION_HANDLERS``, by path prefix). No door reads ``Settings``.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware

from acp_server import acp_http, lmsp
from acp_server.ops import metrics as metrics_module
from acp_server.ops import openapi
from acp_server.acp_http import AcpConfig, acp_routes
from acp_server.http.handlers import by_prefix
from acp_server.http.security import GuardPolicy, SecurityMiddleware
from acp_server.lmsp import CORS_DENIED_PROBLEM, UNAUTHORIZED_PROBLEM
from acp_server.lmsp.problems import PROBLEM_JSON
from acp_server.ops.metrics import Metrics
from acp_server.ops.request_log import RequestLogMiddleware
from acp_server.rest import routes
from acp_server.rest.config import RestConfig
from acp_server.rest.errors import EXCEPTION_HANDLERS as REST_HANDLERS
from acp_server.routing import IndexedRouter
from acp_server.settings import Settings
from acp_server.web import public_path, web_routes
from bridge import Bridge

# Each door answers the errors of its own paths; every other path (REST, /metrics,
# /openapi.json, the web console) gets the REST shape.
EXCEPTION_HANDLERS = by_prefix([("/lmsp/", lmsp.EXCEPTION_HANDLERS),
                                (acp_http.ACP_PATH, acp_http.EXCEPTION_HANDLERS),
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


def build_app(settings: Settings, bridge: Bridge) -> Starlette:
    app = Starlette(exception_handlers=EXCEPTION_HANDLERS,
                    middleware=[Middleware(SecurityMiddleware, policy=guard_policy(settings),
                        unauthorized=[("/lmsp/", PROBLEM_JSON.encode(), UNAUTHORIZED_PROBLEM)],
                        denied=[("/lmsp/", PROBLEM_JSON.encode(), CORS_DENIED_PROBLEM)],
                        public=public_path if settings.web else None)])
    app.router = IndexedRouter(routes=[*routes(), *metrics_module.routes, *openapi.routes,
                                       *acp_routes(), *(web_routes() if settings.web else ())])
    app.state.bridge = bridge
    app.state.settings = settings
    app.state.rest_config = rest_config(settings)   # each door gets its values, not Settings
    app.state.acp_config = acp_config(settings)
    app.state.metrics = metrics = Metrics(bridge, app.state,
                                          task_ttl_s=settings.metrics_task_ttl_s)
    bridge.observe(metrics)
    app.add_middleware(RequestLogMiddleware, router_of=lambda: app.router, metrics=metrics)
    return app
