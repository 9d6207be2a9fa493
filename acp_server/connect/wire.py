"""JSON-RPC 2.0 as the adapter relays it: top-level members kept as raw JSON, so
nothing it does not rewrite is re-serialized.

    message = parse(line)                        # ParseError (-32700) / InvalidRequest (-32600)
    message.kind, message.id, message.method     # "request" | "notification" | "response"
    payload = with_id(message.members, 7)        # the same message under another id
    members = set_meta(members, "acp-server/promptId", "p-1")   # params._meta[key] = value
    payload, event = take_event_meta(members)    # our event marker removed, if any

Contracts:

* ``parse`` accepts exactly one JSON object with ``"jsonrpc": "2.0"`` that is a
  request (``method`` and ``id``), a notification (``method``, no ``id``) or a response
  (``id`` and one of ``result`` / ``error``); an ``id`` is a string, an integer or null.
  Anything else raises, with the id when one could be read (for the error answer).
* Unknown members, ``params``, ``result`` and ``error`` stay ``msgspec.Raw``: their
  bytes are written back as they came. Only ``params`` is decoded to be changed
  (``set_meta``, ``take_event_meta``), one level deep; ``set_meta`` raises
  ``InvalidParams`` (-32602) when ``params`` is not an object.
"""

from __future__ import annotations

from typing import Any

import msgspec

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800
EVENT_META = "acp-server/event"

Members = dict[str, msgspec.Raw]
RpcId = int | str | None

_members: msgspec.json.Decoder[Members] = msgspec.json.Decoder(Members)
_any: msgspec.json.Decoder[Any] = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
_NO_ID = object()
_MARKER = EVENT_META.encode()


class ParseError(Exception):
    code = PARSE_ERROR


class InvalidRequest(Exception):
    code = INVALID_REQUEST

    def __init__(self, message: str, rpc_id: RpcId = None) -> None:
        super().__init__(message)
        self.id = rpc_id


class InvalidParams(Exception):
    """``params`` is not an object where the adapter must add to its ``_meta``."""

    code = INVALID_PARAMS


class Message:
    """One JSON-RPC message: its members (raw) and what routing needs."""

    __slots__ = ("members", "kind", "id", "method", "raw")

    def __init__(self, members: Members, kind: str, rpc_id: RpcId, method: str | None,
                 raw: bytes) -> None:
        self.members = members
        self.kind = kind
        self.id = rpc_id
        self.method = method
        self.raw = raw

    @property
    def is_request(self) -> bool:
        return self.kind == "request"

    @property
    def is_response(self) -> bool:
        return self.kind == "response"

    def params(self) -> dict[str, Any]:
        """The params object decoded (``{}`` when absent or not an object)."""
        raw = self.members.get("params")
        value = _any.decode(raw) if raw is not None else None
        return value if isinstance(value, dict) else {}


def parse(line: bytes) -> Message:
    try:
        members = _members.decode(line)
    except msgspec.ValidationError:
        raise InvalidRequest("Invalid Request: expected a JSON-RPC object") from None
    except msgspec.DecodeError:
        raise ParseError("Parse error: not JSON") from None
    rpc_id = _read_id(members)
    shown: RpcId = None if rpc_id is _NO_ID else rpc_id   # type: ignore[assignment]
    if members.get("jsonrpc") is None or _any.decode(members["jsonrpc"]) != "2.0":
        raise InvalidRequest('Invalid Request: "jsonrpc" must be "2.0"', shown)
    method: Any = _any.decode(members["method"]) if "method" in members else None
    if method is not None:
        if not isinstance(method, str) or not method:
            raise InvalidRequest('Invalid Request: "method" must be a string', shown)
        kind = "notification" if rpc_id is _NO_ID else "request"
    elif rpc_id is not _NO_ID and (("result" in members) != ("error" in members)):
        kind = "response"
    else:
        raise InvalidRequest("Invalid Request: neither a request nor a response", shown)
    return Message(members, kind, shown, method, line)


def _read_id(members: Members) -> Any:
    if "id" not in members:
        return _NO_ID
    try:
        value = _any.decode(members["id"])
    except msgspec.DecodeError:
        return None
    if value is not None and (not isinstance(value, int | str) or isinstance(value, bool)):
        raise InvalidRequest('Invalid Request: "id" must be a string, an integer or null')
    return value


def encode(members: Members) -> bytes:
    return _encoder.encode(members)


def with_id(members: Members, rpc_id: RpcId) -> bytes:
    return encode({**members, "id": msgspec.Raw(_encoder.encode(rpc_id))})


def error(rpc_id: RpcId, code: int, message: str, data: Any = None) -> bytes:
    body: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    return _encoder.encode({"jsonrpc": "2.0", "id": rpc_id, "error": body})


def result(rpc_id: RpcId, value: Any) -> bytes:
    return _encoder.encode({"jsonrpc": "2.0", "id": rpc_id, "result": value})


def request(rpc_id: RpcId, method: str, params: Any) -> bytes:
    return _encoder.encode({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})


def notification(method: str, params: Any) -> bytes:
    return _encoder.encode({"jsonrpc": "2.0", "method": method, "params": params})


def decode(raw: msgspec.Raw | bytes) -> Any:
    return _any.decode(raw)


def set_meta(members: Members, key: str, value: Any, *, replace: bool = True) -> Members:
    """``members`` with ``params._meta[key] = value`` (kept when present and not
    ``replace``); ``InvalidParams`` when ``params`` is there and not an object."""
    try:
        params = _members.decode(members["params"]) if "params" in members else {}
    except msgspec.ValidationError:
        raise InvalidParams("Invalid params: expected an object") from None
    meta: Any = _any.decode(params["_meta"]) if "_meta" in params else None
    meta = meta if isinstance(meta, dict) else {}
    if replace or key not in meta:
        meta[key] = value
    params["_meta"] = msgspec.Raw(_encoder.encode(meta))
    return {**members, "params": msgspec.Raw(_encoder.encode(params))}


def event_meta(members: Members) -> dict[str, Any] | None:
    """The ``params._meta["acp-server/event"]`` marker, when there is one."""
    raw = members.get("params")
    if raw is None or _MARKER not in bytes(raw):   # the common case: no decode
        return None
    params = _members.decode(raw)
    meta = _any.decode(params["_meta"]) if "_meta" in params else None
    found = meta.get(EVENT_META) if isinstance(meta, dict) else None
    return found if isinstance(found, dict) else None


def without_event_meta(members: Members) -> bytes:
    """The message with the marker removed (and ``_meta`` when nothing else is in it)."""
    params = _members.decode(members["params"])
    meta = _any.decode(params["_meta"])
    meta.pop(EVENT_META, None)
    if meta:
        params["_meta"] = msgspec.Raw(_encoder.encode(meta))
    else:
        del params["_meta"]
    return encode({**members, "params": msgspec.Raw(_encoder.encode(params))})
