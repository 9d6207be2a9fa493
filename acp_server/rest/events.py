"""``GET /session/{id}/events``: the session's event stream (SSE), with replay.

    $ curl -N localhost:4170/session/$SID/events -H 'Last-Event-ID: 1' \\
        -H "X-Qwen-Event-Epoch: $EPOCH"
    retry: 3000

    id: 2
    event: pending_prompt_started
    data: {"id":2,"v":1,"type":"pending_prompt_started",...}

Contracts: a malformed ``Last-Event-ID`` or ``X-Qwen-Event-Epoch`` is ignored (as
the peer does), and so is ``X-Qwen-Client-Id``, malformed or not issued for the session
(the peer reads it as a diagnostic hint and never refuses a stream for it: its SDK does
not attach again on a refused stream, as it does for a refused prompt);
``maxQueued`` outside [16, 2048] is 400 ``invalid_max_queued``;
past the per-session subscriber cap the answer is 429 with ``Retry-After: 5``; an
unknown session is 404 before any stream starts.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import BaseRoute
from starlette.types import ASGIApp

from acp_server.http.headers import event_epoch, last_event_id
from acp_server.http.endpoints import route
from acp_server.rest import wire
from acp_server.rest.config import RestConfig
from acp_server.rest.owners import owned
from acp_server.rest.sse import EventStreamResponse
from bridge import Bridge


async def session_events(request: Request, *, bridge: Bridge, config: RestConfig) -> ASGIApp:
    session_id = request.path_params["session_id"]
    max_queued = wire.max_queued(request)
    subscription = bridge.subscribe(session_id, last_event_id=last_event_id(request),
                                    epoch=event_epoch(request), max_queued=max_queued)
    return EventStreamResponse(subscription, epoch=subscription.epoch,
                               heartbeat_s=config.heartbeat_s)


def routes(bridge: Bridge, config: RestConfig) -> list[BaseRoute]:
    return [route("/session/{session_id}/events", owned(session_events), ["GET"], bridge=bridge,
                  config=config)]
