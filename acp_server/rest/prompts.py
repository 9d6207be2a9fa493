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
from starlette.routing import Route

from acp_server.rest import wire
from acp_server.rest.errors import bad_request, error_response, json_response
from bridge import Bridge
from bridge.errors import PromptQueueFullError

PROMPT_REQUIRED = "`prompt` is required and must be a non-empty array of content blocks"


def _bridge(request: Request) -> Bridge:
    return request.app.state.bridge  # type: ignore[no-any-return]


async def send_prompt(request: Request) -> Response:
    session_id = request.path_params["session_id"]
    client_id = wire.client_id(request)
    body = await wire.read_json(request, wire.PromptBody)
    prompt = body.prompt
    if not isinstance(prompt, list) or not prompt \
            or not all(isinstance(block, dict) for block in prompt):
        raise bad_request(PROMPT_REQUIRED)
    deadline_ms = body.deadlineMs
    if deadline_ms is not None and not wire.is_positive_int(deadline_ms):
        raise bad_request("`deadlineMs` must be a positive integer (milliseconds)",
                          "invalid_deadline_ms")
    bridge = _bridge(request)
    if client_id is not None:
        bridge.check_client(session_id, client_id)
    try:
        ticket = bridge.send_prompt(session_id, prompt, deadline_ms=deadline_ms, client_id=client_id)
    except PromptQueueFullError as exc:   # the hot refusal: answered here, not re-raised
        return error_response(exc)
    return json_response(202, wire.PromptAccepted(promptId=ticket.prompt_id,
                                                   lastEventId=ticket.last_event_id,
                                                   eventEpoch=ticket.epoch))


async def pending_prompts(request: Request) -> Response:
    items = _bridge(request).pending_prompts(request.path_params["session_id"])
    return json_response(200, {"pendingPrompts": items})


async def remove_pending_prompt(request: Request) -> Response:
    wire.client_id(request)
    _bridge(request).remove_pending_prompt(request.path_params["session_id"],
                                           request.path_params["prompt_id"])
    return Response(status_code=204)


routes = [
    Route("/session/{session_id}/prompt", send_prompt, methods=["POST"]),
    Route("/session/{session_id}/pending-prompts", pending_prompts, methods=["GET"]),
    Route("/session/{session_id}/pending-prompts/{prompt_id}", remove_pending_prompt,
          methods=["DELETE"]),
]
