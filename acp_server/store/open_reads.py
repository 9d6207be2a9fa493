"""The open sessions of the journal, read for a listing in a fixed number of statements
(``StoreSessionJournal.read_open``: what an instance's listings add of the sessions
the others run, ``acp_server.fleet.replica``).

    found = read_open_in(conn, sql, QUESTIONS, exclude=live_here)

Each session comes back as ``RestoredSession`` with what its status needs, the same as
``SessionReads.read(sid, only=…)`` gives for one: its record, its newest event and its
events of the types ``only`` (id order), its last event id, its newest terminal, its
prompts accepted and never settled (admission order; those whose end the events hold,
``settled_from_events``, are settled, as the restore does) and which of them started.
Four statements whatever the number of sessions (three when none has a prompt
unsettled), where a read per session took five each: at a thousand open sessions on
PostgreSQL that was over a second a listing. ``exclude``: ids not read (the sessions
live on the reading instance). A row that cannot be decoded is logged and skipped.
Statements run one after the other, not in one snapshot, as the reads one at a time did:
a status is as of the listing's moment, give or take a commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from typing import Any

import msgspec

from acp_server.store.segments import AROUND, around, contains, decode_segment, events_of
from bridge.journal import PromptAccepted, PromptSettled, RestoredSession, SessionOpened
from bridge.status import PromptTerminal
from bridge.wire import Event, event_from_envelope

log = logging.getLogger("acp_server.store.sessions")

TURN_ENDS = ("turn_complete", "turn_error")   # a prompt's end (``bridge.events``)
OPENED = msgspec.msgpack.Decoder(SessionOpened)
SETTLED = msgspec.msgpack.Decoder(PromptSettled)
_ACCEPTED = msgspec.msgpack.Decoder(PromptAccepted)
_ACCEPTED_JSON = msgspec.json.Decoder(PromptAccepted)
_OPEN = "FROM sessions s WHERE s.closed_at IS NULL"
_OPEN_JOIN = "JOIN sessions s ON s.id = {t}.session_id WHERE s.closed_at IS NULL"


def stored(value: Any) -> bytes:
    """A stored record's bytes, to decode: a BLOB (``bytea``) as it is, a TEXT value (a
    row written by something else: SQLite keeps what it is given) as its UTF-8, any
    other value as no bytes at all. Never raises: what cannot be a record fails its
    decoding (``msgspec.MsgspecError``), where the row is logged and skipped."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return b""


def decode_opened(sid: str, blob: Any) -> SessionOpened | None:
    """A ``sessions.record`` (as stored: ``stored``); ``None`` when it cannot be decoded
    (logged: the session is skipped)."""
    try:
        return OPENED.decode(stored(blob))
    except msgspec.MsgspecError as exc:
        log.error("session journal: session %s has an unreadable record (%s): skipped",
                  sid, exc)
        return None


def decode_accepted(blob: Any) -> PromptAccepted:
    """A ``session_prompts.record`` (msgpack; JSON in rows written before it; as
    stored: ``stored``). ``msgspec.MsgspecError`` when it cannot be decoded."""
    blob = stored(blob)
    return (_ACCEPTED_JSON if blob[:1] == b"{" else _ACCEPTED).decode(blob)


def decode_settled(blob: Any) -> PromptTerminal:
    """A ``session_prompts.terminal`` as the terminal it records (as stored: ``stored``).
    ``msgspec.MsgspecError`` when it cannot be decoded."""
    return terminal_of(SETTLED.decode(stored(blob)))


def decode_event(envelope: Any, event_id: int | None = None) -> Event:
    """An event's envelope (``acp_server.store.segments``) (as stored: ``stored``). ``msgspec.
    MsgspecError`` when it cannot be decoded: ``event_from_envelope`` validates the
    payload's shape, and a journal's event has an id (a positive integer), its row's
    (``event_id``, when given)."""
    event = event_from_envelope(stored(envelope))
    if event.id is None or event.id < 1 or event_id is not None and event.id != event_id:
        raise msgspec.ValidationError(f"event id {event.id!r} in the row of {event_id!r}")
    return event


def terminal_of(settled: PromptSettled) -> PromptTerminal:
    return PromptTerminal(prompt_id=settled.prompt_id, terminal=settled.terminal,
                          at=settled.at, stop_reason=settled.stop_reason,
                          error_code=settled.error_code)


def terminal_from_event(envelope: Any, pid: str) -> PromptTerminal | None:
    """Prompt ``pid``'s terminal as ``Session._settle`` gave it, from its end's event
    (``turn_complete`` or ``turn_error``, as stored); ``None`` when it cannot be
    decoded."""
    try:
        event = decode_event(envelope)
    except msgspec.MsgspecError:
        return None   # logged with the ring's events when it is one of them
    data, at = event.data, int(event.timestamp_ms)
    if event.type == TURN_ENDS[0]:
        state = "cancelled" if data.stop_reason == "cancelled" else "completed"
        return PromptTerminal(prompt_id=pid, terminal=state, at=at,
                              stop_reason=data.stop_reason)
    return PromptTerminal(prompt_id=pid, terminal="failed", at=at, error_code=data.code)


def read_open_in(conn: Any, sql: Callable[[str], str], only: Sequence[str],
                 exclude: Container[str] = ()) -> list[RestoredSession]:
    """The open sessions not in ``exclude``, oldest first (the module docstring)."""
    found: dict[str, RestoredSession] = {}
    for sid, blob, terminal, last, newest in conn.execute(sql(
            "SELECT s.id, s.record, "
            "(SELECT p.terminal FROM session_prompts p WHERE p.session_id = s.id "
            "AND p.terminal IS NOT NULL "
            "ORDER BY COALESCE(p.settled_at, 0) DESC, p.seq DESC LIMIT 1), "
            "(SELECT MAX(e.last_id) FROM session_segments e WHERE e.session_id = s.id "
            "AND e.last_id > 0), "
            "(SELECT e.events FROM session_segments e WHERE e.session_id = s.id "
            "AND e.last_id > 0 ORDER BY e.last_id DESC LIMIT 1) "
            f"{_OPEN} ORDER BY s.created_at")).fetchall():
        if sid in exclude:
            continue
        record = decode_opened(sid, blob)
        if record is None:
            continue
        session = found[sid] = RestoredSession(
            record=record, events=[], last_event_id=last or 0, terminals=[], unsettled=[],
            started=set())
        if terminal is not None:
            try:
                session.terminals.append(decode_settled(terminal))
            except msgspec.MsgspecError as exc:
                log.error("session journal: a settled prompt of session %s is unreadable "
                          "(%s): skipped", sid, exc)
        if newest is not None:
            try:
                _add_event(session, decode_segment(newest)[-1][3])
            except msgspec.MsgspecError as exc:
                log.error("session journal: the newest events of session %s (through id "
                          "%s) are unreadable (%s): skipped", sid, last, exc)
    if not found:
        return []
    wanted = set(only)
    kinds = " OR ".join(contains("e.types") for _ in only) or "FALSE"
    for sid, segments in _segments_by_session(conn.execute(sql(
            f"SELECT e.session_id, e.first_id, e.events FROM session_segments e "
            f"{_OPEN_JOIN.format(t='e')} AND e.last_id > 0 AND ({kinds}) "
            "ORDER BY e.session_id, e.last_id"), around(*only))):
        session = found.get(sid)
        if session is None:
            continue
        for _, kind, _, envelope in events_of(sid, segments, logged=False):
            if kind in wanted:
                _add_event(session, envelope)
    for session in found.values():
        session.events.sort(key=lambda event: event.id)   # type: ignore[arg-type,return-value]
    if _read_unsettled(conn, sql, found):
        _read_started(conn, sql, found)
    return list(found.values())


def _segments_by_session(rows: Iterable[tuple[Any, ...]]
                         ) -> Iterator[tuple[str, list[tuple[Any, Any]]]]:
    """``(session_id, first_id, events)`` rows, in session order, as each session's
    segments (``(first_id, events)``, in their order)."""
    sid: str | None = None
    segments: list[tuple[Any, Any]] = []
    for row_sid, first_id, blob in rows:
        if row_sid != sid:
            if sid is not None:
                yield sid, segments
            sid, segments = row_sid, []
        segments.append((first_id, blob))
    if sid is not None:
        yield sid, segments


def _add_event(session: RestoredSession, envelope: Any) -> None:
    """``envelope``'s event (as stored), unless the session has it already (its newest
    may be of the types asked too) or it cannot be decoded (logged)."""
    try:
        event = decode_event(envelope)
    except msgspec.MsgspecError as exc:
        log.error("session journal: an event of session %s is unreadable (%s): skipped",
                  session.record.session_id, exc)
        return
    if all(seen.id != event.id for seen in session.events):
        session.events.append(event)


def _read_unsettled(conn: Any, sql: Callable[[str], str],
                    found: dict[str, RestoredSession]) -> bool:
    """Each session's prompts accepted and not settled, in admission order: whether
    there is any."""
    any_unsettled = False
    for sid, pid, blob in conn.execute(sql(
            f"SELECT p.session_id, p.prompt_id, p.record FROM session_prompts p "
            f"{_OPEN_JOIN.format(t='p')} AND p.terminal IS NULL "
            f"ORDER BY p.session_id, p.seq")).fetchall():
        if sid not in found:
            continue
        try:
            found[sid].unsettled.append(decode_accepted(blob))
            any_unsettled = True
        except msgspec.MsgspecError as exc:
            log.error("session journal: prompt %s of session %s is unreadable (%s): "
                      "skipped", pid, sid, exc)
    return any_unsettled


def _read_started(conn: Any, sql: Callable[[str], str],
                  found: dict[str, RestoredSession]) -> None:
    """Which unsettled prompts started (an event of theirs past their admission), and
    which ended though their rows say otherwise (their ``turn_complete`` or
    ``turn_error``, ``settled_from_events``): those are settled, their end a terminal."""
    ended: dict[tuple[str, str], Any] = {}
    for sid, segments in _segments_by_session(conn.execute(sql(
            "SELECT e.session_id, e.first_id, e.events FROM session_segments e "
            f"{_OPEN_JOIN.format(t='e')} AND e.last_id > 0 AND EXISTS (SELECT 1 FROM "
            "session_prompts p WHERE p.session_id = e.session_id AND p.terminal IS NULL "
            f"AND {contains('e.prompts', 'p.prompt_id')}) "
            "ORDER BY e.session_id, e.last_id"), AROUND)):
        session = found.get(sid)
        if session is None:
            continue
        ids = {p.prompt_id for p in session.unsettled}
        for _, kind, pid, envelope in events_of(sid, segments, logged=False):
            if pid not in ids or kind == "pending_prompt_added":
                continue
            session.started.add(pid)   # type: ignore[arg-type]
            if kind in TURN_ENDS and (sid, pid) not in ended:
                ended[sid, pid] = envelope   # type: ignore[index]
    for (sid, pid), envelope in ended.items():
        terminal = terminal_from_event(envelope, pid)
        if terminal is None:
            continue
        session = found[sid]
        session.unsettled = [p for p in session.unsettled if p.prompt_id != pid]
        session.started.discard(pid)
        if not session.terminals or session.terminals[-1].at <= terminal.at:
            session.terminals[:] = [terminal]
