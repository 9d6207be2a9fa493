"""Who may send what on ``/acp``: what a JSON-RPC message needs of its principal, and
whose sessions a connection may touch.

    access = message_access(msg)                 # checked by the door before dispatch
    check_owner(conn, "session/load", params)    # SessionNotFoundError: not the caller's
    claim(conn, session_id, "new", agent)        # the caller made it (audit: created)
    conn.push(denial_error(rpc_id, denial))      # a 403 / 429 as a JSON-RPC error

Contracts:

* ``message_access``: ``session/prompt`` is a prompt, ``session/list`` a read,
  ``initialize``, ``authenticate`` and ``logout`` any credential; anything else
  (including a response to the agent's request) a mutation that needs ``prompt``.
* Another principal's session is no session here: ``check_owner`` raises
  ``SessionNotFoundError`` as for an unknown id, before the method runs and before a
  reply channel is opened. The methods of ``UNSCOPED`` name no session of their own; a
  load or resume (``RESTORING``) may restore a session no principal is known to own;
  for ``RECALLING`` the maker of a session not live here is looked up first (the
  journal's: ``dispatch``).
* ``claim`` and ``restored`` give a session made or restored to the connection's
  principal, and record it (``session.created``); a restore that raced and lost to
  another principal, or an attach to a session the caller does not see, is 404.
* ``denial_error``: ``INVALID_REQUEST`` with ``data.errorKind`` the denial's code and
  its fields (``requiredScope`` or ``tier`` and ``retryAfterMs``).
"""

from __future__ import annotations

from typing import Any

from acp_server.acp_http.connection import AcpConnection, RpcId
from acp_server.principals import Denial
from acp_server.principals.model import INFO, MUTATING, PROMPTING, READING, Access
from bridge.errors import SessionNotFoundError
from bridge.jsonrpc import INVALID_REQUEST, Message, encode_error

READ_METHODS = frozenset({"session/list"})
INFO_METHODS = frozenset({"initialize", "authenticate", "logout"})
# Methods that name no session of their own (or only through this connection's
# requests), and those that may restore a session nobody holds.
UNSCOPED = frozenset({"initialize", "authenticate", "logout", "session/new", "session/list",
                      "session/permission", "$/cancel_request"})
RESTORING = frozenset({"session/load", "session/resume"})
# the maker of a session not live here is looked up (the journal's) before these run
RECALLING = RESTORING | {"session/delete"}


def message_access(msg: Message) -> Access:
    """What one JSON-RPC message needs of its principal: ``session/prompt`` is a
    prompt; ``session/list`` a read; ``initialize``, ``authenticate`` and ``logout``
    any credential; everything else (new, load, resume, fork, cancel, close, delete,
    set_*, permission votes, answers to the agent's requests, methods passed to the
    agent) a mutation that needs ``prompt``."""
    method = msg.method
    if not isinstance(method, str):   # a response: an answer to a permission request
        return MUTATING
    if method == "session/prompt":
        return PROMPTING
    if method in READ_METHODS:
        return READING
    return INFO if method in INFO_METHODS else MUTATING


def denied_request(msg: Message) -> str:
    """What an audit record of a refused message names: ``/acp METHOD`` (a response:
    ``/acp (response)``); the method as sent, cut by the audit log."""
    method = msg.method
    return f"/acp {method if isinstance(method, str) else '(response)'}"


def check_owner(conn: AcpConnection, method: str, params: dict[str, Any]) -> None:
    """Another principal's session is no session here (``SessionNotFoundError``, as an
    unknown id): checked before the method runs and before a reply channel is opened.
    A load or resume may restore a session no principal is known to own."""
    if method in UNSCOPED:
        return
    sid = params.get("sessionId")
    if not isinstance(sid, str):
        return
    caller = conn.caller
    if caller.sees_session(sid):
        return
    owner = caller.gate.sessions.owner(sid)
    if method in RESTORING and owner is None and not conn.bridge.has_session(sid):
        return
    if owner is not None:
        caller.not_owner(sid, f"/acp {method}")
    raise SessionNotFoundError(sid)


def claim(conn: AcpConnection, session_id: str, how: str, agent: str | None = None,
          **detail: Any) -> None:
    """The connection's principal made (or restored) the session; a restore raced and
    lost to another principal is 404."""
    if not conn.caller.claim_session(session_id):
        raise SessionNotFoundError(session_id)
    conn.caller.record("session.created", session_id, how=how, agent=agent, **detail)


def restored(conn: AcpConnection, session_id: str, attached: bool, how: str,
             agent: str | None) -> None:
    """After a load or resume: a session it restored is claimed (the connection's
    own); one it attached to must be one the caller sees (another principal's restore
    may have won a race ``check_owner`` could not see: 404, as REST's ``claim``)."""
    if attached:
        if not conn.caller.sees_session(session_id):
            raise SessionNotFoundError(session_id)
        return
    claim(conn, session_id, how, agent)
    conn.own(session_id)


def denial_error(rpc_id: RpcId, denial: Denial) -> bytes:
    """A 403 / 429 of the principals as a JSON-RPC error (``data.errorKind``: its code,
    with ``requiredScope`` or ``tier`` and ``retryAfterMs``)."""
    return encode_error(rpc_id, INVALID_REQUEST, denial.message,
                        {"errorKind": denial.code, **dict(denial.extra)})
