"""The REST + SSE front door (``qwen serve`` 0.24.4 core session surface).

    from acp_server.rest import routes
    from acp_server.rest.errors import EXCEPTION_HANDLERS
    app = Starlette(routes=routes(), exception_handlers=EXCEPTION_HANDLERS)

Each module holds one noun's routes; every endpoint reads the ``Bridge`` and its
``RestConfig`` from ``request.app.state`` (``bridge``, ``rest_config``; set by
``acp_server.app.build_app``). ``errors.EXCEPTION_HANDLERS`` answers the door's errors.
"""

from __future__ import annotations

from starlette.routing import BaseRoute

from acp_server.rest import (
    capabilities,
    daemon,
    events,
    health,
    permissions,
    prompts,
    sessions,
    workspace,
)


def routes() -> list[BaseRoute]:
    return [*health.routes, *capabilities.routes, *daemon.routes, *sessions.routes,
            *prompts.routes, *events.routes, *permissions.routes, *workspace.routes]
