"""``GET /capabilities``: what this daemon offers, in the peer's envelope.

    $ curl -s localhost:4170/capabilities
    {"v":1,"protocolVersions":{"current":"v1","supported":["v1"]},"mode":"http-bridge",
     "features":["health",...],"workspaceCwd":"/abs/ws","transports":["rest","acp-http","acp-ws"],
     "policy":{"permission":"first-responder"},"limits":{"maxPendingPromptsPerSession":5,...}}

``features`` lists only tags whose behaviour is implemented here (clients gate on
them); ``limits.maxPendingPromptsPerSession`` is ``null`` when the cap is disabled.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from acp_server import __version__
from acp_server.http.endpoints import route
from acp_server.rest import wire
from acp_server.rest.config import RestConfig
from acp_server.rest.errors import json_response
from acp_server.rest.workspace import workspaces
from bridge import Bridge
from bridge.agent_calls import LISTING_WAIT_S

FEATURES = (
    "health", "capabilities", "daemon_status",
    "session_create", "session_id_override", "session_scope_override",
    "session_load", "session_resume", "unstable_session_resume",
    "session_prompt", "non_blocking_prompt", "session_cancel", "session_events",
    "slow_client_warning", "typed_event_schema", "client_identity", "client_heartbeat",
    "session_permission_vote", "permission_vote", "permission_mediation",
    "session_close", "session_branch", "session_status", "session_pending_prompts",
    "session_approval_mode_control", "session_set_model",   # rest.setters
    "agent_profiles",
    "prompt_id_replay",   # ours: a prompt sent again under its promptId runs once
)


def features(config: RestConfig) -> list[str]:
    tags = list(FEATURES)
    if config.require_auth:
        tags.append("require_auth")
    if config.allow_origins:
        tags.append("allow_origin")
    if config.prompt_deadline_ms is not None:
        tags.append("prompt_absolute_deadline")
    return tags


def limits(bridge: Bridge) -> wire.RestLimits:
    options = bridge.options
    return wire.RestLimits(maxPendingPromptsPerSession=options.pending_prompt_limit,
                           maxSessionsPerWorkspace=options.session_limit,
                           sessionRestoreTimeoutMs=options.restore_timeout_ms)


# What this server serves, under the names @qwen-code/sdk's negotiateTransport() looks
# for: REST + SSE, /acp over Streamable HTTP, /acp over WebSocket.
TRANSPORTS = ["rest", "acp-http", "acp-ws"]


def agents(bridge: Bridge) -> wire.AgentsInfo:
    configured = bridge.list_agents()
    return wire.AgentsInfo(default=next(a.name for a in configured if a.default),
                           available=[a.name for a in configured])


def capabilities_body(bridge: Bridge, config: RestConfig) -> wire.RestCapabilities:
    return wire.RestCapabilities(
        v=1, protocolVersions={"current": "v1", "supported": ["v1"]},
        acpServerVersion=__version__, mode="http-bridge",
        features=features(config), workspaceCwd=bridge.workspace_cwd,
        transports=TRANSPORTS, policy={"permission": "first-responder"},
        limits=limits(bridge), agents=agents(bridge), workspaces=workspaces(bridge))


async def capabilities(request: Request, *, bridge: Bridge, config: RestConfig) -> Response:
    await bridge.refresh_agents(wait_s=LISTING_WAIT_S)   # models listed since (if due)
    return json_response(200, capabilities_body(bridge, config))


def routes(bridge: Bridge, config: RestConfig) -> list[BaseRoute]:
    return [route("/capabilities", capabilities, ["GET"], bridge=bridge, config=config)]
