"""Prompt routes: non-blocking admission (202) and the pending-prompt list.

    $ curl -s -X POST localhost:4170/session/$SID/prompt \\
        -d '{"prompt":[{"type":"text","text":"hello"}]}'
    {"promptId":"fc19…","lastEventId":1,"eventEpoch":"ea03…"}      # 202
    # a full queue: 503, Retry-After: 5,
    # {"error":"Prompt queue full for session \\"…\\" (5/5 pending)","code":"prompt_queue_full",
    #  "sessionId":"…","limit":5,"pendingCount":5}

Contracts: admission is decided synchronously by ``Bridge.send_prompt`` before any
byte of the answer is written; a refused prompt takes no slot. Once admitted, the
prompt runs to its end whatever happens to the HTTP request (its outcome is
published on the session's event stream, not awaited here).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from acp_server.http.endpoints import route
from acp_server.rest import wire
from acp_server.rest.config import RestConfig
from acp_server.rest.errors import error_response, json_response
from bridge import Bridge
from bridge.errors import PromptQueueFullError


async def send_prompt(request: Request, *, bridge: Bridge, config: RestConfig) -> Response:
    session_id = request.path_params["session_id"]
    client_id = wire.client_id(request)
    body = await wire.read_json(request, wire.PromptBody, limit=config.max_body_bytes)
    try:   # the bridge checks the prompt, the deadline and the client id
        ticket = bridge.send_prompt(session_id, body.prompt, deadline_ms=body.deadlineMs,
                                    client_id=client_id)
    except PromptQueueFullError as exc:   # the hot refusal: answered here, not re-raised
        return error_response(exc)
    return json_response(202, wire.PromptAccepted(promptId=ticket.prompt_id,
                                                   lastEventId=ticket.last_event_id,
                                                   eventEpoch=ticket.epoch))


async def pending_prompts(request: Request, *, bridge: Bridge) -> Response:
    items = bridge.pending_prompts(request.path_params["session_id"])
    return json_response(200, {"pendingPrompts": [
        {"promptId": p.prompt_id, "queuedAt": p.queued_at_ms, "text": p.text, "state": p.state}
        for p in items]})


async def remove_pending_prompt(request: Request, *, bridge: Bridge) -> Response:
    wire.client_id(request)
    bridge.remove_pending_prompt(request.path_params["session_id"],
                                 request.path_params["prompt_id"])
    return Response(status_code=204)


def routes(bridge: Bridge, config: RestConfig) -> list[BaseRoute]:
    return [
        route("/session/{session_id}/prompt", send_prompt, ["POST"], bridge=bridge,
              config=config),
        route("/session/{session_id}/pending-prompts", pending_prompts, ["GET"], bridge=bridge),
        route("/session/{session_id}/pending-prompts/{prompt_id}", remove_pending_prompt,
              ["DELETE"], bridge=bridge),
    ]
