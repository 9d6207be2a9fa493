"""The REST + SSE front door (``qwen serve`` 0.24.4 core session surface).

    from acp_server.rest import routes
    from acp_server.rest.errors import EXCEPTION_HANDLERS
    app = Starlette(routes=routes(bridge, RestConfig(max_body_bytes=1 << 20, heartbeat_s=15,
                                                     agent_name="reference")),
                    exception_handlers=EXCEPTION_HANDLERS)

Each module holds one noun's routes and its route factory; ``routes`` joins them. The
endpoints get the ``Bridge`` and the door's ``RestConfig`` bound when the routes are
built (``acp_server.http.endpoints``), never from ``app.state``. ``daemon_status`` also
reports LMSP's permission answers when the composition hands it ``lmsp_permissions``.
``errors.EXCEPTION_HANDLERS`` answers the door's errors.
"""

from __future__ import annotations

from starlette.routing import BaseRoute

from acp_server.rest import (
    admin,
    capabilities,
    daemon,
    ended,
    events,
    health,
    permissions,
    prompts,
    sessions,
    setters,
    workspace,
)
from acp_server.rest.config import RestConfig
from acp_server.rest.daemon import PermissionReport
from acp_server.principals import Gate
from acp_server.store.errors import Probed
from bridge import Bridge

__all__ = ["PermissionReport", "PromptSentAgain", "RestConfig", "fast_routes", "routes"]

fast_routes = prompts.fast_routes   # the front layer's hot path: path -> (fast handler, declines)
PromptSentAgain = prompts.PromptSentAgain   # the door's ``resent``: a prompt sent again


def routes(bridge: Bridge, config: RestConfig, *,
           lmsp_permissions: PermissionReport | None = None,
           store: Probed | None = None, gate: Gate | None = None,
           instances: daemon.InstancesReport | None = None) -> list[BaseRoute]:
    """Every REST route, over its dependencies (``store``: what ``/health?deep=1`` asks;
    ``gate``: the principals, for ``/tokens`` and ``/audit``; ``instances``: sessions
    across instances, for ``/daemon/status``)."""
    return [*(admin.routes(gate, config) if gate is not None else ()),
            *health.routes(bridge, store), *capabilities.routes(bridge, config),
            *daemon.routes(bridge, config, lmsp_permissions=lmsp_permissions,
                           instances=instances, store=store),
            *sessions.routes(bridge, config), *setters.routes(bridge, config),
            *prompts.routes(bridge, config),
            *events.routes(bridge, config), *permissions.routes(bridge, config),
            *workspace.routes(bridge), *ended.routes(bridge)]
