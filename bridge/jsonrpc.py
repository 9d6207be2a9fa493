"""JSON-RPC 2.0 wire codec (msgspec), shared by the stdio agent transport, the
reference agent and the HTTP ``/acp`` front door::

    line = encode_request(0, "initialize", {"protocolVersion": 1})
    msg = decode_message(b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1}}')
    if msg.is_response and msg.error is UNSET:
        result = decode_value(msg.result)      # plain dicts/lists: unknown fields survive

Contracts:

* ``decode_message`` validates only the envelope. ``params``, ``result`` and
  ``error.data`` stay ``msgspec.Raw`` (the exact bytes the peer sent), so a bridge can
  pass them through unchanged or decode them with ``decode_value`` into plain values.
  It never narrows them through a typed schema.
* ``id`` distinguishes "absent" (``UNSET``: a notification) from JSON ``null``
  (``None``: an error response to an unidentifiable request).
* Bad input raises ``JsonRpcParseError`` (-32700, not JSON: cut short, trailing
  characters, invalid UTF-8 in a member it reads, ``NaN``, or nested too deeply for
  the decoder) or ``JsonRpcInvalidRequest`` (-32600, JSON but not a JSON-RPC 2.0
  message); the latter carries the ``id`` when one could be read, for the error
  answer. Duplicate member names are JSON: the last one counts (as ``JSON.parse``).
  ``params`` / ``result`` / ``data`` are only skipped, their strings' UTF-8 not
  checked: a caller that needs that checks the bytes first.
* The ``encode_*`` helpers return one message as ``bytes`` without a trailing
  newline. ``params``/``result``/``data`` may be any msgspec-encodable value,
  including ``msgspec.Raw`` (written through verbatim).
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

__all__ = [
    "UNSET",
    "PARSE_ERROR",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "INVALID_PARAMS",
    "INTERNAL_ERROR",
    "AUTH_REQUIRED",
    "RESOURCE_NOT_FOUND",
    "REQUEST_CANCELLED",
    "ErrorObject",
    "Message",
    "JsonRpcError",
    "JsonRpcParseError",
    "JsonRpcInvalidRequest",
    "decode_message",
    "decode_value",
    "encode_value",
    "encode_request",
    "encode_notification",
    "encode_result",
    "encode_error",
]

# Standard JSON-RPC codes, plus the ACP-specific ones (acp.md §1.4).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
AUTH_REQUIRED = -32000
RESOURCE_NOT_FOUND = -32002
REQUEST_CANCELLED = -32800

JsonRpcId = int | str | None


class ErrorObject(msgspec.Struct, omit_defaults=True):
    """The ``error`` member of an error response; ``data`` is kept raw."""

    code: int
    message: str
    data: msgspec.Raw | UnsetType = UNSET


class Message(msgspec.Struct, omit_defaults=True):
    """Any incoming JSON-RPC message. Absent members are ``UNSET``.

    A request has ``method`` and ``id``; a notification has ``method`` and no ``id``;
    a response has no ``method`` and exactly one of ``result`` / ``error``.
    """

    jsonrpc: str | UnsetType = UNSET
    id: JsonRpcId | UnsetType = UNSET
    method: str | UnsetType = UNSET
    params: msgspec.Raw | UnsetType = UNSET
    result: msgspec.Raw | UnsetType = UNSET
    error: ErrorObject | UnsetType = UNSET

    @property
    def is_request(self) -> bool:
        return self.method is not UNSET and self.id is not UNSET

    @property
    def is_notification(self) -> bool:
        return self.method is not UNSET and self.id is UNSET

    @property
    def is_response(self) -> bool:
        return self.method is UNSET


class JsonRpcError(Exception):
    """Base for codec errors; ``code``/``message``/``data`` form the error answer."""

    code: int = INTERNAL_ERROR

    def __init__(self, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data


class JsonRpcParseError(JsonRpcError):
    """The bytes are not valid JSON (-32700). Answer with ``id: null``."""

    code = PARSE_ERROR


class JsonRpcInvalidRequest(JsonRpcError):
    """Valid JSON but not a JSON-RPC 2.0 message (-32600).

    ``id`` is the message's id when it could be read (else ``None``, the id to use
    for the error answer).
    """

    code = INVALID_REQUEST

    def __init__(self, message: str, data: Any = None, id: JsonRpcId = None) -> None:
        super().__init__(message, data)
        self.id = id


class _IdOnly(msgspec.Struct):
    id: Any = None


_message_decoder = msgspec.json.Decoder(Message)
_id_decoder = msgspec.json.Decoder(_IdOnly)
_value_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def _salvage_id(data: bytes) -> JsonRpcId:
    """Best effort: the id of an invalid message, for the -32600 answer."""
    try:
        found = _id_decoder.decode(data).id
    except msgspec.DecodeError:
        return None
    return found if isinstance(found, (int, str)) and not isinstance(found, bool) else None


def _is_structured(raw: msgspec.Raw) -> bool:
    """``params`` must be an object or an array (JSON-RPC 2.0 §4.2)."""
    text = bytes(raw).lstrip()
    return text[:1] in (b"{", b"[")


def _parse_failure(data: bytes) -> str | None:
    """Why ``data`` is not JSON, or ``None`` when it is. The typed decoder stops at the
    first member of the wrong type, before it has read the rest (``[1,2`` or
    ``{"id":[`` cut short, ``12x``): only the whole text tells a parse error from an
    invalid request. A number out of range is JSON (msgspec holds no value for it)."""
    try:
        _value_decoder.decode(data)
    except msgspec.ValidationError:
        return None
    except msgspec.DecodeError as exc:
        return str(exc)
    except RecursionError:
        return "JSON nested too deeply"
    return None


def decode_message(data: bytes | bytearray | memoryview | str) -> Message:
    """Decode one message. Raises ``JsonRpcParseError`` (not JSON, nested too deeply)
    / ``JsonRpcInvalidRequest`` (JSON, not a JSON-RPC 2.0 message)."""
    try:
        msg = _message_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        failure = _parse_failure(raw)
        if failure is not None:
            raise JsonRpcParseError(f"Parse error: {failure}") from None
        raise JsonRpcInvalidRequest(f"Invalid Request: {exc}", id=_salvage_id(raw)) from None
    except msgspec.DecodeError as exc:
        raise JsonRpcParseError(f"Parse error: {exc}") from None
    except RecursionError:
        raise JsonRpcParseError("Parse error: JSON nested too deeply") from None

    ident: JsonRpcId = None if msg.id is UNSET else msg.id
    if msg.jsonrpc != "2.0":
        raise JsonRpcInvalidRequest('Invalid Request: "jsonrpc" must be "2.0"', id=ident)
    if msg.method is not UNSET:
        if msg.result is not UNSET or msg.error is not UNSET:
            raise JsonRpcInvalidRequest(
                "Invalid Request: a request cannot carry result or error", id=ident
            )
        if msg.params is not UNSET and not _is_structured(msg.params):
            raise JsonRpcInvalidRequest(
                "Invalid Request: params must be an object or an array", id=ident
            )
        return msg
    # A response.
    if msg.id is UNSET:
        raise JsonRpcInvalidRequest("Invalid Request: no method and no id")
    if (msg.result is UNSET) == (msg.error is UNSET):
        raise JsonRpcInvalidRequest(
            "Invalid Request: a response needs exactly one of result and error", id=ident
        )
    if msg.params is not UNSET:
        raise JsonRpcInvalidRequest("Invalid Request: a response cannot carry params", id=ident)
    return msg


def decode_value(raw: msgspec.Raw | bytes | UnsetType | None) -> Any:
    """Decode raw JSON into plain Python values (dict/list/...); ``UNSET``/``None`` → ``None``."""
    if raw is UNSET or raw is None:
        return None
    return _value_decoder.decode(raw)


def encode_value(value: Any) -> bytes:
    """Encode any msgspec-encodable value (``msgspec.Raw`` is written verbatim)."""
    return _encoder.encode(value)


# Structs keep the member order stable and encode faster than dicts.
class _Request(msgspec.Struct):
    jsonrpc: str
    id: JsonRpcId
    method: str
    params: Any = UNSET


class _Notification(msgspec.Struct):
    jsonrpc: str
    method: str
    params: Any = UNSET


class _Result(msgspec.Struct):
    jsonrpc: str
    id: JsonRpcId
    result: Any


class _Error(msgspec.Struct):
    code: int
    message: str
    data: Any = UNSET


class _ErrorResponse(msgspec.Struct):
    jsonrpc: str
    id: JsonRpcId
    error: _Error


def _opt(value: Any) -> Any:
    return UNSET if value is None else value


def encode_request(id: JsonRpcId, method: str, params: Any = None) -> bytes:
    """A request; ``params=None`` omits the member."""
    return _encoder.encode(_Request("2.0", id, method, _opt(params)))


def encode_notification(method: str, params: Any = None) -> bytes:
    """A notification (no id); ``params=None`` omits the member."""
    return _encoder.encode(_Notification("2.0", method, _opt(params)))


def encode_result(id: JsonRpcId, result: Any) -> bytes:
    """A success response; ``result=None`` is written as ``null`` (it is required)."""
    return _encoder.encode(_Result("2.0", id, result))


def encode_error(id: JsonRpcId, code: int, message: str, data: Any = None) -> bytes:
    """An error response; ``data=None`` omits the member."""
    return _encoder.encode(_ErrorResponse("2.0", id, _Error(code, message, _opt(data))))
