"""The REST reads of a session another instance runs, served here from the journal
(issue #24, ``acp_server.fleet.replica``).

    reads = JournalReads(replicas, config)
    if reads.serves(scope):              # GET status / events / pending-prompts, POST load
        await reads(scope, receive, send)   # else the request goes to the owner

Contracts: the answers have the shapes of the routes they stand for
(``rest.sessions``, ``rest.events``, ``rest.prompts``), the same errors in the door's
shape (404 ``session_not_found`` for an unknown or closed session, or one another
principal made; 503 ``store_unavailable`` with ``Retry-After`` when the store cannot
answer). ``/load`` takes nothing over: it answers the history, the prompt terminals and
``lastEventId`` from the journal (``attached: true``; ``state`` empty: the agent's is
not journaled). The event stream validates ``X-Qwen-Client-Id`` as a token but does
not check that the owner issued it.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Router

from acp_server.fleet.replica import JournalReplicas
from acp_server.http.endpoints import route
from acp_server.http.headers import event_epoch, last_event_id
from acp_server.principals import caller_of
from acp_server.rest import wire
from acp_server.rest.config import RestConfig
from acp_server.rest.errors import error_response, json_response
from acp_server.rest.owners import check_restore, visible_session
from acp_server.rest.sessions import restored, status_fields
from acp_server.rest.sse import EventStreamResponse

READS = frozenset({("GET", "status"), ("GET", "events"), ("GET", "pending-prompts"),
                   ("POST", "load")})


async def replica_status(request: Request, *, replicas: JournalReplicas) -> Response:
    view = await replicas.view(request.path_params["session_id"], ring=False)
    visible_session(request)
    return json_response(200, wire.SessionStatus(**status_fields(view.status())))


async def replica_pending(request: Request, *, replicas: JournalReplicas) -> Response:
    view = await replicas.view(request.path_params["session_id"], ring=False)
    visible_session(request)
    return json_response(200, wire.PendingPrompts(pendingPrompts=[
        wire.PendingPrompt(promptId=p.prompt_id, queuedAt=p.queued_at_ms, text=p.text,
                           state=p.state)  # type: ignore[arg-type]
        for p in view.pending()]))


async def replica_load(request: Request, *, replicas: JournalReplicas,
                       config: RestConfig) -> Response:
    wire.client_id(request)
    session_id = request.path_params["session_id"]
    body = await wire.read_json(request, wire.RestoreBody, limit=config.max_body_bytes)
    replicas.bridge.check_workspace(body.cwd)
    wire.check_approval_mode(body.approvalMode)
    view = await replicas.view(session_id)
    # live on its owner (``view`` raised for a closed one): decided as the owner would,
    # so a session no principal owns (the LMSP runner's) is 404 here too
    check_restore(caller_of(request.scope), session_id, live=True,
                  request=f"POST {request.scope['path']}")
    with config.large_answers.taken(0) as held:
        return held.response(msgspec.json.encode(restored(view.load_info())), 200)


async def replica_events(request: Request, *, replicas: JournalReplicas,
                         config: RestConfig) -> Any:
    max_queued = wire.max_queued(request)   # X-Qwen-Client-Id: ignored, as on the owner
    view = await replicas.view(request.path_params["session_id"])
    visible_session(request)
    subscription = replicas.subscribe(view, last_event_id=last_event_id(request),
                                      epoch=event_epoch(request), max_queued=max_queued)
    return EventStreamResponse(subscription, epoch=subscription.epoch,
                               heartbeat_s=config.heartbeat_s)


def _answered(endpoint: Any) -> Any:
    """Errors in the door's shape (this app has no exception handlers of its own)."""
    async def answer(request: Request, **deps: Any) -> Any:
        try:
            return await endpoint(request, **deps)
        except Exception as exc:   # noqa: BLE001 - rendered as the door renders it
            return error_response(exc)

    answer.__name__ = endpoint.__name__
    return answer


class JournalReads:
    """See the module docstring (an ASGI app)."""

    def __init__(self, replicas: JournalReplicas, config: RestConfig) -> None:
        self.replicas = replicas
        deps = {"replicas": replicas}
        self.router = Router(routes=[
            route("/session/{session_id}/status", _answered(replica_status), ["GET"], **deps),
            route("/session/{session_id}/pending-prompts", _answered(replica_pending),
                  ["GET"], **deps),
            route("/session/{session_id}/events", _answered(replica_events), ["GET"],
                  config=config, **deps),
            route("/session/{session_id}/load", _answered(replica_load), ["POST"],
                  config=config, **deps)])

    @staticmethod
    def serves(scope: Any) -> bool:
        """A read of a session (``/session/{id}/<read>``) this app answers."""
        parts = scope["path"].split("/")
        return len(parts) == 4 and (scope["method"], parts[3]) in READS

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.router(scope, receive, send)
