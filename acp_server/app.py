"""The ASGI application: routes, error mapping and the network guard, composed.

    settings = Settings(workspace="/ws")
    async with Bridge(settings.agent_factory(), workspace_cwd=settings.workspace,
                      options=settings.options) as bridge:
        app = build_app(settings, bridge)          # REST + SSE, /acp, the web console at /
        install_lmsp(app, lmsp_service)             # /lmsp/v1, when LMSP runs (cli.serve)
        await uvicorn.Server(uvicorn.Config(app, port=0)).serve()

Also mounted: ``GET /metrics`` (``acp_server.metrics``, the bridge's observer),
``GET /openapi.json`` (``acp_server.openapi``). Outside everything, one front layer
(``acp_server.http.front``): the guard (``GuardPolicy``), CORS, and the hooks of the
request log and request metrics (``acp_server.request_log.AccessRecorder``).

Contracts: ``build_app`` has no lifespan of its own. The caller owns the ``Bridge``
and its ``async with`` (so the CLI can drain it on a signal and tests can serve it
on any backend). The composition is here: the shared guard (``acp_server.http``)
wraps every door; each door gets its own values (``app.state.rest_config``,
``app.state.acp_config``; the LMSP service carries its own) and answers its own
errors (``EXCEPTION_HANDLERS``, by path prefix). No door reads ``Settings``.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette

from acp_server import acp_http, lmsp
from acp_server import metrics as metrics_module
from acp_server import openapi
from acp_server.acp_http import AcpConfig, acp_routes
from acp_server.acp_http.errors import render_refusal as acp_refusal
from acp_server.http.front import Door, FrontLayer, HotRoute
from acp_server.http.guard import REFUSED
from acp_server.http.handlers import by_prefix
from acp_server.http.policy import GuardPolicy
from acp_server.lmsp.problems import render_refusal as lmsp_refusal
from acp_server.metrics import Metrics
from acp_server.request_log import AccessRecorder
from acp_server.rest import routes
from acp_server.rest.config import RestConfig
from acp_server.rest.errors import EXCEPTION_HANDLERS as REST_HANDLERS
from acp_server.rest.errors import render_refusal as rest_refusal
from acp_server.rest.prompts import send_prompt_fast
from acp_server.routing import IndexedRouter
from acp_server.settings import Settings
from acp_server.web import public_path, web_routes
from bridge import Bridge

# Each door answers the errors of its own paths; every other path (REST, /metrics,
# /openapi.json, the web console) gets the REST shape.
EXCEPTION_HANDLERS = by_prefix([("/lmsp/", lmsp.EXCEPTION_HANDLERS),
                                (acp_http.ACP_PATH, acp_http.EXCEPTION_HANDLERS),
                                ("", REST_HANDLERS)])


# The doors as the front layer sees them: refusals in each door's shape, and the door
# named in logs and metrics.
DOORS = (Door("/lmsp/", "lmsp", lmsp_refusal), Door(acp_http.ACP_PATH, "acp", acp_refusal),
         Door("/metrics", "ops", rest_refusal), Door("/openapi.json", "ops", rest_refusal),
         Door("", "rest", rest_refusal))


def guard_policy(settings: Settings) -> GuardPolicy:
    return GuardPolicy(token=settings.token, health_needs_auth=settings.health_needs_auth,
                       allow_origins=settings.allow_origins, loopback_bind=settings.loopback,
                       allow_hosts=settings.http.allow_hosts,
                       max_header_bytes=settings.http.max_header_bytes,
                       max_headers=settings.http.max_headers,
                       max_request_line=settings.http.max_request_line,
                       public=public_path if settings.web else None)


class _App(Starlette):
    """Starlette with the front layer outside its whole stack (its error middleware
    included), so that a refusal or a 503 costs one layer."""

    front: Any = None

    def build_middleware_stack(self) -> Any:
        stack = super().build_middleware_stack()
        return stack if self.front is None else self.front(stack)


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


def build_app(settings: Settings, bridge: Bridge, *, max_in_flight: int | None = None
              ) -> Starlette:
    """``max_in_flight``: the request cap of the front layer, for HTTP servers that
    cannot cap connections below ASGI (``acp_server.http.servers``)."""
    app = _App(exception_handlers=EXCEPTION_HANDLERS)
    app.router = IndexedRouter(routes=[*routes(), *metrics_module.routes, *openapi.routes,
                                       *acp_routes(), *(web_routes() if settings.web else ())])
    app.state.bridge = bridge
    app.state.settings = settings
    app.state.rest_config = rest_config(settings)   # each door gets its values, not Settings
    app.state.acp_config = acp_config(settings)
    app.state.metrics = metrics = Metrics(bridge, app.state,
                                          task_ttl_s=settings.metrics_task_ttl_s)
    bridge.observe(metrics)
    recorder = AccessRecorder(router_of=lambda: app.router, metrics=metrics)
    policy = app.state.acp_config.guard
    prompt_route = next(r for r in app.router.routes
                        if getattr(r, "path", None) == "/session/{session_id}/prompt")
    hot = [HotRoute("POST", prompt_route, send_prompt_fast)]   # the REST prompt: 202 / 503
    app.front = lambda stack: FrontLayer(stack, policy, doors=DOORS, observer=recorder,
                                         max_in_flight=max_in_flight, stats=REFUSED, hot=hot)
    return app
