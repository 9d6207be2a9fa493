"""``GET /acp`` with ``Upgrade: websocket``: the same JSON-RPC traffic on one socket.

    $ websocat ws://127.0.0.1:4170/acp
    > {"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}
    < {"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,...}}

Contracts:

* One JSON-RPC message per text frame, both ways; binary frames are ignored; a
  batch, malformed JSON, a non-JSON-RPC message or a request with ``id: null``
  gets an error frame (``inbound``: the rules of a POST body). So does a
  message its principal may not send (a scope it lacks, its rate limit:
  ``access.message_access``, ``data.errorKind`` ``forbidden`` /
  ``rate_limit_exceeded``); the socket stays open. Revoking the credential closes
  the socket with 1008.
* The first message must be ``initialize`` and must arrive within
  ``INITIALIZE_TIMEOUT_S`` (30 s), else the socket closes with 1002 (after the
  error frame when the first frame was not a JSON-RPC message). Past the
  connection cap the answer is the ``-32603`` error frame, then close 1013.
* The upgrade response carries ``Acp-Connection-Id``. Every stream of the
  connection (its own and every session's) is written to the socket; closing the
  socket closes the connection as a DELETE would. For a resumable connection only a
  client close frame with code 1000 is that deliberate close; any other end (another
  code, no close frame, a network drop) is a lost connection, whose sessions and
  permission requests linger for the registry's ``resume_grace_s``.
* The handshake is checked by the same ``GuardPolicy.check`` as every HTTP request
  (the front layer leaves WebSocket scopes to this door): Host, Origin, the token as
  ``Authorization: Bearer <token>`` or ``Sec-WebSocket-Protocol:
  qwen-bearer.<base64url(token)>``, loopback clients only without a token (the
  answer never echoes that secret: ``chosen_subprotocol``). A refusal
  is an HTTP answer in this door's shape where the server supports it
  (``websocket.http.response``: its status, e.g. 401, 403, 421), else a close before
  the handshake completes (the server answers 403).
"""

from __future__ import annotations

import logging
import re

import anyio
import anyio.abc
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from acp_server.acp_http.config import AcpConfig
from acp_server.acp_http.connection import AcpConnection, SessionChannel
from acp_server.acp_http.access import denial_error, denied_request, message_access
from acp_server.acp_http.dispatch import (
    InvalidParamsError,
    answer_agent_request,
    dispatch,
    default_agent_info,
    initialize_connection,
    request_params,
)
from acp_server.acp_http.registry import ConnectionCapError, ConnectionRegistry
from acp_server.acp_http.resume import sent_again
from acp_server.acp_http.streamable import REQUEST_ONLY
from acp_server.acp_http.streams import FrameSource
from acp_server.acp_http.inbound import BATCH_MESSAGE, BatchRefused, read_message, refusal
from acp_server.acp_http.errors import render_refusal
from acp_server.http.policy import BEARER_PROTOCOL, GuardPolicy, Refusal
from acp_server.principals import Caller, caller_of
from acp_server.principals.streams import stream_id
from bridge.ids import uuid4_str
from bridge.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    UNSET,
    JsonRpcError,
    Message,
    encode_error,
    encode_result,
)

log = logging.getLogger("acp_server.acp_http")

INITIALIZE_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 2.0
# Methods handled inline, in arrival order (they never wait on the agent for long);
# the others run concurrently so that a slow session/new does not hold the socket.
INLINE_METHODS = frozenset({"session/prompt", "session/cancel", "$/cancel_request"})


# -- handshake checks -----------------------------------------------------------------------
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def _protocols(ws: WebSocket) -> list[str]:
    header = ws.headers.get("sec-websocket-protocol", "")
    return [p.strip() for p in header.split(",") if p.strip()]


def chosen_subprotocol(offered: list[str]) -> str | None:
    """The subprotocol the handshake answers: the first offered one that is not a
    ``qwen-bearer.*`` credential, else none. The answer never carries the token (it
    would land in every proxy's and client's log of response headers); a client that
    must see a subprotocol chosen (a browser, the ``ws`` package) offers a marker beside
    the bearer one, as ``qwen serve``'s web shell does (``qwen-ws``), and gets it. An
    entry that is no HTTP token (RFC 9110 5.6.2: what a subprotocol name must be; ``a b``,
    ``"q"``) is never chosen: uvicorn's WebSocket layer refuses such a header itself."""
    return next((p for p in offered
                 if not p.startswith(BEARER_PROTOCOL) and _TOKEN.fullmatch(p)), None)


async def handshake_refusal(ws: WebSocket, policy: GuardPolicy) -> Refusal | None:
    """The shared guard's answer to this handshake (``GuardPolicy.check``: Host, Origin,
    the credential or the bearer subprotocol, loopback only without one; a stored
    token not cached is looked up, ``check_async``)."""
    return await policy.check_async(ws.scope)


async def refuse_handshake(ws: WebSocket, refusal: Refusal) -> None:
    """The refusal as an HTTP answer in this door's shape when the server can send one
    (the ``websocket.http.response`` extension), else a close before the handshake
    completes (1008; the server answers 403)."""
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        content_type, body = render_refusal(refusal)
        await ws.send({"type": "websocket.http.response.start", "status": refusal.status,
                       "headers": [(b"content-type", content_type),
                                   (b"content-length", str(len(body)).encode()),
                                   *refusal.headers]})
        await ws.send({"type": "websocket.http.response.body", "body": body})
        return
    await ws.close(code=1008)


# -- the socket ---------------------------------------------------------------------------
class _Socket:
    """Serialized writes of text frames to one WebSocket."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self.lock = anyio.Lock()

    async def send(self, payload: bytes) -> None:
        async with self.lock:
            await self.ws.send_text(payload.decode())


async def acp_websocket(ws: WebSocket, *, registry: ConnectionRegistry,
                        config: AcpConfig) -> None:
    """``/acp`` over one WebSocket; the registry holds the connection (and the bridge)."""
    refusal = await handshake_refusal(ws, config.guard)
    if refusal is not None:
        await refuse_handshake(ws, refusal)
        return
    connection_id = uuid4_str()
    await ws.accept(subprotocol=chosen_subprotocol(_protocols(ws)),
                    headers=[(b"acp-connection-id", connection_id.encode())])
    socket = _Socket(ws)
    limit = config.max_body_bytes
    caller = caller_of(ws.scope)
    try:
        conn = await _handshake(ws, socket, connection_id, registry, limit, caller)
    except WebSocketDisconnect:
        return   # gone before it was served (a write to it failed): nothing kept
    if conn is None:
        return
    deliberate = False
    try:
        # a revoked token ends the socket (1008) within about a second; so does a
        # credential configured after a ``local`` socket opened
        with caller.gate.streams.hold(stream_id(caller.principal)) as held:
            async with anyio.create_task_group() as tg:
                conn.stream_opened()
                tg.start_soon(_forward, conn, socket, tg.cancel_scope)
                conn.on_channel = lambda channel: _attach_channel(tg, channel, socket)
                try:
                    deliberate = await _receive_loop(ws, socket, conn, tg, limit)
                except WebSocketDisconnect:   # a write found the client gone: lost
                    pass
                tg.cancel_scope.cancel()
        if held.cancelled_caught and ws.client_state == WebSocketState.CONNECTED:
            with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                try:
                    await ws.close(code=1008, reason="credential revoked")
                except (RuntimeError, OSError, WebSocketDisconnect):
                    pass
    finally:
        conn.on_channel = None
        conn.stream_closed()
        registry.close(conn, lost=not deliberate)
        if ws.client_state == WebSocketState.CONNECTED:
            # Bounded: a server that has stopped (granian at exit) may never complete it.
            with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                try:
                    await ws.close()
                except (RuntimeError, OSError, WebSocketDisconnect):
                    pass
    if conn.resumable and registry.lingering:
        await registry.sweep_after_grace()   # its permission requests wait for it, bounded


async def _handshake(ws: WebSocket, socket: _Socket, connection_id: str,
                     registry: ConnectionRegistry, limit: int,
                     caller: Caller) -> AcpConnection | None:
    """Wait for ``initialize``; answer it. ``None`` when the socket was closed instead."""
    text: str | None = None
    with anyio.move_on_after(INITIALIZE_TIMEOUT_S):
        try:
            text = await _next_text(ws, limit)
        except WebSocketDisconnect:
            return None
    if text is None:
        await ws.close(code=1002, reason="initialize timeout")
        return None
    try:
        msg = read_message(text)
        params = request_params(msg)
    except JsonRpcError as exc:   # not a message, or an id null: answered, then closed
        await socket.send(refusal(exc))
        msg, params = None, {}
    except (BatchRefused, InvalidParamsError):
        msg, params = None, {}
    if msg is None or msg.method != "initialize" or msg.id is UNSET:
        await ws.close(code=1002, reason="first message must be initialize")
        return None
    denial = caller.check(message_access(msg))
    if denial is not None:
        caller.denied(denial, denied_request(msg))
        await socket.send(denial_error(msg.id, denial))
        await ws.close(code=1008, reason=denial.code)
        return None
    agent_info = await default_agent_info(registry.bridge)   # started, if it is not
    try:
        conn = registry.create(connection_id, websocket=True, caller=caller)
    except ConnectionCapError as exc:
        await socket.send(encode_error(msg.id, INTERNAL_ERROR, str(exc)))
        await ws.close(code=1013, reason="too many connections")
        return None
    result = initialize_connection(registry.bridge, conn, agent_info, params)
    try:
        await socket.send(encode_result(msg.id, result))
    except WebSocketDisconnect:
        registry.close(conn)   # gone before its answer: its slot is free again
        raise
    return conn


FRAME_TOO_BIG = 1009
DELIBERATE_CLOSE = 1000   # the client's close frame with it: the connection is done


async def _next_text(ws: WebSocket, limit: int) -> str:
    """The next text frame (binary frames are skipped). A frame over the HTTP body
    cap (``AcpConfig.max_body_bytes``, ``limit``) closes the socket with 1009."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        text = message.get("text")
        data = message.get("bytes") if text is None else None
        if _frame_size(text, data, limit) > limit:
            await ws.close(code=FRAME_TOO_BIG, reason="frame too large")
            raise WebSocketDisconnect(FRAME_TOO_BIG)
        if text is not None:
            return text  # type: ignore[no-any-return]


def _frame_size(text: str | None, data: bytes | None, limit: int) -> int:
    if text is not None:   # at most 4 bytes a character: encode only when it may matter
        return len(text) if len(text) * 4 <= limit else len(text.encode())
    return len(data) if data is not None else 0


def _attach_channel(tg: anyio.abc.TaskGroup, channel: SessionChannel, socket: _Socket) -> None:
    channel.reader_attached = True
    tg.start_soon(_forward, channel, socket, tg.cancel_scope)


async def _forward(source: FrameSource, socket: _Socket, connection: anyio.CancelScope) -> None:
    """Write ``source``'s frames. A write that finds the client gone ends the
    ``connection`` (its scope cancelled, no error raised into the task group, so a
    cancel from outside still propagates); that frame is not counted as sent."""
    while await source.wait_ready():
        frame = source.pop()
        if frame is not None:
            try:
                await socket.send(frame.payload)
            except WebSocketDisconnect:
                connection.cancel()
                return
            source.sent(1)


async def _receive_loop(ws: WebSocket, socket: _Socket, conn: AcpConnection,
                        tg: anyio.abc.TaskGroup, limit: int) -> bool:
    """Serve the client's frames until it goes; ``True`` when it closed the socket on
    purpose (close code 1000: like DELETE), not lost it."""
    while True:
        try:
            text = await _next_text(ws, limit)
        except WebSocketDisconnect as exc:
            return exc.code == DELIBERATE_CLOSE
        msg = await _decode(text, socket)
        if msg is None:
            continue
        denial = conn.caller.check(message_access(msg))
        if denial is not None and not sent_again(conn.bridge, conn.caller, msg, denial):
            # 403 / 429 as an error frame; the socket stays open
            conn.caller.denied(denial, denied_request(msg))
            if msg.is_request:
                await socket.send(denial_error(msg.id, denial))
            continue
        if msg.is_response:
            answer_agent_request(conn, msg)
            continue
        if conn.replies_full():   # the client does not read its replies: fail it
            await ws.close(code=1013, reason="reply buffer full")
            return False
        rpc_id = None if msg.id is UNSET else msg.id
        try:
            params = request_params(msg)
        except InvalidParamsError as exc:
            if msg.is_request:
                await socket.send(encode_error(rpc_id, INVALID_PARAMS, str(exc)))
            continue
        if msg.method == "initialize":
            if msg.is_request:
                await socket.send(encode_error(rpc_id, INVALID_REQUEST, "Already initialized"))
            continue
        if msg.is_notification and msg.method in REQUEST_ONLY:
            await socket.send(encode_error(None, INVALID_REQUEST, f"{msg.method} must be a request"))
            continue
        if msg.method in INLINE_METHODS:
            await dispatch(conn, msg, params)
        else:
            tg.start_soon(dispatch, conn, msg, params)


async def _decode(text: str, socket: _Socket) -> Message | None:
    """The frame's message, or ``None`` once its error frame is sent (the rules of a
    POST body, ``inbound``; a batch is -32600 here); the socket stays open."""
    try:
        return read_message(text)
    except BatchRefused:
        await socket.send(encode_error(None, INVALID_REQUEST, BATCH_MESSAGE))
    except JsonRpcError as exc:
        await socket.send(refusal(exc))
    return None
