"""Prompt routes: non-blocking admission (202) and the pending-prompt list.

    $ curl -s -X POST localhost:4170/session/$SID/prompt \\
        -d '{"prompt":[{"type":"text","text":"hello"}]}'
    {"promptId":"fc19…","lastEventId":1,"eventEpoch":"ea03…"}      # 202
    # a full queue: 503, Retry-After: 5,
    # {"error":"Prompt queue full for session \\"…\\" (5/5 pending)","code":"prompt_queue_full",
    #  "sessionId":"…","limit":5,"pendingCount":5}

Contracts: admission is decided synchronously by ``Bridge.send_prompt`` before any
byte of the answer is written; a refused prompt takes no slot. With a durable session
journal the accepted prompt is committed before the 202 (``ticket.committed()``); a
failed commit answers 503 ``store_unavailable`` and releases the slot. Once admitted, the
prompt runs to its end whatever happens to the HTTP request (its outcome is
published on the session's event stream, not awaited here).
"""

from __future__ import annotations

import functools
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from acp_server.http.body import BodyError, decode_json
from acp_server.http.endpoints import route
from acp_server.principals import caller_of
from acp_server.rest import wire
from acp_server.rest.config import RestConfig
from acp_server.rest.errors import error_response, json_response
from acp_server.rest.owners import owned
from bridge import Bridge
from bridge.errors import (
    BridgeError,
    JournalUnavailableError,
    PromptQueueFullError,
    SessionNotRestorableError,
)


async def send_prompt(request: Request, *, bridge: Bridge, config: RestConfig) -> Response:
    session_id = request.path_params["session_id"]
    client_id = wire.client_id(request)
    body = await wire.read_json(request, wire.PromptBody, limit=config.max_body_bytes)
    try:   # the bridge checks the prompt, the deadline and the client id
        ticket = bridge.send_prompt(session_id, body.prompt, deadline_ms=body.deadlineMs,
                                    client_id=client_id)
    except PromptQueueFullError as exc:   # the hot refusal: answered here, not re-raised
        return error_response(exc)
    await ticket.committed()   # a durable journal: committed before the 202 (else 503)
    caller_of(request.scope).prompt_accepted(session_id, ticket.prompt_id, body.prompt, "rest")
    return json_response(202, wire.PromptAccepted(promptId=ticket.prompt_id,
                                                   lastEventId=ticket.last_event_id,
                                                   eventEpoch=ticket.epoch))


async def pending_prompts(request: Request, *, bridge: Bridge) -> Response:
    items = bridge.pending_prompts(request.path_params["session_id"])
    return json_response(200, wire.PendingPrompts(pendingPrompts=[
        wire.PendingPrompt(promptId=p.prompt_id, queuedAt=p.queued_at_ms, text=p.text,
                           state=p.state)  # type: ignore[arg-type]
        for p in items]))


async def remove_pending_prompt(request: Request, *, bridge: Bridge) -> Response:
    wire.client_id(request)
    bridge.remove_pending_prompt(request.path_params["session_id"],
                                 request.path_params["prompt_id"])
    return Response(status_code=204)


_PROMPT_DECODER = wire._decoders[wire.PromptBody]


_QUEUE_FULL: dict[tuple[str, int, int], tuple[int, list[tuple[bytes, bytes]], bytes]] = {}
_QUEUE_FULL_MAX = 1024


def _queue_full(exc: PromptQueueFullError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The 503 ``prompt_queue_full`` answer, encoded once per (session, limit, pending):
    a client hammering a full queue gets the same bytes each time, so the hot path
    does not build a response per refusal (at most ``_QUEUE_FULL_MAX`` kept)."""
    key = (exc.session_id, exc.limit, exc.pending_count)
    found = _QUEUE_FULL.get(key)
    if found is None:
        response = error_response(exc)
        if len(_QUEUE_FULL) >= _QUEUE_FULL_MAX:
            _QUEUE_FULL.clear()
        found = _QUEUE_FULL[key] = (response.status_code, response.raw_headers,
                                    bytes(response.body))
    return found


async def send_prompt_fast(scope: Any, body: bytes, send: Any, *, bridge: Bridge,
                           config: RestConfig) -> bool:
    """``send_prompt`` for the front layer's hot path (``acp_server.http.front``): the
    same answers, bytes for bytes, without the framework. ``False`` (nothing sent) for
    any case but a plain admission or a full queue: the caller then runs the route
    itself on the same body (a refused ``send_prompt`` has no effect to repeat)."""
    for name, _value in scope["headers"]:
        if name == b"x-qwen-client-id":
            return False   # validated by the route
    if len(body) > config.max_body_bytes or not body.strip():
        return False
    try:
        parsed = decode_json(body, _PROMPT_DECODER)
    except (BodyError, ValueError):
        return False
    session_id = scope["path_params"]["session_id"]
    caller = caller_of(scope)
    if not caller.sees_session(session_id):
        return False   # the route answers 404
    try:
        ticket = bridge.send_prompt(session_id, parsed.prompt, deadline_ms=parsed.deadlineMs)
    except PromptQueueFullError as exc:
        status, head, refusal = _queue_full(exc)
        await send({"type": "http.response.start", "status": status, "headers": list(head)})
        await send({"type": "http.response.body", "body": refusal})
        return True
    except BridgeError:
        return False
    else:
        try:
            await ticket.committed()
        except (JournalUnavailableError, SessionNotRestorableError) as exc:   # settled:
            response = error_response(exc)                                    # 503 / 409
        else:
            caller.prompt_accepted(session_id, ticket.prompt_id, parsed.prompt, "rest")
            response = json_response(202, wire.PromptAccepted(
                promptId=ticket.prompt_id, lastEventId=ticket.last_event_id,
                eventEpoch=ticket.epoch))
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})
    return True


def fast_routes(bridge: Bridge, config: RestConfig) -> dict[str, Any]:
    """The front layer's fast handlers of this door, by route path (``acp_server.app``)."""
    return {"/session/{session_id}/prompt":
            functools.partial(send_prompt_fast, bridge=bridge, config=config)}


def routes(bridge: Bridge, config: RestConfig) -> list[BaseRoute]:
    return [
        route("/session/{session_id}/prompt", owned(send_prompt), ["POST"], bridge=bridge,
              config=config),
        route("/session/{session_id}/pending-prompts", owned(pending_prompts), ["GET"],
              bridge=bridge),
        route("/session/{session_id}/pending-prompts/{prompt_id}",
              owned(remove_pending_prompt), ["DELETE"], bridge=bridge),
    ]
