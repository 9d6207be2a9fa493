"""Permission votes: first responder wins.

    $ curl -s -X POST localhost:4170/session/$SID/permission/$REQ \\
        -d '{"outcome":{"outcome":"selected","optionId":"allow_once"}}'     # 200 {}
    # again: 404 {"error":"No pending permission request for session",...}

``POST /permission/{requestId}`` is the legacy route (no session in the path). A
request of a session the caller does not see is 404 on both (``rest.owners``).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from acp_server.http.endpoints import route
from acp_server.principals import caller_of
from acp_server.rest import wire
from acp_server.rest.config import RestConfig
from acp_server.rest.errors import bad_request
from acp_server.rest.owners import owned
from bridge import Bridge
from bridge.errors import PermissionNotFoundError

OUTCOME_REQUIRED = ('`outcome` must be `{ outcome: "cancelled" }` or '
                    '`{ outcome: "selected", optionId: string }`')
_EMPTY = b"{}"


def parse_outcome(body: wire.PermissionVoteBody) -> dict[str, Any]:
    outcome = body.outcome
    if isinstance(outcome, dict):
        kind = outcome.get("outcome")
        if kind == "cancelled":
            return {"outcome": "cancelled"}
        option_id = outcome.get("optionId")
        if kind == "selected" and isinstance(option_id, str) and option_id:
            return {"outcome": "selected", "optionId": option_id}
    raise bad_request(OUTCOME_REQUIRED)


async def _vote(request: Request, session_id: str | None, bridge: Bridge,
                config: RestConfig) -> Response:
    client_id = wire.client_id(request)
    outcome = parse_outcome(await wire.read_json(request, wire.PermissionVoteBody,
                                                 limit=config.max_body_bytes))
    request_id = request.path_params["request_id"]
    caller = caller_of(request.scope)
    if session_id is None:   # the legacy route: the request's own session, if visible
        session_id = bridge.permission_session(request_id)
        if session_id is None or not caller.sees_session(session_id):
            raise PermissionNotFoundError(request_id, None)
    if session_id is not None and client_id is not None:
        bridge.check_client(session_id, client_id)
    bridge.respond_to_permission(request_id, outcome, session_id=session_id,
                                 voter_client_id=client_id)
    caller.permission_answered(session_id, request_id, outcome, "rest")
    return Response(_EMPTY, 200, media_type="application/json")


async def session_vote(request: Request, *, bridge: Bridge, config: RestConfig) -> Response:
    return await _vote(request, request.path_params["session_id"], bridge, config)


async def legacy_vote(request: Request, *, bridge: Bridge, config: RestConfig) -> Response:
    return await _vote(request, None, bridge, config)


def routes(bridge: Bridge, config: RestConfig) -> list[BaseRoute]:
    return [
        route("/session/{session_id}/permission/{request_id}", owned(session_vote), ["POST"],
              bridge=bridge, config=config),
        route("/permission/{request_id}", legacy_vote, ["POST"], bridge=bridge, config=config),
    ]
