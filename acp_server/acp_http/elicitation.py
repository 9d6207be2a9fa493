"""``elicitation/create`` and ``elicitation/complete`` on ``/acp``: the bridge's
mediated elicitations (``bridge.elicitation``) as agent-to-client traffic.

    frames = elicitation_frames(conn, channel, event)   # [] when not for this client
    answer_elicitation(conn, msg, session_id, result)    # the client's JSON-RPC response

Contracts:

* An ``elicitation_request`` becomes the request ``elicitation/create`` whose JSON-RPC
  id is the bridge's ``requestId`` (params as the agent sent them, ``sessionId``
  included), only while it is pending and only to a connection whose
  ``initialize`` offered ``clientCapabilities.elicitation``; for others it is a
  ``_qwen/notify`` like any event. An ``elicitation_complete`` becomes the
  notification ``elicitation/complete``.
* The first answer wins (the bridge's rule). A result is the answer as sent; an
  error answer counts as ``{"action": "cancel"}``; an answer the bridge refuses
  (no ``action``) leaves the request pending for another answer.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from acp_server.acp_http import frames as fr
from acp_server.acp_http.frames import Frame
from bridge import events as ev
from bridge.errors import BridgeError
from bridge.events import ElicitationComplete, ElicitationRequest, Event
from bridge.jsonrpc import UNSET, Message, encode_notification, encode_request

if TYPE_CHECKING:
    from acp_server.acp_http.connection import AcpConnection, SessionChannel

log = logging.getLogger("acp_server.acp_http")

KINDS = frozenset({ev.ELICITATION_REQUEST, ev.ELICITATION_COMPLETE})


def offers_elicitation(params: dict[str, Any]) -> bool:
    """Does an ``initialize`` offer ``clientCapabilities.elicitation``?"""
    caps = params.get("clientCapabilities")
    value = caps.get("elicitation") if isinstance(caps, dict) else None
    return value is not None and value is not False


def elicitation_frames(conn: AcpConnection, channel: SessionChannel, event: Event) -> list[Frame]:
    data = event.data
    if not conn.elicitation:
        return [fr.notify_frame(event)]
    if isinstance(data, ElicitationComplete):
        return [Frame(event.id, encode_notification(
            "elicitation/complete", {**data.params, "sessionId": data.session_id}))]
    if not isinstance(data, ElicitationRequest) \
            or not conn.bridge.elicitation_pending(data.request_id):
        return [fr.notify_frame(event)]   # answered meanwhile: history, not a question
    conn.expect_answer(data.request_id, channel.session_id)
    params = {**data.params, "sessionId": data.session_id}
    return [Frame(event.id, encode_request(data.request_id, "elicitation/create", params))]


def answer_elicitation(conn: AcpConnection, msg: Message, session_id: str,
                       result: Any) -> None:
    """``result``: the answer's decoded ``result`` (``acp_http.dispatch`` decodes it
    before it takes the question off the pending ones)."""
    request_id = msg.id
    assert isinstance(request_id, str)
    answer: Any = {"action": "cancel"}
    if msg.error is UNSET:
        answer = result
    try:
        conn.bridge.respond_to_elicitation(request_id, answer, session_id=session_id)
    except BridgeError as exc:
        if conn.bridge.elicitation_pending(request_id):
            conn.expect_answer(request_id, session_id)   # may be answered again
        log.info("acp %s: elicitation answer for %s refused: %s", conn.id, request_id, exc)
