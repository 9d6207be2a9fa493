"""The session event stream (SSE), resumed across drops.

    cursor = StreamCursor(last_event_id=accepted.last_event_id, epoch=accepted.event_epoch)
    async with contextlib.aclosing(subscribe_events(http, "/session/s-1/events",
                                                    cursor=cursor)) as events:
        async for event in events:          # DaemonEvent(type=…, id=…, prompt_id=…, data=…)
            if event.type == "state_resync_required":
                ...                          # the server could not honour the cursor

Contracts:

* Frames are parsed with httpx-sse; the leading ``retry:`` block and heartbeat
  comments are skipped; a frame whose JSON is malformed raises ``DaemonProtocolError``.
* ``cursor`` is updated in place: ``last_event_id`` after each event with an id,
  ``epoch`` from each response's ``X-Qwen-Event-Epoch``. A reconnect sends both as
  ``Last-Event-ID`` / ``X-Qwen-Event-Epoch``, so the server replays what was missed or
  says ``state_resync_required`` (which is yielded like any event).
* A drop (transport error, or the response ending without ``session_closed`` /
  ``session_died``, e.g. after ``client_evicted``) is resumed after a short backoff, at
  most ``max_reconnects`` times in a row (the count resets once an event with an id
  arrives); past that → ``DaemonStreamError``. With ``reconnect=False`` a clean end just
  ends the iteration and a transport error raises ``DaemonStreamError``.
* The iteration ends after ``session_closed`` / ``session_died``, or when a reconnect
  finds the session gone (404). A non-200 first answer raises the mapped HTTP error.
* Nothing is buffered beyond the frame being parsed: events are yielded one at a time.
  Close the iterator (``aclosing``) to drop the connection promptly.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass

import anyio
import httpx
from httpx_sse import SSEError, aconnect_sse

from acp_server.client import wire
from acp_server.client.errors import (DaemonProtocolError, DaemonStreamError, DaemonTurnError,
                                      error_from_status)
from acp_server.client.wire import DaemonEvent, PromptResult

END_OF_SESSION = frozenset({"session_closed", "session_died"})
RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
MAX_RECONNECT_DELAY_S = 5.0


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


def _request_headers(base: Mapping[str, str], cursor: StreamCursor) -> dict[str, str]:
    headers = dict(base)
    if cursor.last_event_id is not None:
        headers["Last-Event-ID"] = str(cursor.last_event_id)
    if cursor.epoch:
        headers["X-Qwen-Event-Epoch"] = cursor.epoch
    return headers


def _backoff(attempt: int, base_delay: float) -> float:
    """0 for the first retry (a drop is usually one-off), then doubling, capped."""
    if attempt <= 1:
        return 0.0
    return float(min(base_delay * 2.0 ** (attempt - 2), MAX_RECONNECT_DELAY_S))


async def subscribe_events(http: httpx.AsyncClient, path: str, *,
                           cursor: StreamCursor | None = None,
                           headers: Mapping[str, str] | None = None,
                           max_queued: int | None = None,
                           timeout: httpx.Timeout | None = None,
                           session_id: str | None = None,
                           reconnect: bool = True, max_reconnects: int = 5,
                           reconnect_delay: float = 0.25) -> AsyncGenerator[DaemonEvent, None]:
    """Yield the events of ``path`` (``/session/{id}/events``); see the module contract."""
    cursor = cursor if cursor is not None else StreamCursor()
    base_headers = dict(headers or {})
    attempt = 0
    while True:
        params: dict[str, str] = {}
        if max_queued is not None:
            params["maxQueued"] = str(max_queued)
        if attempt:
            params["connectReason"] = "resume"
        problem: str
        try:
            async with aconnect_sse(http, "GET", path, params=params, timeout=timeout,
                                    headers=_request_headers(base_headers, cursor)) as source:
                response = source.response
                if response.status_code != 200:
                    body = wire.decode_body(await response.aread())
                    if attempt and response.status_code == 404:
                        return  # the session is gone: its stream has ended for good
                    if not (reconnect and attempt and response.status_code in RETRYABLE_STATUS):
                        raise error_from_status(response.status_code, body, session_id)
                    problem = f"HTTP {response.status_code}"
                else:
                    cursor.epoch = response.headers.get("x-qwen-event-epoch") or cursor.epoch
                    async for sse in source.aiter_sse():
                        if not sse.data:
                            continue
                        event = wire.decode(wire.EVENT, sse.data)
                        if event.id is not None:
                            cursor.last_event_id = event.id
                            attempt = 0
                        yield event
                        if event.type in END_OF_SESSION:
                            return
                    problem = "the stream ended"
        except SSEError as exc:
            raise DaemonProtocolError(f"Not an event stream: {exc}") from exc
        except httpx.TransportError as exc:
            if not reconnect:
                raise DaemonStreamError(f"Event stream dropped: {exc!r}") from exc
            problem = repr(exc)
        if not reconnect:
            return
        attempt += 1
        if attempt > max_reconnects:
            raise DaemonStreamError(
                f"Event stream lost and not resumed after {max_reconnects} attempts ({problem})")
        await anyio.sleep(_backoff(attempt, reconnect_delay))
