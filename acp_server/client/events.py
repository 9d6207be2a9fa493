"""The session event stream (SSE), resumed across drops.

    cursor = StreamCursor(last_event_id=accepted.last_event_id, epoch=accepted.event_epoch)
    async with contextlib.aclosing(subscribe_events(http, "/session/s-1/events",
                                                    cursor=cursor)) as events:
        async for event in events:          # DaemonEvent(type=…, id=…, prompt_id=…, data=…)
            if event.type == "state_resync_required":
                ...                          # the server could not honour the cursor

Contracts:

* Frames are read by ``client.sse.ResumingStream`` (bounded; the ``retry:`` block and
  heartbeat comments skipped); a frame whose JSON is malformed raises ``DaemonProtocolError``.
* ``cursor`` is updated in place: ``last_event_id`` after each event with an id,
  ``epoch`` from each response's ``X-Qwen-Event-Epoch``. A reconnect sends both as
  ``Last-Event-ID`` / ``X-Qwen-Event-Epoch``, so the server replays what was missed or
  says ``state_resync_required`` (which is yielded like any event). An epoch is a token
  (``EPOCH``: 1 to 256 of ``A-Z a-z 0-9 . _ : -``; a daemon's is a UUID): one the SDK
  could not send back as it came (another character, a line break, longer) raises
  ``DaemonProtocolError``, whether it came in the header or in a prompt's envelope.
* A drop (transport error, or the response ending without ``session_closed`` /
  ``session_died``, e.g. after ``client_evicted``) is resumed after a short backoff, at
  most ``max_reconnects`` times in a row (the count resets once an event moves the
  cursor: an id above the last one, or any id after the epoch changed; a server that
  replays the same event on each reconnect makes no progress); past that →
  ``DaemonStreamError``. With ``reconnect=False`` a clean end just
  ends the iteration and a transport error raises ``DaemonStreamError``.
* The iteration ends after ``session_closed`` / ``session_died``, or when a reconnect
  finds the session gone (404). A non-200 first answer raises the mapped HTTP error.
* Nothing is buffered beyond the frame being parsed: events are yielded one at a time.
  Close the iterator (``aclosing``) to drop the connection promptly.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass

import httpx

from acp_server.client import wire
from acp_server.client.errors import DaemonProtocolError, DaemonTurnError, error_from_answer
from acp_server.client.bounded import MAX_EVENT_BYTES, read_capped
from acp_server.client.sse import END, READ, ResumingStream, Retry
from acp_server.client.wire import DaemonEvent, PromptResult

END_OF_SESSION = frozenset({"session_closed", "session_died"})
RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
EPOCH = re.compile(r"[A-Za-z0-9._:-]{1,256}")


def checked_epoch(epoch: str | None) -> str | None:
    """``epoch`` when it is one the SDK can send back (module contract), else
    ``DaemonProtocolError``; ``None`` and ``""`` are no epoch."""
    if not epoch:
        return None
    if not EPOCH.fullmatch(epoch):
        shown = epoch if len(epoch) <= 40 else epoch[:40] + "…"
        raise DaemonProtocolError(f"The daemon sent an event epoch that is not a token: "
                                  f"{shown!r}")
    return epoch


@dataclass
class StreamCursor:
    """Where a subscription stands: the last event id seen and the bus epoch."""

    last_event_id: int | None = None
    epoch: str | None = None


def match_turn_event(event: DaemonEvent, prompt_id: str) -> PromptResult | None:
    """The result when ``event`` ends ``prompt_id``'s turn: ``turn_complete`` → a
    ``PromptResult``; ``turn_error`` → raises ``DaemonTurnError``; otherwise ``None``."""
    if event.type not in ("turn_complete", "turn_error"):
        return None
    data = event.data if isinstance(event.data, dict) else {}
    if (data.get("promptId") or event.prompt_id) != prompt_id:
        return None
    if event.type == "turn_error":
        raise DaemonTurnError(data)
    stop = data.get("stopReason")
    return PromptResult(stop_reason=stop if isinstance(stop, str) else "end_turn",
                        prompt_id=prompt_id)


def event_prompt_id(event: DaemonEvent) -> str | None:
    """The prompt an event belongs to (envelope ``promptId``, else ``data.promptId``)."""
    if event.prompt_id is not None:
        return event.prompt_id
    data = event.data
    pid = data.get("promptId") if isinstance(data, dict) else None
    return pid if isinstance(pid, str) else None


async def subscribe_events(http: httpx.AsyncClient, path: str, *,
                           cursor: StreamCursor | None = None,
                           headers: Mapping[str, str] | None = None,
                           max_queued: int | None = None,
                           timeout: httpx.Timeout | None = None,
                           session_id: str | None = None,
                           reconnect: bool = True, max_reconnects: int = 5,
                           reconnect_delay: float = 0.25,
                           max_event_bytes: int = MAX_EVENT_BYTES
                           ) -> AsyncGenerator[DaemonEvent, None]:
    """Yield the events of ``path`` (``/session/{id}/events``); see the module contract."""
    cursor = cursor if cursor is not None else StreamCursor()
    cursor.epoch = checked_epoch(cursor.epoch)
    base_headers = dict(headers or {})
    mark = (cursor.epoch, cursor.last_event_id)   # where the cursor last moved to

    def request(attempt: int) -> tuple[dict[str, str], dict[str, str]]:
        sent = dict(base_headers)
        if cursor.last_event_id is not None:
            sent["Last-Event-ID"] = str(cursor.last_event_id)
        if cursor.epoch:
            sent["X-Qwen-Event-Epoch"] = cursor.epoch
        params = {"maxQueued": str(max_queued)} if max_queued is not None else {}
        if attempt:
            params["connectReason"] = "resume"
        return sent, params

    async def answer(response: httpx.Response, attempt: int) -> str | Retry:
        if response.status_code == 200:
            cursor.epoch = checked_epoch(response.headers.get("x-qwen-event-epoch")) \
                or cursor.epoch
            return READ
        content = await read_capped(response)
        if attempt and response.status_code == 404:
            return END  # the session is gone: its stream has ended for good
        if not (reconnect and attempt and response.status_code in RETRYABLE_STATUS):
            raise error_from_answer(response.status_code, content, response.headers, session_id)
        return Retry(f"HTTP {response.status_code}")

    stream = ResumingStream(http, path, answer=answer, request=request,
                            lost="Event stream lost", timeout=timeout, reconnect=reconnect,
                            max_reconnects=max_reconnects, reconnect_delay=reconnect_delay,
                            max_event_bytes=max_event_bytes)
    async with contextlib.aclosing(stream.frames()) as frames:
        async for data in frames:
            event = wire.decode(wire.EVENT, data)
            if event.id is not None:
                cursor.last_event_id = event.id
                if mark[0] != cursor.epoch or mark[1] is None or event.id > mark[1]:
                    mark = (cursor.epoch, event.id)
                    stream.progressed()
            yield event
            if event.type in END_OF_SESSION:
                return
