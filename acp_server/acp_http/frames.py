"""JSON-RPC frames of the ``/acp`` transport: bus events translated, SSE framing.

    frame = Frame(7, encode_notification("session/update", params))
    sse_bytes(frame)        # b'id: 7\\ndata: {"jsonrpc":"2.0",...}\\n\\n'
    notify_frame(event)     # any other bus event as ``_qwen/notify {kind, data}``

Contracts:

* The frames of a bus event are the same for every connection: each payload is built
  once per event and kept on it (``Event.encoded``).
* A ``Frame`` is one JSON-RPC message (``payload``, one line of JSON) plus the bus
  id of the event it came from (``None`` for responses and synthetic frames). SSE
  (``acp_server.http.sse.frame``) writes ``id:`` only for bus events, so ``Last-Event-ID``
  names a bus id.
* Event data is encoded with msgspec as it is (``msgspec.Raw`` agent params are
  written through byte for byte); nothing is re-serialized through a narrower type.
  The bridge's own payloads are written in their wire shape (``bridge.wire``).
* A permission request becomes the agent-to-client request
  ``session/request_permission`` whose JSON-RPC id is the bridge's ``requestId``
  (a string), with ``_meta.qwen.requestId`` as the peer sends it.
* A question this connection was sent (a permission request, an elicitation) that
  was resolved by anything but its answer (another client's vote, a cancelled turn,
  a timeout, a restart, the agent withdrawing it) is withdrawn with ACP's
  ``$/cancel_request {requestId}`` (``withdrawn_frame``), after the event's own frame.
* ``with_event_meta`` (for a connection that asked for it at ``initialize``, see
  ``dispatch``) adds ``params._meta["acp-server/event"] = {"id": N, "epoch": E}`` to a
  bus event's frame; every other member is written through as it was.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from acp_server.http.sse import frame as sse_frame
from bridge.events import Event, PermissionRequest
from bridge.jsonrpc import encode_notification, encode_request
from bridge.wire import wire_data

QWEN_NOTIFY = "_qwen/notify"
EVENT_META = "acp-server/event"   # params._meta key: {sessionId, id: bus event id, epoch}
HEARTBEAT_COMMENT = b"hb"


class Frame(NamedTuple):
    event_id: int | None
    payload: bytes


class _Notify(msgspec.Struct):
    kind: str
    data: Any


def sse_bytes(frame: Frame) -> bytes:
    """One SSE event: ``id:`` (bus events only) and one ``data:`` line."""
    return sse_frame(frame.payload, event_id=frame.event_id)


def _update_payload(event: Event) -> bytes:
    return encode_notification("session/update", event.data)


def update_frame(event: Event) -> Frame:
    """A ``session_update`` bus event: its data is the whole ``session/update`` params."""
    return Frame(event.id, event.encoded(_update_payload))


def _notify_payload(event: Event) -> bytes:
    return encode_notification(QWEN_NOTIFY, _Notify(event.type, wire_data(event)))


def notify_frame(event: Event) -> Frame:
    """Any other bus event (or stream-control frame) as the peer's ``_qwen/notify``."""
    return Frame(event.id, event.encoded(_notify_payload))


def _permission_payload(event: Event) -> bytes:
    data: PermissionRequest = event.data
    params = dict(data.params)
    params["sessionId"] = data.session_id
    meta = params.get("_meta")
    meta = dict(meta) if isinstance(meta, dict) else {}
    qwen = meta.get("qwen")
    meta["qwen"] = {**(qwen if isinstance(qwen, dict) else {}), "requestId": data.request_id}
    params["_meta"] = meta
    return encode_request(data.request_id, "session/request_permission", params)


def withdrawn_frame(request_id: str) -> Frame:
    """``$/cancel_request`` for a request of ours the client has not answered and no
    longer needs to (a synthetic frame: no bus id, never replayed)."""
    return Frame(None, encode_notification("$/cancel_request", {"requestId": request_id}))


def permission_frame(event: Event) -> tuple[str, Frame] | None:
    """A ``permission_request`` event as ``(request id, JSON-RPC request frame)``."""
    data = event.data
    if not isinstance(data, PermissionRequest):
        return None
    return data.request_id, Frame(event.id, event.encoded(_permission_payload))


_members = msgspec.json.Decoder(dict[str, msgspec.Raw])
_encoder = msgspec.json.Encoder()


def with_event_meta(frame: Frame, session_id: str, epoch: str) -> Frame:
    """``frame`` (a bus event's request or notification) with its event id and epoch
    in ``params._meta`` (a ``_meta`` that is not an object is replaced)."""
    message = _members.decode(frame.payload)
    params = _members.decode(message["params"]) if "params" in message else {}
    meta: Any = msgspec.json.decode(params["_meta"]) if "_meta" in params else None
    meta = meta if isinstance(meta, dict) else {}
    meta[EVENT_META] = {"sessionId": session_id, "id": frame.event_id, "epoch": epoch}
    params["_meta"] = msgspec.Raw(_encoder.encode(meta))
    message["params"] = msgspec.Raw(_encoder.encode(params))
    return Frame(frame.event_id, _encoder.encode(message))
