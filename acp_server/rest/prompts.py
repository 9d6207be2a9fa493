"""Prompt routes: non-blocking admission (202) and the pending-prompt list.

    $ curl -s -X POST localhost:4170/session/$SID/prompt \\
        -d '{"prompt":[{"type":"text","text":"hello"}]}'
    {"promptId":"fc19…","lastEventId":1,"eventEpoch":"ea03…"}      # 202
    # a full queue: 503, Retry-After: 5,
    # {"error":"Prompt queue full for session \\"…\\" (5/5 pending)","code":"prompt_queue_full",
    #  "sessionId":"…","limit":5,"pendingCount":5}

Contracts: admission is decided synchronously by ``Bridge.send_prompt`` before any
byte of the answer is written; a refused prompt takes no slot. A body may name the
prompt (``"promptId"``, a token of 1 to 128 characters): sent again under the same id
(its answer was lost), the prompt is not admitted twice: the session answers 202 as
before while it is pending, 200 with its ``PromptTerminal`` once it has ended (both
``Idempotent-Replayed: true``); an id the session has forgotten (past its last 256
ended prompts), or whose prompt was refused at admission (it never ran), is admitted
anew. With a durable session
journal the accepted prompt is committed before the 202 (``ticket.committed()``); a
failed commit answers 503 ``store_unavailable`` and releases the slot. Once admitted, the
prompt runs to its end whatever happens to the HTTP request (its outcome is
published on the session's event stream, not awaited here).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from acp_server.http.body import BodyError, decode_json
from acp_server.http.endpoints import route
from acp_server.principals import CALLER_KEY, LOCAL_CALLER, Caller, caller_of
from acp_server.rest import wire
from acp_server.rest.config import RestConfig
from acp_server.rest.errors import RestError, encode_body, error_response, json_response
from acp_server.rest.owners import owned
from bridge import Bridge
from bridge.errors import (
    BridgeError,
    JournalUnavailableError,
    PromptNotFoundError,
    PromptQueueFullError,
    SessionClosedError,
    SessionNotRestorableError,
)


async def send_prompt(request: Request, *, bridge: Bridge, config: RestConfig) -> Response:
    session_id = request.path_params["session_id"]
    client_id = wire.client_id(request)
    body = await wire.read_json(request, wire.PromptBody, limit=config.max_body_bytes)
    prompt_id = wire.prompt_id(body.promptId)
    if prompt_id is not None:
        bridge.check_prompt(body.prompt, body.deadlineMs)   # the same 400s either way
        ended = bridge.ended_prompt_terminal(session_id, prompt_id)
        if ended is not None:   # its session closed since (its agent died as it ran)
            return json_response(200, wire.PromptTerminal.of(ended), REPLAYED)
        bridge.check_client(session_id, client_id)
        known = await _known_prompt(bridge, session_id, prompt_id)
        if known is not None:
            return known
    try:   # the bridge checks the prompt, the deadline and the client id
        ticket = bridge.send_prompt(session_id, body.prompt, prompt_id=prompt_id,
                                    deadline_ms=body.deadlineMs, client_id=client_id)
    except PromptQueueFullError as exc:   # the hot refusal: answered here, not re-raised
        return error_response(exc)
    await ticket.committed()   # a durable journal: committed before the 202 (else 503)
    caller_of(request.scope).prompt_accepted(session_id, ticket.prompt_id, body.prompt, "rest")
    return json_response(202, wire.PromptAccepted(promptId=ticket.prompt_id,
                                                   lastEventId=ticket.last_event_id,
                                                   eventEpoch=ticket.epoch))


REPLAYED = {"Idempotent-Replayed": "true"}


async def _known_prompt(bridge: Bridge, session_id: str, prompt_id: str) -> Response | None:
    """A prompt sent again under its id (after a lost answer): still pending → the
    same 202 as its admission (once it is committed); ended → 200 with how it ended
    (``PromptTerminal``); both with ``Idempotent-Replayed: true``. ``None``: the
    session does not know the id (admit it). Read synchronously, with no await
    between the lookups and the caller's admission."""
    ticket = bridge.prompt_ticket(session_id, prompt_id)
    if ticket is not None:
        await ticket.committed()   # as the first answer: nothing acknowledged uncommitted
        return json_response(202, wire.PromptAccepted(
            promptId=prompt_id, lastEventId=ticket.last_event_id, eventEpoch=ticket.epoch),
            REPLAYED)
    terminal = bridge.prompt_terminal(session_id, prompt_id)
    if terminal is None:
        return None
    return json_response(200, wire.PromptTerminal.of(terminal), REPLAYED)


async def pending_prompts(request: Request, *, bridge: Bridge) -> Response:
    items = bridge.pending_prompts(request.path_params["session_id"])
    return json_response(200, wire.PendingPrompts(pendingPrompts=[
        wire.PendingPrompt(promptId=p.prompt_id, queuedAt=p.queued_at_ms, text=p.text,
                           state=p.state)  # type: ignore[arg-type]
        for p in items]))


async def remove_pending_prompt(request: Request, *, bridge: Bridge) -> Response:
    """200 ``{"removed": true}`` (a queued prompt dropped, or the running one
    cancelled), ``{"removed": false}`` when the session has no such pending prompt
    (ended, never admitted): as the peer answers, and what ``@qwen-code/sdk``'s
    ``removePendingPrompt`` reads. An unknown session is 404 ``session_not_found``."""
    wire.client_id(request)
    session_id, prompt_id = request.path_params["session_id"], request.path_params["prompt_id"]
    try:
        bridge.remove_pending_prompt(session_id, prompt_id)
    except PromptNotFoundError:
        return json_response(200, wire.PendingPromptRemoved(removed=False))
    caller_of(request.scope).record("prompt.removed", session_id, prompt_id=prompt_id)
    return json_response(200, wire.PendingPromptRemoved(removed=True))


_PROMPT_DECODER = wire._decoders[wire.PromptBody]


Answer = tuple[dict[str, Any], dict[str, Any]]   # (http.response.start, http.response.body)
_QUEUE_FULL: dict[tuple[str, int, int], Answer] = {}
_QUEUE_FULL_MAX = 1024


def _queue_full(exc: PromptQueueFullError) -> Answer:
    """The 503 ``prompt_queue_full`` answer, its two ASGI messages built once per
    (session, limit, pending): a client hammering a full queue gets the same messages
    each time (the front layer sends them unchanged), so the hot path builds no
    response per refusal (at most ``_QUEUE_FULL_MAX`` kept)."""
    key = (exc.session_id, exc.limit, exc.pending_count)
    found = _QUEUE_FULL.get(key)
    if found is None:
        if len(_QUEUE_FULL) >= _QUEUE_FULL_MAX:
            _QUEUE_FULL.clear()
        found = _QUEUE_FULL[key] = _messages(error_response(exc))
    return found


def _messages(response: Response) -> Answer:
    return ({"type": "http.response.start", "status": response.status_code,
             "headers": response.raw_headers},
            {"type": "http.response.body", "body": bytes(response.body)})


class FastPrompt:
    """``send_prompt`` for the front layer's hot path (``acp_server.http.front``): the
    same answers, bytes for bytes, without the framework, as two ASGI messages.
    ``None`` (nothing done) for any case but a plain admission or a full queue: the
    caller then runs the route itself on the same body (a refused ``send_prompt`` has
    no effect to repeat). A request with ``X-Qwen-Client-Id`` never comes here
    (``FAST_DECLINES``: the route validates it). A class, not a ``functools.partial``:
    a partial with keywords builds a dict per call."""

    __slots__ = ("bridge", "max_body_bytes")

    def __init__(self, bridge: Bridge, config: RestConfig) -> None:
        self.bridge = bridge
        self.max_body_bytes = config.max_body_bytes

    async def __call__(self, scope: Any, body: bytes) -> Answer | None:
        if len(body) > self.max_body_bytes or not body or body.isspace():
            return None
        try:
            parsed = decode_json(body, _PROMPT_DECODER)
        except (BodyError, ValueError):
            return None
        session_id = scope["path_params"]["session_id"]
        caller = scope.get(CALLER_KEY) or LOCAL_CALLER   # caller_of, inline
        if not caller.sees_session(session_id):
            return None   # the route answers 404
        prompt_id = parsed.promptId
        if prompt_id is not None:   # as the route does; its errors are the route's
            try:
                prompt_id = wire.prompt_id(prompt_id)
            except RestError:
                return None
            try:
                self.bridge.check_prompt(parsed.prompt, parsed.deadlineMs)
                known = await _known_prompt(self.bridge, session_id, prompt_id)
            except SETTLED as exc:   # the prompt's admission failed: answered here
                return _messages(error_response(exc))
            except BridgeError:   # raised before any await: nothing done
                return None
            if known is not None:
                return _messages(known)
        try:
            ticket = self.bridge.send_prompt(session_id, parsed.prompt, prompt_id=prompt_id,
                                             deadline_ms=parsed.deadlineMs)
        except PromptQueueFullError as exc:
            return _queue_full(exc)
        except BridgeError:
            return None
        try:
            await ticket.committed()
        except SETTLED as exc:   # settled: 503 / 409 / 404, answered here
            return _messages(error_response(exc))
        caller.prompt_accepted(session_id, ticket.prompt_id, parsed.prompt, "rest")
        return accepted_messages(wire.PromptAccepted(
            promptId=ticket.prompt_id, lastEventId=ticket.last_event_id,
            eventEpoch=ticket.epoch))


def accepted_messages(body: wire.PromptAccepted) -> Answer:
    """``_messages(json_response(202, body))`` without building a ``Response``: the same
    two messages (its headers in its order), at a third of the cost per prompt."""
    raw = encode_body(body)
    return ({"type": "http.response.start", "status": 202,
             "headers": [(b"content-length", str(len(raw)).encode()),
                         (b"content-type", b"application/json")]},
            {"type": "http.response.body", "body": raw})


class PromptSentAgain:
    """The REST door's ``resent`` (``acp_server.http.resent``): a ``POST
    /session/{id}/prompt`` refused for its rate goes on when its body names a
    ``promptId`` the session admitted already (queued, running or ended; ended in a
    session no longer live too) and the caller sees the session: the route answers its
    replay (202 / 200, ``Idempotent-Replayed``), which admits nothing new. The SDK
    sends its prompt again under its id after a cut or an ``owner_lost``; refused, it
    was told "rate limit exceeded" of a prompt its agent ran."""

    __slots__ = ("bridge", "limit")

    def __init__(self, bridge: Bridge, config: RestConfig) -> None:
        self.bridge = bridge
        self.limit = config.max_body_bytes

    def wants(self, method: str, path: str) -> bool:
        return method == "POST" and path.startswith("/session/") \
            and path.endswith("/prompt") and path.count("/") == 3

    def __call__(self, scope: Any, path: str, caller: Caller, body: bytes) -> bool:
        session_id = path[len("/session/"):-len("/prompt")]
        try:
            prompt_id = wire.prompt_id(decode_json(body, _PROMPT_DECODER).promptId)
        except (BodyError, ValueError, RestError):
            return False
        if prompt_id is None or not session_id or not caller.sees_session(session_id):
            return False
        bridge = self.bridge
        return bridge.admitted_prompt(session_id, prompt_id) \
            or bridge.ended_prompt_terminal(session_id, prompt_id) is not None


# What a prompt's commit (``ticket.committed()``) raises once it has settled the prompt:
# the fast handler answers these itself (the route would find the prompt settled).
SETTLED = (JournalUnavailableError, SessionNotRestorableError, SessionClosedError)
FAST_DECLINES = frozenset({b"x-qwen-client-id"})   # headers only the route handles


def fast_routes(bridge: Bridge, config: RestConfig) -> dict[str, tuple[Any, frozenset[bytes]]]:
    """The front layer's fast handlers of this door, by route path, with the headers
    they leave to the route (``acp_server.app``)."""
    return {"/session/{session_id}/prompt": (FastPrompt(bridge, config), FAST_DECLINES)}


def routes(bridge: Bridge, config: RestConfig) -> list[BaseRoute]:
    return [
        route("/session/{session_id}/prompt", owned(send_prompt), ["POST"], bridge=bridge,
              config=config),
        route("/session/{session_id}/pending-prompts", owned(pending_prompts), ["GET"],
              bridge=bridge),
        route("/session/{session_id}/pending-prompts/{prompt_id}",
              owned(remove_pending_prompt), ["DELETE"], bridge=bridge),
    ]
