"""The ASGI application: routes, error mapping and the network guard, composed.

    settings = Settings(workspace="/ws")
    async with Bridge(settings.agent_factory(), workspace_cwd=settings.workspace,
                      options=settings.options) as bridge:
        app = build_app(settings, bridge)          # REST + SSE, /acp, the web console at /
        install_lmsp(app, lmsp_service)             # /lmsp/v1, when LMSP runs (cli.serve)
        await uvicorn.Server(uvicorn.Config(app, port=0)).serve()

Also mounted: ``GET /metrics`` (``acp_server.metrics``, the bridge's observer),
``GET /openapi.json`` (``acp_server.openapi``), and outside everything the request
log and request metrics (``acp_server.request_log``).

Contracts: ``build_app`` has no lifespan of its own. The caller owns the ``Bridge``
and its ``async with`` (so the CLI can drain it on a signal and tests can serve it
on any backend); the app only reads ``app.state.bridge`` and ``app.state.settings``.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware

from acp_server import metrics as metrics_module
from acp_server import openapi
from acp_server.acp_http import acp_routes
from acp_server.lmsp import CORS_DENIED_PROBLEM, UNAUTHORIZED_PROBLEM
from acp_server.lmsp.problems import PROBLEM_JSON
from acp_server.metrics import Metrics
from acp_server.request_log import RequestLogMiddleware
from acp_server.rest import routes
from acp_server.rest.errors import EXCEPTION_HANDLERS
from acp_server.rest.security import SecurityMiddleware
from acp_server.routing import IndexedRouter
from acp_server.settings import Settings
from acp_server.web import public_path, web_routes
from bridge import Bridge


def build_app(settings: Settings, bridge: Bridge) -> Starlette:
    app = Starlette(exception_handlers=EXCEPTION_HANDLERS,
                    middleware=[Middleware(SecurityMiddleware, settings=settings, unauthorized=[
                        ("/lmsp/", PROBLEM_JSON.encode(), UNAUTHORIZED_PROBLEM)], denied=[
                        ("/lmsp/", PROBLEM_JSON.encode(), CORS_DENIED_PROBLEM)],
                        public=public_path if settings.web else None)])
    app.router = IndexedRouter(routes=[*routes(), *metrics_module.routes, *openapi.routes,
                                       *acp_routes(), *(web_routes() if settings.web else ())])
    app.state.bridge = bridge
    app.state.settings = settings
    app.state.metrics = metrics = Metrics(bridge, app.state,
                                          task_ttl_s=settings.metrics_task_ttl_s)
    bridge.observe(metrics)
    app.add_middleware(RequestLogMiddleware, router_of=lambda: app.router, metrics=metrics)
    return app
