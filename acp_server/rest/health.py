"""``GET /health``: liveness, and ``?deep=1`` aggregates from the bridge.

    $ curl -s localhost:4170/health           # {"status":"ok"}
    $ curl -s 'localhost:4170/health?deep=1'  # {"status":"ok","sessions":1,"activePrompts":0,...}

Open without a token on a loopback bind unless ``--require-auth`` (see ``security``).
The deep check also asks the durable store (``store``, when composed; see
``acp_server.store``): while it cannot serve, the answer is 503 with
``"status": "unavailable"`` and ``store: {status: "down", reason, downSince}``
(``downSince`` an ISO 8601 UTC time, as every time the REST door writes). With a
durable session journal, ``journal: {recordsRefused, lastRefused?}``: the records the
store refused for good (a constraint, a trigger; ``acp_server.store.session_refusals``);
the process serves on, so they do not change the status.
"""

from __future__ import annotations

import time

import msgspec

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from acp_server.http.endpoints import route
from acp_server.rest import wire
from acp_server.rest.errors import json_response
from acp_server.store.errors import Probed
from bridge import Bridge

_OK = b'{"status":"ok"}'


async def health(request: Request, *, bridge: Bridge, store: Probed | None) -> Response:
    if request.query_params.get("deep") not in ("1", "true"):
        return Response(_OK, 200, media_type="application/json")
    stats = bridge.stats()
    down = await store.probe() if store is not None else None
    report: wire.StoreReport | msgspec.UnsetType = msgspec.UNSET
    if store is not None:
        since = store.health.down_since
        report = wire.StoreReport("ok") if down is None else wire.StoreReport(
            "down", reason=down,
            downSince=msgspec.UNSET if since is None else wire.iso(since))
    return json_response(200 if down is None else 503, wire.Health(
        status="ok" if down is None else "unavailable", store=report,
        journal=_journal(bridge),
        workspaceCount=1, sessions=stats.sessions,
        pendingPermissions=stats.pending_permissions,
        activePrompts=stats.active_prompts, pendingPrompts=stats.pending_prompts,
        queuedPrompts=stats.queued_prompts, connectedClients=stats.subscribers,
        uptimeMs=int((time.time() - bridge.started_at) * 1000)))


def _journal(bridge: Bridge) -> wire.JournalHealth | msgspec.UnsetType:
    """The durable journal's refused records (``acp_server.store.session_refusals``)."""
    refusals = getattr(bridge.journal, "refusals", None)
    if refusals is None:
        return msgspec.UNSET
    last = refusals.last
    return wire.JournalHealth(recordsRefused=refusals.total,
                              lastRefused=msgspec.UNSET if last is None
                              else wire.JournalRefusal(**last))


def routes(bridge: Bridge, store: Probed | None = None) -> list[BaseRoute]:
    return [route("/health", health, ["GET"], bridge=bridge, store=store)]
