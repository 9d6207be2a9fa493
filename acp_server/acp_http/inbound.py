"""One client message of ``/acp``, read the same way on both transports (a Streamable
HTTP POST body, a WebSocket text frame)::

    try:
        msg = read_message(raw)
    except BatchRefused:            # HTTP 501 {"error": ...}; WebSocket: a -32600 frame
        ...
    except JsonRpcError as exc:     # HTTP 400; WebSocket: an error frame
        payload = refusal(exc)

Contracts (JSON-RPC 2.0 §5.1; ``bridge.jsonrpc.decode_message`` tells the two apart):

* -32700 Parse error, ``id: null``: not JSON. Cut short, trailing characters (a second
  object too), invalid UTF-8 anywhere in the bytes (a WebSocket text frame is UTF-8 by
  its protocol), ``NaN`` / ``Infinity``, single quotes, a byte order mark, nothing at
  all; or nested deeper (or holding more objects and arrays) than
  ``acp_server.http.body.check_json`` allows, refused unparsed.
* ``BatchRefused``: a JSON array with members (a batch: not supported).
* -32600 Invalid Request: JSON that is not one JSON-RPC 2.0 message: a string, number,
  ``true`` or ``null``, ``[]``, ``{}``, ``jsonrpc`` other than ``"2.0"`` (or
  absent), a ``method`` that is not a string, an ``id`` that is neither a string nor
  an integer, ``params`` neither an object nor an array, a response with neither or
  both of ``result`` / ``error``. The answer carries the message's id when it could
  be read, else ``null``.
* A request whose ``id`` is ``null`` is -32600 too, answered at once (``id: null``)
  and never run. JSON-RPC 2.0 allows it but discourages it, and here its answer could
  not be told from the ``id: null`` errors of messages that have no id, two of them
  from each other, nor could ``$/cancel_request`` name it. Responses with ``id: null``
  are accepted (and ignored: no request of ours has that id).
* Duplicate member names are JSON: the last one counts (as ``JSON.parse`` does).
"""

from __future__ import annotations

from acp_server.http.body import BodyError, check_json
from bridge.jsonrpc import (
    JsonRpcError,
    JsonRpcInvalidRequest,
    JsonRpcParseError,
    Message,
    decode_message,
    encode_error,
)

BATCH_MESSAGE = "Batch JSON-RPC requests are not supported"
NULL_ID_MESSAGE = "Invalid Request: a request id must be a string or an integer, not null"


class BatchRefused(Exception):
    """A JSON array with members: a JSON-RPC batch, which ``/acp`` does not serve."""


def read_message(raw: bytes | str) -> Message:
    """One JSON-RPC message. Raises ``JsonRpcParseError`` / ``JsonRpcInvalidRequest``
    (see the module contracts) or ``BatchRefused``."""
    if isinstance(raw, bytes):
        _check_utf8(raw)
    try:
        check_json(raw)
    except BodyError as exc:   # too deep / too many containers: refused unparsed
        raise JsonRpcParseError(f"Parse error: {exc.message}") from None
    try:
        msg = decode_message(raw)
    except JsonRpcInvalidRequest:
        _check_array(raw)
        raise
    if msg.is_request and msg.id is None:
        raise JsonRpcInvalidRequest(NULL_ID_MESSAGE)
    return msg


def refusal(exc: JsonRpcError) -> bytes:
    """The JSON-RPC error answer to what ``read_message`` raised."""
    rpc_id = exc.id if isinstance(exc, JsonRpcInvalidRequest) else None
    return encode_error(rpc_id, exc.code, exc.message)


def _check_utf8(raw: bytes) -> None:
    """The decoder only skips ``params`` and unknown members, unchecked: bytes that are
    not UTF-8 there would pass as JSON."""
    try:
        raw.decode()
    except UnicodeDecodeError as exc:
        raise JsonRpcParseError(f"Parse error: invalid UTF-8 (byte {exc.start})") from None


def _check_array(raw: bytes | str) -> None:
    """``raw`` is JSON (it was not a parse error) and not a message: an array with
    members is a batch (``BatchRefused``), ``[]`` an invalid request."""
    text = raw.strip()
    if text[:1] not in (b"[", "["):
        return
    if text[1:-1].strip():
        raise BatchRefused(BATCH_MESSAGE)
    raise JsonRpcInvalidRequest("Invalid Request: an empty array")
