"""``GET /daemon/status``: limits in force and runtime activity.

    $ curl -s localhost:4170/daemon/status
    {"v":1,"status":"ok","limits":{...},"runtime":{"activity":{"activePrompts":1,
     "pendingPrompts":7,"queuedPrompts":6},"perf":{"promptQueueWait":{"count":..}}},...}

``?detail=full`` adds ``full.sessions`` (this instance's live sessions the caller sees,
in the peer's ``DaemonStatusReportSession`` shape); ``detail`` other than ``summary``
or ``full`` is 400 ``invalid_detail``, as the peer answers.

``status`` is ``"ok"`` with no ``issues``, or ``"degraded"`` while the store is down
as it last answered (no store call here: the answer never waits on an outage;
``/health?deep=1`` asks it): ``issues`` then holds ``{"code": "store_unavailable",
"message", "since"}``. The answer stays 200 (a report, not a probe).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from acp_server import __version__
from acp_server.http.endpoints import route
from acp_server.rest.capabilities import features
from acp_server.rest import wire
from acp_server.rest.config import RestConfig
from acp_server.principals import caller_of
from acp_server.rest.errors import bad_request, json_response
from acp_server.store.errors import Probed
from bridge import Bridge, SessionStatus
from bridge.agent_calls import LISTING_WAIT_S
from bridge.status import QueueWait

# How LMSP work's permission requests were answered: (policy, decisions by outcome).
# Handed over by the composition when LMSP runs (the REST door imports no other door).
PermissionReport = Callable[[], tuple[str, dict[str, int]]]
# Sessions across instances (acp_server.fleet.Fleet.report), when the store is shared.
InstancesReport = Callable[[], dict[str, Any]]


def queue_wait(wait: QueueWait) -> dict[str, Any]:
    return {"count": wait.count, "meanMs": wait.mean_ms, "maxMs": wait.max_ms,
            "lastMs": wait.last_ms}


def status_body(bridge: Bridge, config: RestConfig) -> wire.DaemonStatus:
    options = bridge.options
    stats = bridge.stats()
    now = time.time()
    return wire.DaemonStatus(
        v=1, detail="summary", generatedAt=wire.iso(now), status="ok", issues=[],
        daemon={"pid": os.getpid(), "uptimeMs": int((now - bridge.started_at) * 1000),
                "mode": "http-bridge", "workspaceCwd": bridge.workspace_cwd,
                "acpServerVersion": __version__, "agent": config.agent_name},
        security={"tokenConfigured": config.token_configured,
                  "requireAuth": config.require_auth, "loopbackBind": config.loopback_bind,
                  "allowOriginConfigured": bool(config.allow_origins)},
        limits={
            "maxSessions": options.session_limit,
            "maxPendingPromptsPerSession": options.pending_prompt_limit,
            "eventRingSize": options.event_ring_size,
            "promptDeadlineMs": options.prompt_deadline_ms,
            "sessionIdleTimeoutMs": options.session_idle_timeout_ms,
            "sessionReapIntervalMs": options.session_reap_interval_ms,
            "permissionResponseTimeoutMs": options.permission_response_timeout_ms,
            "initializeTimeoutMs": options.initialize_timeout_ms,
            "agentRequestTimeoutMs": options.agent_request_timeout_ms,
            "maxSubscribersPerSession": options.max_subscribers_per_session,
            "subscriberMaxQueued": options.subscriber_max_queued,
            "subscriberMaxQueuedBytes": options.subscriber_max_queued_bytes,
            "maxRequestBodyBytes": config.max_body_bytes,
            "maxPromptBlocks": options.max_prompt_blocks,
            "headerTimeoutMs": config.header_timeout_ms,
            "maxConnections": config.max_connections,
        },
        agents=agents(bridge),
        capabilities={"features": features(config)},
        runtime={
            "sessions": {"active": stats.sessions,
                         "admissionInFlight": stats.admission_in_flight},
            "agents": {"foreignMessagesDropped": stats.foreign_messages_dropped},
            "permissions": {"pending": stats.pending_permissions,
                            "policy": "first-responder"},
            "transport": {"restSseActive": stats.subscribers},
            "perf": {"promptQueueWait": queue_wait(stats.prompt_queue_wait)},
            "activity": {"activePrompts": stats.active_prompts,
                         "pendingPrompts": stats.pending_prompts,
                         "queuedPrompts": stats.queued_prompts},
        },
    )


def agents(bridge: Bridge) -> list[wire.AgentStatus]:
    """Each agent: its state, how many live sessions run on it, what it said it is."""
    out = []
    for agent in bridge.list_agents():
        info = agent.info.get("agentInfo")
        out.append(wire.AgentStatus(name=agent.name, default=agent.default,
                                    state=agent.state,  # type: ignore[arg-type]
                                    sessions=agent.sessions,
                                    agentInfo=info if isinstance(info, dict) else None))
    return out


def full_session(status: SessionStatus) -> dict[str, Any]:
    """One session of ``?detail=full``, as the peer reports it (``attachCount``: the
    clients attached, each attach being one)."""
    return {"sessionId": status.session_id, "workspaceCwd": status.workspace_cwd,
            "createdAt": wire.iso(status.created_at), "clientCount": status.client_count,
            "subscriberCount": status.subscribers, "attachCount": status.client_count,
            "pendingPromptCount": status.pending_prompts,
            "pendingPermissionCount": status.pending_permissions,
            "hasActivePrompt": status.has_active_prompt,
            "lastEventId": status.last_event_id, "agent": status.agent}


async def daemon_status(request: Request, *, bridge: Bridge, config: RestConfig,
                        lmsp_permissions: PermissionReport | None,
                        instances: InstancesReport | None = None,
                        store: Probed | None = None) -> Response:
    detail = request.query_params.get("detail", "summary")
    if detail not in ("summary", "full"):
        raise bad_request("detail must be one of: summary, full", "invalid_detail")
    await bridge.refresh_agents(wait_s=LISTING_WAIT_S)   # models listed since (if due)
    body = status_body(bridge, config)
    if store is not None and not store.health.up:   # as it last answered: no store call
        since = store.health.down_since
        body.status = "degraded"
        body.issues.append({"code": "store_unavailable",
                            "message": f"The store is unavailable: {store.health.reason}",
                            "since": wire.iso(since) if since is not None else None})
    if detail == "full":
        caller = caller_of(request.scope)
        body.detail = "full"
        body.full = {"sessions": [full_session(s) for s in bridge.list_sessions()
                                  if caller.sees_session(s.session_id)]}
    # The guards' counters (acp_server/http/guard.py, the front layer), one per server.
    guard = config.guard_stats
    body.runtime["transport"]["connectionsRefused"] = guard["connections"] if guard else 0
    body.runtime["transport"]["headerTimeouts"] = guard["header_timeouts"] if guard else 0
    if lmsp_permissions is not None:   # answered by --lmsp-permissions, per decision
        policy, decisions = lmsp_permissions()
        body.runtime["permissions"]["lmspPolicy"] = policy
        body.runtime["permissions"]["lmspDecisions"] = decisions
    if instances is not None:   # the instance id, sessions owned, take-overs, forwards
        body.runtime["instances"] = instances()
    return json_response(200, body)


def routes(bridge: Bridge, config: RestConfig, *,
           lmsp_permissions: PermissionReport | None = None,
           instances: InstancesReport | None = None,
           store: Probed | None = None) -> list[BaseRoute]:
    return [route("/daemon/status", daemon_status, ["GET"], bridge=bridge, config=config,
                  lmsp_permissions=lmsp_permissions, instances=instances, store=store)]
