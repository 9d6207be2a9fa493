"""Session routes: create or attach, load, resume, branch, cancel, close, status, heartbeat.

    $ curl -s -X POST localhost:4170/session -d '{"sessionScope":"thread"}'
    {"sessionId":"3c0f…","workspaceCwd":"/abs/ws","attached":false,"clientId":"client_…",
     "createdAt":"2026-…Z","eventEpoch":"…"}
    $ curl -s -X DELETE localhost:4170/session/3c0f…     # 204, then 404

Contracts: ``sessionScope`` ``single`` (default) attaches to the workspace's default
session; ``thread`` always spawns; a ``sessionId`` override must be a UUID v1–v5 and
forces ``thread``; ``single`` is per principal (``rest.owners``: another principal's
session is 404 on every route here). Creation is 200 (not 201) as on the peer; branch
is 201. ``/load`` carries the history (``compactedReplay``, ``liveJournal``,
``promptTerminals``, with ``lastEventId`` after them, ``bridge.history``, each event as
its ``bridge.wire`` envelope); ``/resume`` carries none. A client that goes away while
its session is being made (create, load, resume, branch) cancels the making: the slot
comes back. ``/load`` answers are within the server's budget of them
(``acp_server.rest.budget``: past it 503 ``server_busy``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from acp_server.http.disconnect import until_disconnect
from acp_server.http.endpoints import route
from acp_server.http.origin import session_origin
from acp_server.principals import caller_of
from acp_server.rest import wire
from acp_server.rest.config import RestConfig
from acp_server.rest.errors import RestError, bad_request, json_response
from acp_server.rest.interactions import pending_interactions, user_questions
from acp_server.rest.owners import check_restore, claim, own_default, owned, visible_session
from acp_server.rest.wire import iso
from bridge import Bridge, Event, SessionInfo, SessionStatus
from bridge.errors import SessionNotFoundError
from bridge.wire import envelope


def status_fields(status: SessionStatus) -> dict[str, Any]:
    """The fields of ``wire.SessionStatus`` (also the start of a listing's summary,
    whose ``updatedAt`` is its own), with qwen serve 0.24.4's meanings: ``updatedAt``
    the end of the last prompt that ran; ``hasTurnError`` / ``turnError`` how that one
    failed, until the next starts running; ``activeWorkState`` ``active`` while a
    prompt is queued or running, else ``unsupported`` (qwen's for a runtime that does
    not report its own work: an ACP agent has no such report); ``pendingInteractions``
    the open permission requests (``rest.interactions``)."""
    failure = status.turn_failure
    interactions = pending_interactions(status.asked)
    questions = user_questions(interactions)
    return {
        "sessionId": status.session_id, "workspaceCwd": status.workspace_cwd,
        "createdAt": iso(status.created_at), "clientCount": status.client_count,
        "hasActivePrompt": status.has_active_prompt, "activePromptId": status.active_prompt_id,
        "pendingPrompts": status.pending_prompts, "queuedPrompts": status.queued_prompts,
        "isWaitingForPermission": status.pending_permissions > questions,
        "pendingInteractionCount": status.pending_permissions,
        "isWaitingForUserQuestion": questions > 0, "pendingInteractions": interactions,
        "subscribers": status.subscribers, "lastEventId": status.last_event_id,
        "eventEpoch": status.event_epoch,
        "activeWorkState": "active" if status.pending_prompts else "unsupported",
        "hasRunningBackgroundTasks": False, "hasTurnError": failure is not None,
        "updatedAt": msgspec.UNSET if status.turn_ended_at is None
        else iso(status.turn_ended_at),
        "turnError": msgspec.UNSET if failure is None else wire.TurnErrorInfo(
            message=failure.message, code=failure.code,
            errorKind=msgspec.UNSET if failure.error_kind is None else failure.error_kind),
    }


def _no_content() -> Response:
    return Response(status_code=204)


def created(info: SessionInfo) -> wire.SessionCreated:
    """``POST /session``'s answer; an attach adds the peer's ``hasRunningBackgroundTasks``
    and ``hasActivePrompt`` (a new session has neither, as on the peer)."""
    attach: dict[str, Any] = {"hasRunningBackgroundTasks": False,
                              "hasActivePrompt": info.has_active_prompt} if info.attached else {}
    return wire.SessionCreated(sessionId=info.session_id, workspaceCwd=info.workspace_cwd,
                               attached=info.attached, clientId=info.client_id,
                               createdAt=iso(info.created_at), eventEpoch=info.event_epoch,
                               **attach)


def _state(info: SessionInfo) -> dict[str, Any]:
    """The agent's session state (its session/new or load answer, less the id)."""
    return {k: v for k, v in info.agent_result.items() if k != "sessionId"}


def restored(info: SessionInfo) -> wire.SessionRestored | wire.SessionLoaded:
    """``/resume`` (no history) or ``/load`` (``info.history`` set)."""
    history = info.history
    if history is None:
        return wire.SessionRestored(
            sessionId=info.session_id, workspaceCwd=info.workspace_cwd, attached=info.attached,
            clientId=info.client_id, createdAt=iso(info.created_at), state=_state(info),
            hasRunningBackgroundTasks=False, hasActivePrompt=info.has_active_prompt,
            lastEventId=info.last_event_id, eventEpoch=info.event_epoch)
    return wire.SessionLoaded(
        sessionId=info.session_id, workspaceCwd=info.workspace_cwd, attached=info.attached,
        clientId=info.client_id, createdAt=iso(info.created_at), state=_state(info),
        hasRunningBackgroundTasks=False, hasActivePrompt=info.has_active_prompt,
        compactedReplay=_envelopes(history.compacted_replay),
        liveJournal=_envelopes(history.live_journal),
        lastEventId=history.last_event_id, eventEpoch=info.event_epoch,
        promptTerminals=[wire.PromptTerminal.of(t) for t in history.prompt_terminals])


def _envelopes(events: list[Event]) -> list[msgspec.Raw]:
    """Events as their JSON envelopes (the bytes the bus built once)."""
    return [msgspec.Raw(envelope(event)) for event in events]


async def create_session(request: Request, *, bridge: Bridge, config: RestConfig) -> Response:
    wire.client_id(request)  # validated as on every route; a new id is issued anyway
    body = await wire.read_json(request, wire.CreateSessionBody, limit=config.max_body_bytes)
    bridge.check_workspace(body.cwd)   # the peer's order: workspace, scope, mode, id
    scope = "single" if body.sessionScope is None else body.sessionScope
    if scope not in ("single", "thread"):
        raise bad_request('`sessionScope` must be "single" or "thread"', "invalid_session_scope")
    wire.check_approval_mode(body.approvalMode)
    if body.sessionId is not None and not wire.is_uuid(body.sessionId):
        raise bad_request("`sessionId` must be a UUID (RFC 4122, versions 1-5)",
                          "invalid_session_id")
    origin = session_origin(body.meta)
    caller = caller_of(request.scope)
    if body.sessionId is not None:
        await bridge.recall_owner(body.sessionId)
        check_restore(caller, body.sessionId, live=bridge.has_session(body.sessionId),
                      request="POST /session")

    def spawn() -> Awaitable[SessionInfo]:
        if body.sessionId is not None:
            return bridge.create_session(cwd=body.cwd, session_id=body.sessionId,
                                         agent=body.agent, origin=origin, owner=caller.name)
        if scope == "thread":
            return bridge.create_session(cwd=body.cwd, agent=body.agent, origin=origin,
                                         owner=caller.name)
        return own_default(bridge, caller, cwd=body.cwd, agent=body.agent)

    # A client that goes away gives its session slot back at once.
    info = await until_disconnect(request, spawn)
    claim(caller, info)
    if not info.attached:
        how = "attach" if scope == "single" and body.sessionId is None else "new"
        caller.record("session.created", info.session_id, how=how, agent=body.agent)
    return json_response(200, created(info))


async def load_session(request: Request, *, bridge: Bridge, config: RestConfig) -> Response:
    return await _restore(request, bridge, bridge.load_session, config, "load")


async def resume_session(request: Request, *, bridge: Bridge, config: RestConfig) -> Response:
    return await _restore(request, bridge, bridge.resume_session, config, "resume")


async def _restore(request: Request, bridge: Bridge,
                   restore: Callable[..., Awaitable[SessionInfo]],
                   config: RestConfig, how: str) -> Response:
    """``/load`` and ``/resume``: the same body and answer, a different bridge call."""
    wire.client_id(request)
    caller = caller_of(request.scope)
    session_id = request.path_params["session_id"]
    await bridge.recall_owner(session_id)   # a closed session's maker, even forgotten
    check_restore(caller, session_id, live=bridge.has_session(session_id),
                  request=f"POST {request.scope['path']}")
    body = await wire.read_json(request, wire.RestoreBody, limit=config.max_body_bytes)
    bridge.check_workspace(body.cwd)   # the peer's order: the workspace, then the mode
    wire.check_approval_mode(body.approvalMode)
    # the history: within the server's budget of such answers, taken before it is built
    budget = config.large_answers.taken(bridge.history_bytes(session_id)) \
        if how == "load" else contextlib.nullcontext()
    with budget as held:
        info = await until_disconnect(request, lambda: restore(
            session_id, cwd=body.cwd, agent=body.agent,
            owner=caller.name))   # unknown to the agent: 404
        claim(caller, info)
        if not info.attached:
            caller.record("session.created", session_id, how=how, agent=body.agent)
        if held is not None:
            return held.response(msgspec.json.encode(restored(info)), 200)
    return json_response(200, restored(info))


def _refuse_branch_point(bridge: Bridge, session_id: str, at_record_id: Any) -> None:
    """A branch at a point (``atRecordId``), as the peer answers one it cannot branch
    at: 400 ``branch_point_invalid`` for an id that is not a string, 409 for a string
    (a record this server does not keep: its branches are always of the whole session,
    and it never falls back to one silently). An unknown session stays 404."""
    if not isinstance(at_record_id, str):
        raise RestError(400, {"error": "`atRecordId` must be a string",
                              "code": "branch_point_invalid", "sessionId": session_id})
    if not bridge.has_session(session_id):
        raise SessionNotFoundError(session_id)
    raise RestError(409, {"error": f'No branch point "{at_record_id[:200]}" in session '
                                   f'"{session_id}": this server branches a whole session only '
                                   "(send no `atRecordId`)",
                          "code": "branch_point_invalid", "sessionId": session_id,
                          "atRecordId": at_record_id[:200]})


async def branch_session(request: Request, *, bridge: Bridge, config: RestConfig) -> Response:
    wire.client_id(request)
    body = await wire.read_json(request, wire.BranchBody, limit=config.max_body_bytes)
    session_id = request.path_params["session_id"]
    if body.atRecordId is not msgspec.UNSET:
        _refuse_branch_point(bridge, session_id, body.atRecordId)
    caller = caller_of(request.scope)
    info = await until_disconnect(request, lambda: bridge.branch_session(
        session_id, owner=caller.name))
    claim(caller, info)
    caller.record("session.created", info.session_id, how="branch", forked_from=session_id)
    return json_response(201, wire.SessionBranched(
        sessionId=info.session_id, workspaceCwd=info.workspace_cwd, attached=info.attached,
        clientId=info.client_id, createdAt=iso(info.created_at),
        forkedFrom=wire.ForkedFrom(sessionId=info.forked_from or session_id),
        lastEventId=info.last_event_id, eventEpoch=info.event_epoch))


async def cancel_session(request: Request, *, bridge: Bridge) -> Response:
    wire.client_id(request)
    session_id = request.path_params["session_id"]
    await bridge.cancel_session(session_id)
    caller_of(request.scope).record("session.cancelled", session_id)
    return _no_content()


async def close_session(request: Request, *, bridge: Bridge) -> Response:
    """A live session is closed and its journal removed; a closed one the journal keeps
    (``/workspace/{id}/ended-sessions``) has its journal removed (``delete_ended``).
    Another principal's, live or kept, is 404 as if it did not exist."""
    client_id = wire.client_id(request)
    session_id = request.path_params["session_id"]
    caller = caller_of(request.scope)
    # a kept session's maker, even forgotten; read for a live one too, so that another
    # principal's 404 costs what an unknown id's does
    await bridge.recall_owner(session_id)
    if not bridge.has_session(session_id):
        visible_session(request)
        if await bridge.delete_ended(session_id):
            caller.record("session.closed", session_id, how="ended")
            return _no_content()
    visible_session(request)
    await bridge.close_session(session_id, closed_by=client_id)
    caller.record("session.closed", session_id)
    return _no_content()


async def session_status(request: Request, *, bridge: Bridge) -> Response:
    status = bridge.session_status(request.path_params["session_id"])
    return json_response(200, wire.SessionStatus(**status_fields(status)))


async def heartbeat(request: Request, *, bridge: Bridge) -> Response:
    client_id = wire.client_id(request)
    session_id = request.path_params["session_id"]
    seen = bridge.heartbeat(session_id, client_id)
    return json_response(200, wire.Heartbeat(sessionId=session_id,
                                             lastSeenAt=int(seen * 1000), clientId=client_id))


def routes(bridge: Bridge, config: RestConfig) -> list[BaseRoute]:
    deps = {"bridge": bridge, "config": config}
    return [
        route("/session", create_session, ["POST"], **deps),
        route("/session/{session_id}", close_session, ["DELETE"], bridge=bridge),
        route("/session/{session_id}/load", load_session, ["POST"], **deps),
        route("/session/{session_id}/resume", resume_session, ["POST"], **deps),
        route("/session/{session_id}/branch", owned(branch_session), ["POST"], **deps),
        route("/session/{session_id}/cancel", owned(cancel_session), ["POST"], bridge=bridge),
        route("/session/{session_id}/status", owned(session_status), ["GET"], bridge=bridge),
        route("/session/{session_id}/heartbeat", owned(heartbeat), ["POST"], bridge=bridge),
    ]
