"""JSON-RPC 2.0 as the adapter relays it: top-level members kept as raw JSON, so
nothing it does not rewrite is re-serialized.

    message = parse(line)                        # ParseError (-32700) / InvalidRequest (-32600)
    message = parse_editor(line)                 # parse, and refuse what the server would
    message.kind, message.id, message.method     # "request" | "notification" | "response"
    payload = with_id(message.members, 7)        # the same message under another id
    members = set_meta(members, "acp-server/promptId", "p-1")   # params._meta[key] = value
    payload, event = take_event_meta(members)    # our event marker removed, if any

Contracts:

* ``parse`` accepts exactly one JSON object with ``"jsonrpc": "2.0"`` that is a
  request (``method`` and ``id``), a notification (``method``, no ``id``) or a response
  (``id`` and one of ``result`` / ``error``); an ``id`` is a string, an integer or null.
  Anything else raises, with the id when one could be read (for the error answer).
  ``ParseError`` (-32700) when the text is not JSON at all: cut short, trailing
  characters, ``NaN``, a byte order mark, nothing, or nested too deeply for the
  decoder, also when the top level is of the wrong type (``[1,2``, ``12x``: only the
  whole text tells a parse error from an invalid request). ``InvalidRequest``
  (-32600) for JSON that is not a message: ``[]``, an array with members (a batch:
  not supported), a string, number, ``true`` or ``null``, ``{}``, ...
* ``parse_editor`` is ``parse`` for a line of the editor, with the codes the server's
  ``/acp`` gives the same input (``acp_server.acp_http.inbound``), refused here
  because the server's answer to them could not reach the editor (a ``-32700`` has
  ``id: null``, which the relay cannot route back): -32700 for invalid UTF-8 anywhere
  in the line, or JSON nested deeper than ``MAX_DEPTH`` or holding more than
  ``MAX_CONTAINERS`` objects and arrays (refused unparsed); -32600 (with the id) for a
  request whose ``id`` is null (answered ``id: null``, never relayed: its answer
  could not be told from other ``id: null`` errors, nor could ``$/cancel_request``
  name it), ``params`` that is neither an object nor an array, a request carrying
  ``result`` or ``error``, a response carrying ``params``, an ``error`` that is not
  an object with an integer ``code`` and a string ``message``. Duplicate member
  names are JSON: the last one counts.
* Unknown members, ``params``, ``result`` and ``error`` stay ``msgspec.Raw``: their
  bytes are written back as they came. Only ``params`` is decoded to be changed
  (``set_meta``, ``take_event_meta``), one level deep; ``set_meta`` raises
  ``InvalidParams`` (-32602) when ``params`` is not an object.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

import msgspec

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800
EVENT_META = "acp-server/event"
# The server's limits on JSON it reads (``acp_server.http.body``): past them it answers
# -32700 unparsed, so the adapter refuses such a line itself.
MAX_DEPTH = 128
MAX_CONTAINERS = 200_000
BATCH_MESSAGE = "Invalid Request: batch JSON-RPC requests are not supported"
NULL_ID_MESSAGE = "Invalid Request: a request id must be a string or an integer, not null"

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
        _not_an_object(line)
    except msgspec.DecodeError as exc:
        raise ParseError(f"Parse error: {exc}") from None
    except RecursionError:
        raise ParseError("Parse error: JSON nested too deeply") from None
    rpc_id = _read_id(members)
    shown: RpcId = None if rpc_id is _NO_ID else rpc_id   # type: ignore[assignment]
    if members.get("jsonrpc") is None or _any.decode(members["jsonrpc"]) != "2.0":
        raise InvalidRequest('Invalid Request: "jsonrpc" must be "2.0"', shown)
    method: Any = _any.decode(members["method"]) if "method" in members else None
    if method is not None:
        if not isinstance(method, str):   # "" is a string: the server answers -32601
            raise InvalidRequest('Invalid Request: "method" must be a string', shown)
        kind = "notification" if rpc_id is _NO_ID else "request"
    elif rpc_id is not _NO_ID and (("result" in members) != ("error" in members)):
        kind = "response"
    else:
        raise InvalidRequest("Invalid Request: neither a request nor a response", shown)
    return Message(members, kind, shown, method, line)


def parse_editor(line: bytes) -> Message:
    """``parse``, plus what the server refuses that ``parse`` lets through (see the
    module contracts): a line of the editor is refused here with the server's code."""
    try:
        line.decode()
    except UnicodeDecodeError as exc:
        raise ParseError(f"Parse error: invalid UTF-8 (byte {exc.start})") from None
    too_much = _too_much(line)
    if too_much is not None:
        raise ParseError(f"Parse error: {too_much}")
    msg = parse(line)
    members = msg.members
    if msg.kind == "request" and msg.id is None:
        raise InvalidRequest(NULL_ID_MESSAGE)
    if "params" in members and bytes(memoryview(members["params"])[:1]) not in (b"{", b"["):
        raise InvalidRequest("Invalid Request: params must be an object or an array", msg.id)
    if msg.kind != "response" and ("result" in members or "error" in members):
        raise InvalidRequest("Invalid Request: a request cannot carry result or error", msg.id)
    if msg.kind == "response" and "params" in members:
        raise InvalidRequest("Invalid Request: a response cannot carry params", msg.id)
    if "error" in members:
        error = _any.decode(members["error"])
        if not isinstance(error, dict) or type(error.get("code")) is not int \
                or not isinstance(error.get("message"), str):
            raise InvalidRequest('Invalid Request: "error" must be an object with an integer '
                                 '"code" and a string "message"', msg.id)
    return msg


def _not_an_object(line: bytes) -> NoReturn:
    """``line`` did not decode as an object: the typed decoder stops at the first value
    of the wrong type, before it has read the rest, so only the whole text tells a
    parse error (``[1,2``, ``12x``) from an invalid request (``[1,2]``, ``12``)."""
    try:
        value = _any.decode(line)
    except msgspec.DecodeError as exc:
        raise ParseError(f"Parse error: {exc}") from None
    except RecursionError:
        raise ParseError("Parse error: JSON nested too deeply") from None
    if isinstance(value, list):
        raise InvalidRequest(BATCH_MESSAGE if value else "Invalid Request: an empty array")
    raise InvalidRequest("Invalid Request: expected a JSON-RPC object")


_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
_OPEN_CLOSE = bytes.maketrans(b"{}", b"[]")


def _too_much(line: bytes) -> str | None:
    """Why ``line`` is past the server's limits (``MAX_DEPTH``, ``MAX_CONTAINERS``), or
    ``None``; counted on the brackets outside strings, without decoding."""
    if line.count(b"[") + line.count(b"{") <= MAX_DEPTH:
        return None   # cannot be deeper than the number of brackets
    data = line
    if b"\\" in data:   # escapes first, so that every remaining quote delimits a string
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    if b'"' in data:
        data = b"".join(data.split(b'"')[::2])
    shape = data.translate(_OPEN_CLOSE, _NOT_BRACKETS)
    opened = shape.count(b"[")
    if opened > MAX_CONTAINERS:
        return f"JSON holds more than {MAX_CONTAINERS} objects and arrays"
    if opened <= MAX_DEPTH:
        return None
    depth = 0
    for bracket in shape:   # at most 2 * opened + 1 steps: below 0 it is not JSON
        depth += 1 if bracket == 0x5B else -1
        if depth > MAX_DEPTH:
            return f"JSON nested deeper than {MAX_DEPTH} levels"
        if depth < 0:
            return None   # ``parse`` says what is wrong
    return None


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


# -- an HTTP answer's body (the link) ---------------------------------------------------

def is_jsonrpc(body: bytes) -> bool:
    try:
        value = json.loads(body)
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("jsonrpc") == "2.0"


def body_error_kind(body: bytes) -> str | None:
    """``error.data.errorKind`` of a JSON-RPC error body, if it is one."""
    try:
        data = json.loads(body).get("error", {}).get("data", {})
    except (ValueError, AttributeError):
        return None
    kind = data.get("errorKind") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else None


def body_error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace")
