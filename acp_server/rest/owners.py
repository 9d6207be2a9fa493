"""Ownership in the REST door: another principal's session is 404 here.

    route("/session/{session_id}/status", owned(session_status), ["GET"], bridge=bridge)
    sid = visible_session(request)          # the path's session, or SessionNotFoundError
    info = await own_default(bridge, caller, cwd=None, agent=None)   # "single" scope

Contracts: ``owned(endpoint)`` runs the endpoint only when the request's caller sees
the path's ``{session_id}`` (``Caller.sees_session``: its own, an admin's view,
``--share-sessions``); otherwise ``SessionNotFoundError``, the door's 404
``session_not_found``, before the endpoint reads the body or touches the session, so
existence does not leak. ``own_default`` is the ``sessionScope: "single"`` session of
one principal: the bridge's one default session for those who see every session
(admins, ``--share-sessions``), else one per principal and agent, spawned on first use.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request

from acp_server.principals import Caller, caller_of
from bridge import Bridge, SessionInfo
from bridge.errors import SessionNotFoundError


def visible_session(request: Request) -> str:
    sid: str = request.path_params["session_id"]
    caller = caller_of(request.scope)
    if not caller.sees_session(sid):
        if caller.gate.sessions.owner(sid) is not None:
            caller.not_owner(sid, f"{request.method} {request.scope['path']}")
        raise SessionNotFoundError(sid)
    return sid


def owned(endpoint: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(endpoint)
    async def checked(request: Request, **deps: Any) -> Any:
        visible_session(request)
        return await endpoint(request, **deps)

    return checked


def check_restore(caller: Caller, session_id: str, *, live: bool,
                  request: str = "restore") -> None:
    """Before a create with a requested id, a load or a resume: a session another
    principal made (live, or closed and remembered) is 404, and so is a ``live``
    session no principal owns (the LMSP runner's: admins' only), as on ``/acp``."""
    if caller.sees_session(session_id):
        return
    owner = caller.gate.sessions.owner(session_id)
    if owner is not None:
        caller.not_owner(session_id, request)
    if live or owner is not None:
        raise SessionNotFoundError(session_id)


def claim(caller: Caller, info: SessionInfo) -> None:
    """After a create, load, resume or branch: a session this request made (or
    restored) is the caller's; one it attached, already live, is never claimed and
    must be one it sees (a race lost to another principal's restore, or a session no
    principal owns: 404)."""
    if info.attached:
        if not caller.sees_session(info.session_id):
            raise SessionNotFoundError(info.session_id)
    elif not caller.claim_session(info.session_id):
        raise SessionNotFoundError(info.session_id)


async def own_default(bridge: Bridge, caller: Caller, *, cwd: str | None,
                      agent: str | None) -> SessionInfo:
    if caller.sees(None):   # an admin, or shared sessions: the workspace's one default
        return await bridge.attach_session(cwd=cwd, agent=agent, owner=caller.name)
    owners = caller.gate.sessions
    key = (caller.name, agent)
    async with owners.default_lock(key):   # concurrent first attaches share one spawn
        sid = owners.default(key)
        if sid is not None:   # live: a requested id that is live attaches
            return await bridge.create_session(cwd=cwd, session_id=sid, agent=agent)
        info = await bridge.create_session(cwd=cwd, agent=agent, owner=caller.name)
        owners.claim(info.session_id, caller.name)
        owners.set_default(key, info.session_id)
        return info


__all__ = ["check_restore", "claim", "own_default", "owned", "visible_session"]
