"""The session journal's events as the tests read them on disk: one tuple an event,
from the segment rows that hold them (``acp_server.store.segments``).

    events = stored_events(db.execute, sid, "%s")        # [(id, type, prompt_id, envelope)]
    rewrite_event(run, sid, lambda e: e[0] == 2, b"{}")  # an event's envelope replaced
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from acp_server.store.segments import decode_segment, encode_segment

Event = tuple[int, str, "str | None", bytes]


def _rows(result: Any) -> list[Any]:
    return result.fetchall() if hasattr(result, "fetchall") else list(result)


def stored_events(execute: Callable[..., Any], sid: str | None = None, mark: str = "?"
                  ) -> list[Any]:
    """The stored events of ``sid`` (every session's when ``None``, then each tuple
    starts with its session id), in id order; a segment that cannot be decoded is
    left out. ``execute``: a connection's (or ``_run_sql``-like) with ``mark`` for
    a parameter."""
    where = f"session_id = {mark} AND " if sid is not None else ""
    found: list[Any] = []
    for row_sid, blob in _rows(execute(
            f"SELECT session_id, events FROM session_segments WHERE {where}last_id > 0 "
            "ORDER BY session_id, last_id", (sid,) if sid is not None else ())):
        try:
            events = decode_segment(bytes(blob) if isinstance(blob, memoryview) else blob)
        except Exception:   # noqa: BLE001 - unreadable: not an event the tests count
            continue
        for event in events:
            found.append(event if sid is not None else (row_sid, *event))
    return found


def rewrite_event(execute: Callable[..., Any], sid: str, pick: Callable[[Event], bool],
                  envelope: bytes | str, mark: str = "?") -> int:
    """Replace the envelope of the first stored event of ``sid`` that ``pick`` takes
    (as an unreadable value would be, inside its segment); its id."""
    for last_id, blob in _rows(execute(
            f"SELECT last_id, events FROM session_segments WHERE session_id = {mark} "
            "AND last_id > 0 ORDER BY last_id", (sid,))):
        events = decode_segment(bytes(blob) if isinstance(blob, memoryview) else blob)
        for n, event in enumerate(events):
            if pick(event):
                raw = envelope.encode("utf-8", "surrogatepass") if isinstance(envelope, str) \
                    else envelope
                events[n] = (event[0], event[1], event[2], raw)
                execute(f"UPDATE session_segments SET events = {mark} WHERE session_id = "
                        f"{mark} AND last_id = {mark}", (encode_segment(events), sid, last_id))
                return int(event[0])
    raise AssertionError(f"no stored event of {sid} to rewrite")


def segment_of(execute: Callable[..., Any], sid: str, event_id: int, mark: str = "?") -> int:
    """The ``last_id`` of the segment of ``sid`` that holds ``event_id``."""
    rows = _rows(execute(
        f"SELECT last_id FROM session_segments WHERE session_id = {mark} AND "
        f"first_id <= {mark} AND last_id >= {mark}", (sid, event_id, event_id)))
    assert rows, f"no segment of {sid} holds event {event_id}"
    return int(rows[0][0])
