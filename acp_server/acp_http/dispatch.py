"""JSON-RPC methods of ``/acp`` mapped onto the ``Bridge`` (errors: ``acp_http.errors``).

    msg = decode_message(body)
    params = request_params(msg)                 # dict; JsonRpcInvalidParams otherwise
    await dispatch(conn, msg, params)            # the reply lands on a stream

Replies go to the session stream for the session-scoped methods (``SESSION_SCOPED``)
when the connection has, or can open, a channel for that session, else to the
connection stream. ``session/prompt`` is answered later, by the session stream
itself, when the turn ends (``{stopReason, ...}`` as the agent sent it, or an error).
Who may send what, and whose sessions a connection may touch: ``acp_http.access``.

A request runs until it is answered, cancelled (``$/cancel_request``) or its connection
closes (DELETE, reaping, the socket gone): a session it was making then gives its slot
back. The sessions a connection made are closed with it (``AcpConnection.close``).

Unlike ``qwen serve``, a second ``session/prompt`` on the same connection does not
cancel the first: it is queued behind it under the same admission rule as REST
(``--max-pending-prompts-per-session``), and a full queue answers ``prompt_queue_full`` (``acp_http.errors``).

ACP v1 as of schema 1.21 (the section "ACP v1.21" below, table ``V1_METHODS``):
``session/delete`` (closes a live session, after the agent's own ``session/delete``
when it offers one; an unknown id succeeds), ``session/fork`` (our branch),
``logout`` (``{}``: the credential is the bearer token the client holds; the shared
agent is not logged out), ``$/cancel_request`` (cancels a running request, answered
``-32800``, or a ``session/prompt``'s turn, answered ``stopReason: "cancelled"``).
Any other method goes to the session's agent (``params.sessionId``) when that agent
advertises it (``advertised``), else ``-32601``; an unknown notification is dropped.

Reconnecting clients (``acp-server connect``) use ``_meta`` keys, all optional:

* ``initialize`` ``{"acp-server/resumable": true}``: event frames carry
  ``params._meta["acp-server/event"] = {sessionId, id, epoch}``, and permission requests sent
  to the connection outlive its loss for the registry's ``resume_grace_s``.
* ``session/prompt`` ``{"acp-server/promptId": ID}``: the prompt's id. Sent again
  under the same id it is not admitted twice: a pending prompt is re-attached (its
  answer comes when its turn ends), a finished one answered from its terminal. A
  connection's close does not cancel it.
* ``session/load`` / ``session/resume`` ``{"acp-server/lastEventId": N,
  "acp-server/eventEpoch": E}``: replay only the events after ``N`` (all of the bus
  from ``N`` = 0). Under another epoch nothing the client saw can be matched: nothing
  is replayed and the answer says ``resync: "epoch_reset"``. The answer's ``_meta``
  carries ``"acp-server/events": {eventEpoch, lastEventId[, resync]}``.
  ``{"acp-server/agent": NAME}`` names the agent that restores a cold session.
  A session another instance runs is asked for (``acp_server.fleet.handoff``) only
  for a caller who sees it: ``may_hand_off(caller.sees)`` wraps the bridge call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec

from acp_server import __version__
from acp_server.acp_http.access import RECALLING, check_owner, claim, restored
from acp_server.acp_http.connection import (
    FLUSH_TIMEOUT_S,
    MAX_TRACKED_PROMPTS,
    AcpConnection,
    RpcId,
    SessionChannel,
)
from acp_server.fleet.handoff import may_hand_off
from acp_server.http.origin import session_origin
from acp_server.acp_http.errors import (  # noqa: F401 - re-exported for the routes
    ChannelLimitError,
    InvalidParamsError,
    PromptFailedError,
    RequestCancelledError,
    encode_bridge_error,
)
from acp_server.store.errors import ENGINE_ERRORS, StoreUnavailableError
from bridge import Bridge
from bridge.errors import (
    AgentRequestTimeoutError,
    BridgeError,
    InvalidPermissionOptionError,
    JournalUnavailableError,
    PermissionNotFoundError,
    SessionNotFoundError,
    SessionNotRestorableError,
)
from bridge.jsonrpc import UNSET, Message, decode_value, encode_result
from bridge.loggable import loggable
from acp_server.acp_http.elicitation import answer_elicitation, offers_elicitation
from acp_server.acp_http.listing import session_list
from acp_server.acp_http.passthrough import pass_through
from acp_server.acp_http.resume import (
    PENDING,
    RESUMABLE_META,
    cursor_param,
    meta_value,
    prompt_id_param,
    rejoin_prompt,
    replay_after,
    with_events_meta,
)

log = logging.getLogger("acp_server.acp_http")

PROTOCOL_VERSION = 1
# Methods whose replies travel on the session stream (and whose POST carries
# ``Acp-Session-Id``). ``session/set_model`` is legacy and the Python SDK sends it
# without the header, so the header is required only for ``HEADER_REQUIRED``.
SESSION_SCOPED = frozenset({"session/prompt", "session/cancel", "session/set_mode",
                            "session/set_config_option", "session/set_model", "session/close",
                            "session/delete"})
HEADER_REQUIRED = SESSION_SCOPED - {"session/set_model", "session/delete"}
CLOSING = frozenset({"session/close", "session/delete"})   # the session stream ends after
FORWARDED = frozenset({"session/set_mode", "session/set_config_option", "session/set_model"})


# -- params -----------------------------------------------------------------------------
def request_params(msg: Message) -> dict[str, Any]:
    """The params object (``{}`` when absent). Raises ``InvalidParamsError``."""
    if msg.params is UNSET:
        return {}
    try:
        params = decode_value(msg.params)
    except msgspec.ValidationError as exc:   # JSON, but not a value we hold (1e999)
        raise InvalidParamsError(f"Invalid params: {exc}") from None
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
async def default_agent_info(bridge: Bridge) -> dict[str, Any]:
    """The default agent's ``initialize`` answer, the agent started first when it does
    not run (within the bridge's ``initialize`` timeout; at once when it runs), so
    ``initialize`` answers what its sessions will have. ``{}`` when it cannot be
    started (unavailable, failed or slow ``initialize``): then ``initialize`` claims
    only what the server serves whatever the agent (``with_own_capabilities``), and
    ``session/new`` answers the start's error."""
    try:
        return await bridge.start_agent()
    except BridgeError as exc:
        log.info("initialize: the default agent did not start (%s): answering the "
                 "server's own capabilities only", exc)
    except Exception:   # a bug in a start must not fail every client's initialize
        log.exception("initialize: starting the default agent failed: answering the "
                      "server's own capabilities only")
    return {}


def initialize_result(bridge: Bridge, agent_info: dict[str, Any], params: dict[str, Any],
                      connection_id: str) -> dict[str, Any]:
    """Protocol version 1, the one this server speaks, whatever the client asked: ACP
    answers the client's version when it is supported, else the latest supported (a
    client asking for 0 or 2 learns it is 1, and may disconnect). The default agent's
    capabilities (``agent_info``: ``default_agent_info``) as ``/acp`` keeps them true."""
    agent_caps = agent_info.get("agentCapabilities")
    capabilities = with_own_capabilities(agent_caps if isinstance(agent_caps, dict) else {})
    auth_methods = agent_info.get("authMethods")
    return {
        "protocolVersion": PROTOCOL_VERSION,
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
    agent = meta_value(params, AGENT_META, str)
    with conn.channel_room():   # past the channel cap: refused before the session exists
        info = await conn.bridge.create_session(cwd=_cwd(params), agent=agent,
                                                origin=session_origin(params.get("_meta")),
                                                owner=conn.caller.name)
    claim(conn, info.session_id, "new", agent)
    if not info.attached:
        conn.own(info.session_id)
    conn.channel(info.session_id)
    return {**info.agent_result, "sessionId": info.session_id}


async def _session_load(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    """ACP: the agent streams the whole conversation as ``session/update`` and *then*
    answers. The history is the session ring (for a cold session: the agent's own
    replay, published during the restore), written to the session stream; the answer
    (the agent's session state) follows once the reader has taken it. With a cursor
    only what follows it (see the module docstring)."""
    sid = _session_id(params)
    cursor = cursor_param(params)
    agent = meta_value(params, AGENT_META, str)
    with may_hand_off(conn.caller.sees), conn.channel_room(sid):   # may be asked for
        info = await conn.bridge.load_session(sid, cwd=_cwd(params), agent=agent,
                                              owner=conn.caller.name)
    # only the cursor of the history: the bridge compacted its chunks into new events
    # (up to the ring's size), which the waits below for a slow reader must not hold
    through = info.last_event_id if info.history is None else info.history.last_event_id
    info = dataclasses.replace(info, history=None)
    restored(conn, sid, info.attached, "load", agent)   # restored here: it made it
    result = _session_state(info.agent_result)
    if cursor is not None:
        return with_events_meta(result, await replay_after(conn, info, cursor))
    channel = conn.channel(sid)
    channel.subscribe(last_event_id=0)
    if not conn.websocket and not channel.reader_attached:
        # Streamable HTTP with no session stream open: a client that opens it once a
        # message names the session (the ACP Python SDK) would never see the history
        # there. It goes on the connection stream, ahead of the answer; what follows
        # goes on the session stream (the channel counts the history as delivered).
        for frame in channel.take_now():   # paced by its reader: the answer always fits
            if not await conn.push_paced(frame.payload):
                log.warning("acp %s: session/load of %s: the connection stream was not "
                            "read for %g s; the rest of the history is not sent", conn.id,
                            sid, FLUSH_TIMEOUT_S)
                break
        return result
    await channel.flush_through(through)
    return result


async def _session_resume(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    sid = _session_id(params)
    cursor = cursor_param(params)
    agent = meta_value(params, AGENT_META, str)
    with may_hand_off(conn.caller.sees), conn.channel_room(sid):
        info = await conn.bridge.resume_session(sid, cwd=_cwd(params), agent=agent,
                                                owner=conn.caller.name)
    restored(conn, sid, info.attached, "resume", agent)
    result = _session_state(info.agent_result)   # as load's: modes, configOptions, ...
    if cursor is not None:
        return with_events_meta(result, await replay_after(conn, info, cursor))
    conn.channel(sid)
    return result


def _session_state(agent_result: dict[str, Any]) -> dict[str, Any]:
    """The agent's answer for the session (to its ``session/new``, ``load`` or
    ``resume``), as ``session/load`` and ``session/resume`` answer it: its modes,
    configOptions, models, ... (the ``sessionId`` of a ``session/new`` left out)."""
    return {k: v for k, v in agent_result.items() if k != "sessionId"}


async def _session_prompt(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    sid = _session_id(params)
    prompt = params.get("prompt")
    prompt_id = prompt_id_param(params)
    channel = conn.channel(sid)         # subscribed before admission: no event is missed
    if len(channel.prompts) >= MAX_TRACKED_PROMPTS:
        raise ChannelLimitError(MAX_TRACKED_PROMPTS)
    if prompt_id is not None:
        try:
            known = rejoin_prompt(conn, channel, prompt_id, rpc_id)
        except PromptFailedError:
            await _after_its_events(conn, channel)
            raise
        if known is not None and known != PENDING:
            await _after_its_events(conn, channel)
        if known is not None:
            return DEFERRED if known == PENDING else known
    ticket = conn.bridge.send_prompt(sid, prompt, prompt_id=prompt_id)
    if rpc_id is not None:
        channel.track_prompt(ticket, rpc_id, detached=prompt_id is not None)
    try:   # a durable journal: committed before it counts as acknowledged
        await ticket.committed()
    except (JournalUnavailableError, SessionNotRestorableError):   # settled: answered here
        channel.prompts.pop(ticket.prompt_id, None)
        channel.detached.discard(ticket.prompt_id)
        raise
    conn.caller.prompt_accepted(sid, ticket.prompt_id, prompt, "acp")
    return DEFERRED


async def _after_its_events(conn: AcpConnection, channel: Any) -> None:
    """A settled prompt answered again: after the events published before it (with a
    durable journal they reach the stream once committed, after the settlement): the
    last published id, not the status's (the last committed)."""
    last = conn.bridge.published_event_id(channel.session_id)
    await channel.flush_through(last)


async def _session_cancel(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    sid = _session_id(params)
    await conn.bridge.cancel_session(sid)
    conn.caller.record("session.cancelled", sid)
    return {}


async def _session_close(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    sid = _session_id(params)
    await conn.bridge.close_session(sid, closed_by=conn.id)
    conn.caller.record("session.closed", sid)
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
    conn.caller.permission_answered(session_id, request_id, outcome, "acp")
    return {}


async def _forward(conn: AcpConnection, method: str, params: dict[str, Any]) -> Any:
    """A setter (``FORWARDED``) on the session's agent, through the bridge's one setter
    path (its events: ``bridge.setting_changes``); once accepted, in the audit log."""
    sid = _session_id(params)
    answer, change = await conn.bridge.set_setting(sid, method, params)
    if change is not None:
        conn.caller.setting_changed(sid, change.setting, change.old, change.new, "acp")
    return answer


METHODS: dict[str, Handler] = {
    "authenticate": _authenticate,
    "session/new": _session_new,
    "session/load": _session_load,
    "session/resume": _session_resume,
    "session/list": session_list,
    "session/prompt": _session_prompt,
    "session/cancel": _session_cancel,
    "session/close": _session_close,
    "session/permission": _session_permission,
}


# -- ACP v1.21: session/delete, session/fork, logout, $/cancel_request -------------------
OWN_SESSION_CAPABILITIES = ("list", "close", "delete")
# What the agent may offer that ``/acp`` does not pass on: a client's ``mcpServers``
# (read, never sent: the agent gets ``[]``) and ``additionalDirectories``.
NO_MCP = {"http": False, "sse": False}
NOT_PASSED_ON = ("additionalDirectories",)
# Unstable capabilities whose methods ``/acp`` cannot serve: ``providers/*`` and
# ``nes/start`` name no ACP session, and only session-scoped methods reach an agent
# (``passthrough``); ``positionEncoding`` is NES's.
NOT_SERVED = ("providers", "nes", "positionEncoding")


def with_own_capabilities(capabilities: dict[str, Any]) -> dict[str, Any]:
    """The agent's capabilities as ``/acp`` keeps them true: plus what it implements
    whatever the agent (``sessionCapabilities.list``: the server's own listing;
    ``close``: the server closes, the agent is told when it offers ``close``;
    ``delete``), advertised alike before the agent has started and after; minus what
    it does not pass on to the agent (``mcpCapabilities``: no MCP server of the client
    reaches it; ``sessionCapabilities.additionalDirectories``) and what it cannot
    serve (``NOT_SERVED``)."""
    session_caps = capabilities.get("sessionCapabilities")
    session_caps = dict(session_caps) if isinstance(session_caps, dict) else {}
    for name in OWN_SESSION_CAPABILITIES:
        if not isinstance(session_caps.get(name), dict):   # absent or null: not offered
            session_caps[name] = {}
    for name in NOT_PASSED_ON:
        session_caps.pop(name, None)
    served = {k: v for k, v in capabilities.items() if k not in NOT_SERVED}
    return {**served, "sessionCapabilities": session_caps, "mcpCapabilities": dict(NO_MCP)}


def initialize_connection(bridge: Bridge, conn: AcpConnection, agent_info: dict[str, Any],
                          params: dict[str, Any]) -> dict[str, Any]:
    """``initialize``'s answer for ``conn`` (``agent_info``: ``default_agent_info``),
    and the options the client asked for (``_meta["acp-server/resumable"]``,
    acknowledged in the answer's ``_meta``)."""
    result = initialize_result(bridge, agent_info, params, conn.id)
    conn.elicitation = offers_elicitation(params)
    if meta_value(params, RESUMABLE_META, object) is True:
        conn.resumable = True
        result["_meta"]["acp-server"]["resumable"] = True
    return result


async def _session_delete(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    """Close the session (its prompts fail, its streams end) after the agent's own
    ``session/delete`` when the agent offers it; a closed one the journal keeps (listed
    by ``session/list`` after the live ones) has its journal removed; an unknown
    session succeeds with nothing done (another principal's is no session:
    ``check_owner``)."""
    sid = _session_id(params)
    bridge = conn.bridge
    if not bridge.has_session(sid):   # its maker recalled and checked (``check_owner``)
        if await bridge.delete_ended(sid):
            conn.caller.record("session.closed", sid, how="delete")
        if not bridge.has_session(sid):   # else a load made it live meanwhile: close it
            return {}
    agent = bridge.session_status(sid).agent
    if bridge.agent_capability(agent, "sessionCapabilities", "delete") is not None:
        try:   # an agent that refuses keeps the session; one that never answers does not
            await bridge.forward(sid, "session/delete", {"sessionId": sid}, bounded=True)
        except AgentRequestTimeoutError as exc:
            log.warning("session %s: the agent did not answer session/delete (%s): the "
                        "session is closed here all the same", loggable(sid, 128), exc)
    with contextlib.suppress(SessionNotFoundError):
        await bridge.close_session(sid, reason="deleted", closed_by=conn.id)
        conn.caller.record("session.closed", sid, how="delete")
    return {}


async def _session_fork(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    """Unstable ACP ``session/fork``: our branch (behind the session's FIFO)."""
    sid = _session_id(params)
    conn.bridge.check_workspace(_cwd(params))
    with conn.channel_room():
        info = await conn.bridge.branch_session(sid, owner=conn.caller.name)
    claim(conn, info.session_id, "branch", forked_from=sid)
    conn.channel(info.session_id)
    return {**info.agent_result, "sessionId": info.session_id}


async def _logout(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    return {}


async def _cancel_request(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    """``$/cancel_request {requestId}``: a running request of this connection is
    cancelled (answered ``-32800``); a ``session/prompt`` has its turn cancelled."""
    target = params.get("requestId")
    if not isinstance(target, int | str) or isinstance(target, bool):
        raise InvalidParamsError('Invalid params: "requestId" must be a string or an integer')
    scope = conn.in_flight.get((type(target), target))
    if scope is not None:
        scope.cancel()
    else:
        any(channel.cancel_request(target) for channel in list(conn.channels.values()))
    return {}


V1_METHODS: dict[str, Handler] = {
    "session/delete": _session_delete,
    "session/fork": _session_fork,
    "logout": _logout,
    "$/cancel_request": _cancel_request,
}


def _other(method: str, is_request: bool) -> Handler:
    """The handler of a method without one of its own: forwarded or passed through."""
    async def handle(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
        if method in FORWARDED:
            return await _forward(conn, method, params)
        return await pass_through(conn, method, params, is_request)

    return handle


async def _run(conn: AcpConnection, rpc_id: RpcId, is_request: bool, handler: Handler,
               params: dict[str, Any]) -> Any:
    """Run a handler; a request's under a cancel scope that ``$/cancel_request`` finds
    (``RequestCancelledError`` when it was cancelled)."""
    if not is_request:
        return await handler(conn, rpc_id, params)
    key = (type(rpc_id), rpc_id)
    with anyio.CancelScope() as scope:
        if conn.closed:   # nobody will read the answer: a spawn must not take a slot
            scope.cancel()
        conn.in_flight[key] = scope
        try:
            return await handler(conn, rpc_id, params)
        finally:
            if conn.in_flight.get(key) is scope:
                del conn.in_flight[key]
    raise RequestCancelledError()


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
    if not conn.bridge.has_session(sid):
        return conn
    try:
        return conn.channel(sid)
    except BridgeError:
        return conn


async def dispatch(conn: AcpConnection, msg: Message, params: dict[str, Any]) -> None:
    """Run one request or notification; its reply (if any) goes to a stream."""
    method = msg.method
    assert isinstance(method, str)
    rpc_id: RpcId = None if msg.id is UNSET else msg.id
    is_request = msg.id is not UNSET
    target: AcpConnection | SessionChannel = conn   # refused before it runs: the connection
    try:   # any fault is answered (an exception here would end a WebSocket)
        if method in RECALLING and isinstance(params.get("sessionId"), str):
            await conn.bridge.recall_owner(params["sessionId"])   # even a forgotten maker
        check_owner(conn, method, params)
        target = _reply_target(conn, method, params)
        handler = METHODS.get(method) or V1_METHODS.get(method) or _other(method, is_request)
        result = await _run(conn, rpc_id, is_request, handler, params)
    except Exception as exc:
        if not isinstance(exc, (BridgeError, StoreUnavailableError, *ENGINE_ERRORS)):
            log.exception("acp %s failed", loggable(method, 128))   # logged as answered
        if is_request:
            target.push(encode_bridge_error(rpc_id, exc))
        return
    closing = method in CLOSING and isinstance(target, SessionChannel)
    if closing:
        target.drain_now()   # the turn's last events and prompt replies come first
    if is_request and result is not DEFERRED:
        target.push(encode_result(rpc_id, {} if result is None else result))
    if closing:
        conn.drop_channel(target.session_id)   # after the reply: it is still delivered


def answer_agent_request(conn: AcpConnection, msg: Message) -> None:
    """A client's JSON-RPC response to an agent-to-client request (a permission
    request): the first answer wins; an error answer counts as ``cancelled``.
    Answers to unknown ids are ignored (the request was resolved elsewhere); an
    answer whose ``result`` cannot be decoded (a number out of range) is ignored too,
    logged, and the question stays open for another answer."""
    request_id = msg.id
    if not isinstance(request_id, str) or request_id not in conn.pending_requests:
        return
    try:
        result = decode_value(msg.result) if msg.error is UNSET else None
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
        log.info("acp %s: unreadable answer to %s ignored: %s", conn.id, request_id, exc)
        return
    session_id = conn.pending_requests.pop(request_id)
    if conn.bridge.elicitation_pending(request_id):
        answer_elicitation(conn, msg, session_id, result)
        return
    outcome: dict[str, Any] = {"outcome": "cancelled"}
    if msg.error is UNSET:
        found = result.get("outcome") if isinstance(result, dict) else None
        if isinstance(found, dict):
            outcome = found
    try:
        conn.bridge.respond_to_permission(request_id, outcome, session_id=session_id)
        conn.caller.permission_answered(session_id, request_id, outcome, "acp")
    except InvalidPermissionOptionError:
        conn.expect_answer(request_id, session_id)   # still pending: may be answered again
        log.info("acp %s: invalid permission option for %s", conn.id, request_id)
    except BridgeError as exc:
        log.debug("acp %s: permission answer for %s ignored: %s", conn.id, request_id, exc)
