"""What a reconnecting client (``acp-server connect``) asks of ``/acp`` through
``_meta``: event ids on frames, prompts re-sent under their id, replay after a cursor.

    prompt_id = prompt_id_param(params)             # _meta["acp-server/promptId"]
    known = rejoin_prompt(conn, channel, prompt_id, rpc_id)   # PENDING | answer | None
    cursor = cursor_param(params)                   # (lastEventId, epoch) or None
    events = await replay_after(conn, info, cursor) # the answer's _meta["acp-server/events"]

Contracts:

* A prompt id names one prompt of a session. ``rejoin_prompt`` never admits: a
  pending prompt is tracked on ``channel`` again (its answer comes when its turn
  ends: ``PENDING``); a finished one is answered from its terminal (``{stopReason}``,
  or ``PromptFailedError`` for a failed one); an unknown id is ``None`` (admit it).
  Everything is read synchronously, so a turn cannot end between the check and
  the tracking.
* ``replay_after`` writes the events after the cursor to the session stream and
  returns once the reader has taken them (so the answer follows the replay). Under
  another epoch nothing is replayed (``resync: "epoch_reset"``): ids of two epochs
  cannot be compared, and a client must not see twice what it saw. Under the same
  epoch, when the ring lost events after the cursor, what it holds is replayed
  (``resync: "ring_evicted"``; the frame ids show the gap).
* ``meta_value`` reads one ``_meta`` key, ``InvalidParamsError`` when mistyped.
* ``sent_again``: a ``session/prompt`` under a prompt id the session admitted already
  (pending, or ended) admits nothing new, so its principal's rate limit does not
  refuse it (the doors let it through to ``rejoin_prompt``). A reconnecting client
  sends its prompt in flight again; refused, it was told "rate limit exceeded" of a
  prompt its agent ran.
"""

from __future__ import annotations

from typing import Any

import msgspec

from acp_server.acp_http.connection import AcpConnection, RpcId, SessionChannel
from acp_server.acp_http.errors import InvalidParamsError, PromptFailedError
from acp_server.http.resent import RATE_LIMITED
from acp_server.principals import Caller, Denial
from bridge import Bridge
from bridge.jsonrpc import Message, decode_value
from bridge.status import SessionInfo

PROMPT_ID_META = "acp-server/promptId"
CURSOR_META = "acp-server/lastEventId"
EPOCH_META = "acp-server/eventEpoch"
EVENTS_META = "acp-server/events"
RESUMABLE_META = "acp-server/resumable"
MAX_PROMPT_ID = 128
PENDING = "pending"   # rejoin_prompt: re-attached, answered when its turn ends


def meta_value(params: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    """``params._meta[key]`` (``None`` when absent); ``InvalidParamsError`` when it is
    not of ``kind`` (a boolean is never an ``int`` here)."""
    meta = params.get("_meta")
    value = meta.get(key) if isinstance(meta, dict) else None
    if value is not None and (not isinstance(value, kind)
                              or (isinstance(value, bool) and kind is not object)):
        raise InvalidParamsError(f'Invalid params: "_meta.{key}" has the wrong type')
    return value


def prompt_id_param(params: dict[str, Any]) -> str | None:
    prompt_id = meta_value(params, PROMPT_ID_META, str)
    if prompt_id is not None and not 0 < len(prompt_id) <= MAX_PROMPT_ID:
        raise InvalidParamsError(f'Invalid params: "_meta.{PROMPT_ID_META}" must have 1 to '
                                 f"{MAX_PROMPT_ID} characters")
    return prompt_id  # type: ignore[no-any-return]


def sent_again(bridge: Bridge, caller: Caller, msg: Message, denial: Denial,
               session_id: str | None = None) -> bool:
    """Whether ``denial`` is the rate limit refusing a ``session/prompt`` that the
    session admitted already under its prompt id (see the contracts): then it passes.
    ``session_id``: the ``Acp-Session-Id`` header, when ``params`` name none."""
    if denial.code != RATE_LIMITED or msg.method != "session/prompt":
        return False
    try:
        params = decode_value(msg.params) if msg.params is not msgspec.UNSET else None
        prompt_id = prompt_id_param(params) if isinstance(params, dict) else None
    except (msgspec.MsgspecError, InvalidParamsError):
        return False
    sid = params.get("sessionId", session_id) if isinstance(params, dict) else None
    return prompt_id is not None and isinstance(sid, str) and caller.sees_session(sid) \
        and bridge.admitted_prompt(sid, prompt_id)


def rejoin_prompt(conn: AcpConnection, channel: SessionChannel, prompt_id: str,
                  rpc_id: RpcId) -> Any:
    """A prompt sent again under its id: ``PENDING``, its answer, or ``None``."""
    ticket = conn.bridge.prompt_ticket(channel.session_id, prompt_id)
    if ticket is not None:
        if rpc_id is not None:
            channel.track_prompt(ticket, rpc_id, detached=True)
        return PENDING
    terminal = conn.bridge.prompt_terminal(channel.session_id, prompt_id)
    if terminal is None:
        return None
    if terminal.terminal == "failed":
        raise PromptFailedError(prompt_id, terminal.error_code or "internal_error")
    return {"stopReason": terminal.stop_reason or terminal.terminal}


def cursor_param(params: dict[str, Any]) -> tuple[int, str | None] | None:
    last = meta_value(params, CURSOR_META, int)
    if last is None:
        return None
    if last < 0:
        raise InvalidParamsError(f'Invalid params: "_meta.{CURSOR_META}" must be >= 0')
    return last, meta_value(params, EPOCH_META, str)


async def replay_after(conn: AcpConnection, info: SessionInfo,
                       cursor: tuple[int, str | None]) -> dict[str, Any]:
    """Point the session stream after ``cursor``; once the replay is written, what
    the answer says of it (``EVENTS_META``)."""
    last, epoch = cursor
    channel = conn.channel(info.session_id)
    earliest = conn.bridge.session_status(info.session_id).earliest_event_id
    until = info.last_event_id
    events: dict[str, Any] = {"eventEpoch": info.event_epoch, "lastEventId": until}
    if epoch is not None and epoch != info.event_epoch:
        events["resync"] = "epoch_reset"
        last = until
    elif last + 1 < earliest and last < until:
        events["resync"] = "ring_evicted"
    channel.rewind(last, info.event_epoch)
    if until > last:
        await channel.flush_through(until)
    return events


def with_events_meta(result: dict[str, Any], events: dict[str, Any]) -> dict[str, Any]:
    meta = result.get("_meta")
    return {**result, "_meta": {**(meta if isinstance(meta, dict) else {}), EVENTS_META: events}}
