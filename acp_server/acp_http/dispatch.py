"""JSON-RPC methods of ``/acp`` mapped onto the ``Bridge`` (errors: ``acp_http.errors``).

    msg = decode_message(body)
    params = request_params(msg)                 # dict; JsonRpcInvalidParams otherwise
    await dispatch(conn, msg, params)            # the reply lands on a stream

Replies go to the session stream for the session-scoped methods (``SESSION_SCOPED``)
when the connection has, or can open, a channel for that session, else to the
connection stream. ``session/prompt`` is answered later, by the session stream
itself, when the turn ends (``{stopReason, ...}`` as the agent sent it, or an error).

Unlike ``qwen serve``, a second ``session/prompt`` on the same connection does not
cancel the first: it is queued behind it under the same admission rule as REST
(``--max-pending-prompts-per-session``), and a full queue answers ``prompt_queue_full`` (``acp_http.errors``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from acp_server import __version__
from acp_server.acp_http.connection import (
    MAX_TRACKED_PROMPTS,
    AcpConnection,
    RpcId,
    SessionChannel,
)
from acp_server.http.origin import session_origin
from acp_server.acp_http.errors import (  # noqa: F401 - re-exported for the routes
    ChannelLimitError,
    InvalidParamsError,
    encode_bridge_error,
)
from bridge import Bridge
from bridge.errors import BridgeError, InvalidPermissionOptionError, PermissionNotFoundError
from bridge.jsonrpc import (
    METHOD_NOT_FOUND,
    UNSET,
    Message,
    decode_value,
    encode_error,
    encode_result,
)

log = logging.getLogger("acp_server.acp_http")

PROTOCOL_VERSION = 1
# Methods whose replies travel on the session stream (and whose POST carries
# ``Acp-Session-Id``). ``session/set_model`` is legacy and the Python SDK sends it
# without the header, so the header is required only for ``HEADER_REQUIRED``.
SESSION_SCOPED = frozenset({"session/prompt", "session/cancel", "session/set_mode",
                            "session/set_config_option", "session/set_model", "session/close"})
HEADER_REQUIRED = SESSION_SCOPED - {"session/set_model"}
FORWARDED = frozenset({"session/set_mode", "session/set_config_option", "session/set_model"})
DEFAULT_AGENT_CAPABILITIES: dict[str, Any] = {
    "loadSession": True,
    "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
    "sessionCapabilities": {"list": {}, "resume": {}, "close": {}},
}


# -- params -----------------------------------------------------------------------------
def request_params(msg: Message) -> dict[str, Any]:
    """The params object (``{}`` when absent). Raises ``InvalidParamsError``."""
    if msg.params is UNSET:
        return {}
    try:
        params = decode_value(msg.params)
    except msgspec.DecodeError:
        raise InvalidParamsError("Invalid params: not JSON") from None
    if not isinstance(params, dict):
        raise InvalidParamsError("Invalid params: expected an object")
    return params


def _session_id(params: dict[str, Any]) -> str:
    sid = params.get("sessionId")
    if not isinstance(sid, str) or not sid:
        raise InvalidParamsError('Invalid params: "sessionId" must be a non-empty string')
    return sid


def _cwd(params: dict[str, Any]) -> str | None:
    cwd = params.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise InvalidParamsError('Invalid params: "cwd" must be a string')
    return cwd


# -- initialize -------------------------------------------------------------------------
def initialize_result(bridge: Bridge, params: dict[str, Any], connection_id: str) -> dict[str, Any]:
    """Protocol version ``min(requested, 1)``; the agent's capabilities once the
    bridge has started it, else what the bridge offers with the reference agent."""
    requested = params.get("protocolVersion")
    version = PROTOCOL_VERSION
    if isinstance(requested, int) and not isinstance(requested, bool):
        version = max(0, min(requested, PROTOCOL_VERSION))
    agent_caps = bridge.agent_info.get("agentCapabilities")
    capabilities = agent_caps if isinstance(agent_caps, dict) else DEFAULT_AGENT_CAPABILITIES
    auth_methods = bridge.agent_info.get("authMethods")
    return {
        "protocolVersion": version,
        "agentCapabilities": capabilities,
        "authMethods": auth_methods if isinstance(auth_methods, list) else [],
        "agentInfo": {"name": "acp-server", "title": "acp-server", "version": __version__},
        "_meta": {"acp-server": {"connectionId": connection_id,
                                 "workspaceCwd": bridge.workspace_cwd}},
    }


# -- methods ------------------------------------------------------------------------------
AGENT_META = "acp-server/agent"   # session/new: which agent profile to run on
DEFERRED = object()   # the reply is sent later (session/prompt)
Handler = Callable[[AcpConnection, RpcId, dict[str, Any]], Awaitable[Any]]


async def _authenticate(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    return {}


async def _session_new(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    """A fresh session on the agent named by ``_meta["acp-server/agent"]`` (default:
    the server's default agent), labelled by ``_meta["acp-server/origin"]``; the reply
    is the agent's own, unknown fields kept."""
    meta = params.get("_meta")
    agent = meta.get(AGENT_META) if isinstance(meta, dict) else None
    if agent is not None and not isinstance(agent, str):
        raise InvalidParamsError(f'Invalid params: "_meta.{AGENT_META}" must be a string')
    info = await conn.bridge.create_session(cwd=_cwd(params), agent=agent,
                                            origin=session_origin(meta))
    conn.channel(info.session_id)
    return {**info.agent_result, "sessionId": info.session_id}


async def _session_load(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    """ACP: the agent streams the whole conversation as ``session/update`` and *then*
    answers. The history is the session ring (for a cold session: the agent's own
    replay, published during the restore), written to the session stream; the answer
    (the agent's session state) follows once the reader has taken it."""
    sid = _session_id(params)
    info = await conn.bridge.load_session(sid, cwd=_cwd(params))
    channel = conn.channel(sid)
    channel.subscribe(last_event_id=0)
    history = info.history
    await channel.flush_through(info.last_event_id if history is None
                                else history.last_event_id)
    return {k: v for k, v in info.agent_result.items() if k != "sessionId"}


async def _session_resume(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    sid = _session_id(params)
    await conn.bridge.resume_session(sid, cwd=_cwd(params))
    conn.channel(sid)
    return {}


async def _session_list(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    cwd = _cwd(params)
    sessions = [{"sessionId": s.session_id, "cwd": s.workspace_cwd}
                for s in conn.bridge.sessions()
                if not s.closing and (cwd is None or s.workspace_cwd == cwd)]
    return {"sessions": sessions}


async def _session_prompt(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    sid = _session_id(params)
    prompt = params.get("prompt")
    channel = conn.channel(sid)         # subscribed before admission: no event is missed
    if len(channel.prompts) >= MAX_TRACKED_PROMPTS:
        raise ChannelLimitError(MAX_TRACKED_PROMPTS)
    ticket = conn.bridge.send_prompt(sid, prompt)
    if rpc_id is not None:
        channel.track_prompt(ticket, rpc_id)
    return DEFERRED


async def _session_cancel(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    await conn.bridge.cancel_session(_session_id(params))
    return {}


async def _session_close(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    await conn.bridge.close_session(_session_id(params), closed_by=conn.id)
    return {}


async def _session_permission(conn: AcpConnection, rpc_id: RpcId,
                              params: dict[str, Any]) -> Any:
    """The peer's vendor vote: ``{requestId, sessionId?, outcome}``, an alternative to
    answering the ``session/request_permission`` request with a JSON-RPC response."""
    request_id = params.get("requestId")
    if not isinstance(request_id, str) or not request_id:
        raise InvalidParamsError('Invalid params: "requestId" must be a non-empty string')
    outcome = params.get("outcome")
    if isinstance(outcome, dict) and isinstance(outcome.get("outcome"), dict):
        outcome = outcome["outcome"]          # {outcome: {outcome: ...}} as in the response
    if not isinstance(outcome, dict) or outcome.get("outcome") not in ("selected", "cancelled"):
        raise InvalidParamsError('Invalid params: "outcome" must be {outcome: "cancelled"} or '
                                 '{outcome: "selected", optionId}')
    session_id = conn.pending_requests.get(request_id)
    given = params.get("sessionId")
    if session_id is None or (isinstance(given, str) and given != session_id):
        raise PermissionNotFoundError(request_id, given if isinstance(given, str) else None)
    conn.bridge.respond_to_permission(request_id, outcome, session_id=session_id)
    conn.pending_requests.pop(request_id, None)
    return {}


async def _forward(conn: AcpConnection, method: str, params: dict[str, Any]) -> Any:
    return await conn.bridge.forward(_session_id(params), method, params)


METHODS: dict[str, Handler] = {
    "authenticate": _authenticate,
    "session/new": _session_new,
    "session/load": _session_load,
    "session/resume": _session_resume,
    "session/list": _session_list,
    "session/prompt": _session_prompt,
    "session/cancel": _session_cancel,
    "session/close": _session_close,
    "session/permission": _session_permission,
}


def _reply_target(conn: AcpConnection, method: str,
                  params: dict[str, Any]) -> AcpConnection | SessionChannel:
    if method not in SESSION_SCOPED:
        return conn
    sid = params.get("sessionId")
    if not isinstance(sid, str):
        return conn
    channel = conn.channels.get(sid)
    if channel is not None:
        return channel
    try:
        conn.bridge.get_session(sid)
        return conn.channel(sid)
    except BridgeError:
        return conn


async def dispatch(conn: AcpConnection, msg: Message, params: dict[str, Any]) -> None:
    """Run one request or notification; its reply (if any) goes to a stream."""
    method = msg.method
    assert isinstance(method, str)
    rpc_id: RpcId = None if msg.id is UNSET else msg.id
    is_request = msg.id is not UNSET
    target = _reply_target(conn, method, params)
    handler = METHODS.get(method)
    try:
        if handler is not None:
            result = await handler(conn, rpc_id, params)
        elif method in FORWARDED:
            result = await _forward(conn, method, params)
        else:
            if is_request:
                target.push(encode_error(rpc_id, METHOD_NOT_FOUND, f"Unknown method: {method}",
                                         {"method": method}))
            return
    except Exception as exc:
        if not isinstance(exc, BridgeError):
            log.exception("acp %s failed", method)
        if is_request:
            target.push(encode_bridge_error(rpc_id, exc))
        return
    closing = method == "session/close" and isinstance(target, SessionChannel)
    if closing:
        target.drain_now()   # the turn's last events and prompt replies come first
    if is_request and result is not DEFERRED:
        target.push(encode_result(rpc_id, {} if result is None else result))
    if closing:
        conn.drop_channel(target.session_id)   # after the reply: it is still delivered


def answer_agent_request(conn: AcpConnection, msg: Message) -> None:
    """A client's JSON-RPC response to an agent-to-client request (a permission
    request): the first answer wins; an error answer counts as ``cancelled``.
    Answers to unknown ids are ignored (the request was resolved elsewhere)."""
    request_id = msg.id
    if not isinstance(request_id, str):
        return
    session_id = conn.pending_requests.pop(request_id, None)
    if session_id is None:
        return
    outcome: dict[str, Any] = {"outcome": "cancelled"}
    if msg.error is UNSET:
        result = decode_value(msg.result)
        found = result.get("outcome") if isinstance(result, dict) else None
        if isinstance(found, dict):
            outcome = found
    try:
        conn.bridge.respond_to_permission(request_id, outcome, session_id=session_id)
    except InvalidPermissionOptionError:
        conn.expect_answer(request_id, session_id)   # still pending: may be answered again
        log.info("acp %s: invalid permission option for %s", conn.id, request_id)
    except BridgeError as exc:
        log.debug("acp %s: permission answer for %s ignored: %s", conn.id, request_id, exc)
