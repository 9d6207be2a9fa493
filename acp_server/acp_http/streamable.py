"""``POST`` / ``GET`` / ``DELETE /acp``: the Streamable HTTP transport (ACP RFD #721,
as ``qwen serve`` 0.24.4 serves it).

    $ curl -si localhost:4170/acp -H 'Content-Type: application/json' \\
        -d '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}'
    HTTP/1.1 200 OK
    acp-connection-id: 6f1c...
    $ curl -N localhost:4170/acp -H 'Accept: text/event-stream' -H "Acp-Connection-Id: $C"

Status rules (each answer with a JSON-RPC error body unless noted):

* Principals: the message's needs (``access.message_access``) are checked first: a
  scope the credential lacks → 403, its rate limit → 429 with ``Retry-After`` (a
  JSON-RPC error, ``data.errorKind`` ``forbidden`` / ``rate_limit_exceeded``). A
  connection is its opener's: another principal naming it gets 404, as for an
  unknown one.
* POST: ``Content-Type`` not ``application/json`` → 415; a batch array → 501
  ``{"error": ...}``; malformed JSON → 400 ``-32700``; not JSON-RPC 2.0 (``[]``
  too) → 400 ``-32600`` (``inbound``: the rules of a WebSocket frame too); body over
  ``max_body_bytes`` → 413. ``initialize`` → 200 with the response inline and
  ``Acp-Connection-Id`` (503 + ``Retry-After: 5`` + ``-32603`` at the connection
  cap; 400 when it carries an ``Acp-Connection-Id``). Anything else
  needs ``Acp-Connection-Id`` (missing → 400 ``-32600``; unknown → 404 ``-32600``);
  ``Acp-Session-Id`` ≠ ``params.sessionId`` → 400 ``-32602``; a session-scoped method
  names its session by ``Acp-Session-Id``, else by ``params.sessionId`` (as qwen's
  ``AcpHttpTransport`` sends it), with neither → 400 ``-32600``; otherwise 202, empty
  body (sent before the message runs), and the reply arrives on a stream.
* GET: ``Accept`` without ``text/event-stream`` → 406; connection header rules as
  POST; a second reader of the same stream → 409. With ``Acp-Session-Id`` it is that
  session's stream (opened leniently before ``session/load``: 200, buffered), with
  ``Last-Event-ID`` (and ``X-Qwen-Event-Epoch``) replaying missed bus events.
* DELETE: connection header rules as POST; 202, the connection is closed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from acp_server.acp_http.connection import AcpConnection, SessionChannel
from acp_server.acp_http.access import denial_error, denied_request, message_access
from acp_server.acp_http.dispatch import (
    HEADER_REQUIRED,
    InvalidParamsError,
    answer_agent_request,
    dispatch,
    encode_bridge_error,
    default_agent_info,
    initialize_connection,
    request_params,
)
from acp_server.acp_http.config import AcpConfig
from acp_server.acp_http.registry import ConnectionCapError, ConnectionRegistry
from acp_server.acp_http.resume import sent_again
from acp_server.acp_http.streams import FrameStream
from acp_server.acp_http.inbound import BatchRefused, read_message, refusal
from acp_server.http import body
from acp_server.http.headers import accepts, event_epoch, last_event_id
from acp_server.principals import caller_of
from bridge.errors import BridgeError
from bridge.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    JsonRpcError,
    Message,
    encode_error,
    encode_result,
)

CONNECTION_HEADER = "acp-connection-id"
SESSION_HEADER = "acp-session-id"
_JSON = "application/json"
_BATCH = b'{"error":"Batch JSON-RPC requests are not supported"}'
_UNSUPPORTED_MEDIA = b'{"error":"Content-Type must be application/json"}'
_NOT_ACCEPTABLE = b'{"error":"Accept must include text/event-stream"}'
# A session created as a notification would have an id nobody can learn and hold a
# --max-sessions slot until reaped: these are refused (400 -32600) unless requests.
REQUEST_ONLY = frozenset({"session/new", "session/load", "session/resume"})


def _json(status: int, body: bytes, headers: dict[str, str] | None = None) -> Response:
    return Response(body, status, headers, _JSON)


def _rpc_error(status: int, rpc_id: Any, code: int, message: str,
               headers: dict[str, str] | None = None) -> Response:
    return _json(status, encode_error(rpc_id, code, message), headers)


def _connection(request: Request, registry: ConnectionRegistry,
                rpc_id: Any = None) -> AcpConnection | Response:
    """The connection the request names; another principal's is unknown (404): the
    whole principal, so a token re-created under a revoked token's name does not
    inherit its connections (nor the old token's scopes, which they carry)."""
    connection_id = request.headers.get(CONNECTION_HEADER)
    if not connection_id:
        return _rpc_error(400, rpc_id, INVALID_REQUEST, "Missing Acp-Connection-Id")
    conn = registry.get(connection_id)
    if conn is None or not conn.caller.principal.same(caller_of(request.scope).principal):
        return _rpc_error(404, rpc_id, INVALID_REQUEST, "Unknown Acp-Connection-Id")
    return conn


# -- POST ---------------------------------------------------------------------------------
async def _read_message(request: Request, limit: int) -> Message | Response:
    content_type = request.headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() != _JSON:
        return _json(415, _UNSUPPORTED_MEDIA)
    try:
        raw = await body.read_body(request, limit=limit)
    except body.BodyTooLarge:
        return _json(413, msgspec.json.encode({"error": "Request body too large",
                                               "code": "payload_too_large", "limit": limit}))
    try:
        return read_message(raw)   # the same rules as a WebSocket frame
    except BatchRefused:
        return _json(501, _BATCH)
    except JsonRpcError as exc:   # -32700 / -32600
        return _json(400, refusal(exc))


async def post_acp(request: Request, registry: ConnectionRegistry,
                   config: AcpConfig) -> Response:
    registry.sweep()
    msg = await _read_message(request, config.max_body_bytes)
    if isinstance(msg, Response):
        return msg
    rpc_id = None if msg.is_notification or msg.id is msgspec.UNSET else msg.id
    caller = caller_of(request.scope)
    denial = caller.check(message_access(msg))
    if denial is not None and not sent_again(registry.bridge, caller, msg, denial,
                                             request.headers.get("acp-session-id")):
        # a scope it lacks (403), its rate limit (429; not a prompt sent again)
        caller.denied(denial, denied_request(msg))
        return _json(denial.status, denial_error(rpc_id, denial),
                     {k.decode(): v.decode() for k, v in denial.headers})
    try:
        params = request_params(msg) if not msg.is_response else {}
    except InvalidParamsError as exc:
        return _rpc_error(400, rpc_id, INVALID_PARAMS, str(exc))
    if msg.method == "initialize":
        return await _initialize(request, registry, msg, params)
    if msg.is_notification and msg.method in REQUEST_ONLY:
        return _rpc_error(400, None, INVALID_REQUEST, f"{msg.method} must be a request")
    conn = _connection(request, registry, rpc_id)
    if isinstance(conn, Response):
        return conn
    if msg.is_response:
        answer_agent_request(conn, msg)
        return Response(status_code=202)
    if conn.replies_full():   # nobody takes the replies: refuse more, memory stays bounded
        return _rpc_error(503, rpc_id, INTERNAL_ERROR,
                          "Reply buffer full: open the stream and read it",
                          {"Retry-After": "5"})
    header_sid = request.headers.get(SESSION_HEADER)
    params_sid = params.get("sessionId")
    if header_sid is not None and isinstance(params_sid, str) and header_sid != params_sid:
        return _rpc_error(400, rpc_id, INVALID_PARAMS, "Mismatched Acp-Session-Id")
    if header_sid is None and msg.method in HEADER_REQUIRED and not isinstance(params_sid, str):
        return _rpc_error(400, rpc_id, INVALID_REQUEST,
                          f"Missing Acp-Session-Id for {msg.method}")
    if header_sid is not None and params_sid is None:
        params["sessionId"] = header_sid       # the header names the session
    # The 202 is sent before the message runs, so that no reply can reach a stream
    # before the POST that asked for it has its answer (qwen's AcpHttpTransport and
    # the ACP TypeScript client register the request only once the POST returned).
    return Response(status_code=202, background=BackgroundTask(dispatch, conn, msg, params))


async def _initialize(request: Request, registry: ConnectionRegistry, msg: Message,
                params: dict[str, Any]) -> Response:
    rpc_id = None if msg.id is msgspec.UNSET else msg.id
    if msg.is_notification:
        return _rpc_error(400, None, INVALID_REQUEST, "initialize must be a request")
    if request.headers.get(CONNECTION_HEADER):
        return _rpc_error(400, rpc_id, INVALID_REQUEST,
                          "initialize must not carry Acp-Connection-Id")
    agent_info = await default_agent_info(registry.bridge)   # started, if it is not
    try:
        conn = registry.create(caller=caller_of(request.scope))
    except ConnectionCapError as exc:
        return _rpc_error(503, rpc_id, INTERNAL_ERROR, str(exc), {"Retry-After": "5"})
    result = initialize_connection(registry.bridge, conn, agent_info, params)
    return _json(200, encode_result(rpc_id, result), {"Acp-Connection-Id": conn.id})


# -- GET ----------------------------------------------------------------------------------
async def get_acp(request: Request, registry: ConnectionRegistry,
                  config: AcpConfig) -> Response | ASGIApp:
    registry.sweep()
    if not accepts(request, "text/event-stream"):
        return _json(406, _NOT_ACCEPTABLE)
    conn = _connection(request, registry)
    if isinstance(conn, Response):
        return conn
    heartbeat_s = config.heartbeat_s
    session_id = request.headers.get(SESSION_HEADER)

    if session_id is None:
        release = _attach(conn, conn, "Connection")
        if isinstance(release, Response):
            return release
        return FrameStream(conn, heartbeat_s=heartbeat_s, on_close=release,
                           after_disconnect=registry.sweep_after_grace)
    try:
        channel = conn.channel(session_id)
        if not channel.reader_attached:
            _rewind(request, channel)
    except BridgeError as exc:   # the bus's subscriber cap, or too many session streams
        return _json(429, encode_bridge_error(None, exc), {"Retry-After": "5"})
    release = _attach(conn, channel, "Session")
    if isinstance(release, Response):
        return release
    headers = [(b"x-qwen-event-epoch", channel.epoch.encode())] if channel.epoch else []
    return FrameStream(channel, heartbeat_s=heartbeat_s, on_close=release,
                       after_disconnect=registry.sweep_after_grace, headers=headers)


def _attach(conn: AcpConnection, stream: AcpConnection | SessionChannel,
            name: str) -> Callable[[], None] | Response:
    """Take ``stream``'s one reader slot (409 when taken) and count the open stream;
    the answer is the release that undoes both, once the stream ends."""
    if stream.reader_attached:
        return _rpc_error(409, None, INVALID_REQUEST,
                          f"{name} stream already has an active receiver")
    stream.reader_attached = True
    conn.stream_opened()

    def release() -> None:
        stream.detach_reader()
        conn.stream_closed()

    return release


def _rewind(request: Request, channel: SessionChannel) -> None:
    last_id = last_event_id(request)
    if last_id is not None:
        channel.rewind(last_id, event_epoch(request))


# -- DELETE -------------------------------------------------------------------------------
async def delete_acp(request: Request, registry: ConnectionRegistry) -> Response:
    registry.sweep()
    conn = _connection(request, registry)
    if isinstance(conn, Response):
        return conn
    registry.close(conn)
    return Response(status_code=202)


async def acp_endpoint(request: Request, *, registry: ConnectionRegistry,
                       config: AcpConfig) -> Response | ASGIApp:
    """``/acp`` over HTTP; the registry holds the connections (and the bridge)."""
    if request.method == "POST":
        return await post_acp(request, registry, config)
    if request.method == "GET":
        return await get_acp(request, registry, config)
    if request.method == "DELETE":
        return await delete_acp(request, registry)
    # HEAD (Starlette adds it to a GET route): no stream to open, nothing to close
    return _rpc_error(405, None, INVALID_REQUEST, "Method Not Allowed",
                      {"Allow": "GET, POST, DELETE"})
