"""The ASGI application: routes, error mapping and the network guard, composed.

    settings = Settings(workspace="/ws")
    async with Bridge(settings.agent_factory(), workspace_cwd=settings.workspace,
                      options=settings.options) as bridge:
        app = build_app(settings, bridge)          # REST + SSE and /acp
        install_lmsp(app, lmsp_service)             # /lmsp/v1, when LMSP runs (cli.serve)
        await uvicorn.Server(uvicorn.Config(app, port=0)).serve()

Contracts: ``build_app`` has no lifespan of its own. The caller owns the ``Bridge``
and its ``async with`` (so the CLI can drain it on a signal and tests can serve it
on any backend); the app only reads ``app.state.bridge`` and ``app.state.settings``.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware

from acp_server.acp_http import acp_routes
from acp_server.lmsp import CORS_DENIED_PROBLEM, UNAUTHORIZED_PROBLEM
from acp_server.lmsp.problems import PROBLEM_JSON
from acp_server.rest import routes
from acp_server.rest.errors import EXCEPTION_HANDLERS
from acp_server.rest.security import SecurityMiddleware
from acp_server.routing import IndexedRouter
from acp_server.settings import Settings
from bridge import Bridge


def build_app(settings: Settings, bridge: Bridge) -> Starlette:
    app = Starlette(exception_handlers=EXCEPTION_HANDLERS,
                    middleware=[Middleware(SecurityMiddleware, settings=settings, unauthorized=[
                        ("/lmsp/", PROBLEM_JSON.encode(), UNAUTHORIZED_PROBLEM)], denied=[
                        ("/lmsp/", PROBLEM_JSON.encode(), CORS_DENIED_PROBLEM)])])
    app.router = IndexedRouter(routes=[*routes(), *acp_routes()])
    app.state.bridge = bridge
    app.state.settings = settings
    return app
