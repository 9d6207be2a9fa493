"""The session journal's events on disk: segment rows (schema migration 8).

    blob = encode_segment([(1, "user_message_chunk", "p1", envelope), ...])
    for event_id, kind, prompt_id, envelope in events_of(sid, rows):   # rows: (last_id, blob)
        ...

A session's events of one commit (of one run of records between two session records,
``session_writes._put``; at most ``SEGMENT_EVENTS``) are ONE row of
``session_segments``: ``(session_id, last_id)`` its key, ``first_id`` and ``last_id``
the ids of its first and last event, ``size`` the sum of its envelopes' lengths (what
the byte bound counts: ``SUM(size)`` where the rows were ``SUM(LENGTH(envelope))``),
``types`` and ``prompts`` its events' types and prompt ids as ``,a,b,`` (a filter in
SQL, ``contains``, where the rows had a column each: the fleet's listing reads only the
segments with the types it asks, never every open session's whole ring), ``events`` the
events themselves: a msgpack array of ``[id, type, prompt_id, envelope]`` arrays, ids
increasing (one ``msgspec`` call decodes a segment, the envelopes as ``bin``: their
bytes, never re-encoded). A SQLite commit of a prompt's six events is one row instead of
six: the rows' own cost (~3.5 µs of SQLite CPU a row) is paid once a session a commit.

Readers keep the semantics of one row an event:

* By cursor (``id > after``): the segments with ``last_id > after``, in key order, their
  events past ``after`` (a segment straddling the cursor gives only its newer events).
* An event never comes twice: a segment that repeats ids an earlier one holds gives
  only the ids past the last one given (``events_of``). A commit sent again after one
  that may have landed (its answer lost) deletes the stored segments its own cover
  first (``session_writes._drop_covered``), so no size counts twice either.
* A segment that cannot be decoded is logged and skipped, as an unreadable event row
  was: the restore then sees a hole in the ids (a new epoch), a reader by cursor a row
  it cannot decode (``UNREADABLE``: it resumes). An envelope that cannot be decoded
  inside a readable segment is the caller's to skip, as before.
* The write-behind marker is a segment of no events: ``last_id = 0`` (``MARKER_ID``),
  ``size`` 0; every reader of events asks for ``last_id > 0``.
* A segment holds at most ``SEGMENT_EVENTS`` events (a larger commit's are cut).
* Trims delete whole segments: the ring's those wholly below its bound (a segment
  straddling it is kept: fewer than ``SEGMENT_EVENTS`` events more than ``ring_size``,
  and a restore reads only the newest ``ring_size``); the byte trim rewrites the segment
  straddling its bound to its newest events that fit (``session_writes._trim_bytes``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

log = logging.getLogger("acp_server.store.sessions")

Row = tuple[int, str, str | None, bytes]   # an event: id, type, prompt id, envelope
_DECODER = msgspec.msgpack.Decoder(list[Row])
_ENCODER = msgspec.msgpack.Encoder()
# A reader by cursor's stand-in for a segment it cannot decode: no envelope decodes
UNREADABLE = b""
# Events a segment at most (a commit of more, a burst's or one after an outage, is cut
# in segments of this many): what a read decodes past what it asks (a reader by cursor
# reads 512 events at a time), and what the ring keeps past ``ring_size``
SEGMENT_EVENTS = 256

SEGMENT_INSERT = ("INSERT INTO session_segments(session_id, first_id, last_id, size, types, "
                  "prompts, events) VALUES {} ON CONFLICT DO NOTHING", 7)
MARKER_INSERT = ("INSERT INTO session_segments(session_id, first_id, last_id, size, types, "
                 "prompts, events) VALUES (?, 0, 0, 0, '', '', ?) ON CONFLICT DO NOTHING")


def encode_segment(rows: list[Row]) -> bytes:
    """``rows`` (ids increasing) as a segment's ``events``."""
    return _ENCODER.encode(rows)


def segment_values(sid: str, rows: list[Row]) -> tuple[Any, ...]:
    """``SEGMENT_INSERT``'s values of one segment of ``sid`` holding ``rows``."""
    size = 0
    types: set[str] = set()
    prompts: set[str | None] = set()
    for event in rows:
        size += len(event[3])
        types.add(event[1])
        prompts.add(event[2])
    prompts.discard(None)
    return (sid, rows[0][0], rows[-1][0], size, _listed(types), _listed(prompts),
            encode_segment(rows))


def _listed(values: Iterable[Any]) -> str:
    """``,a,b,``: what ``LIKE '%,a,%'`` finds (``contains``)."""
    return "," + ",".join(values) + "," if values else ""


def contains(column: str, value: str = "?") -> str:
    """SQL true when the ``types`` or ``prompts`` list ``column`` may hold ``value`` (a
    parameter, ``?``, or a column): a superset (a comma in a value, ASCII case in
    SQLite), so its readers check each event. ``value``'s ``\\``, ``%`` and ``_`` are
    escaped in SQL (``ESCAPE '\\'``): PostgreSQL's LIKE takes a backslash as its escape
    by default, so an /acp prompt id ``a\\b`` (any characters) unescaped found no segment
    of its own. Its parameters: ``around(value)`` (``AROUND`` for a column): the
    pattern's ends and escapes are parameters, no ``%`` in the statement's text
    (psycopg's placeholders)."""
    return (f"{column} LIKE ? || replace(replace(replace({value}, ?, ?), ?, ?), ?, ?) "
            "|| ? ESCAPE ?")


_ESCAPES = ("\\", "\\\\", "%", "\\%", "_", "\\_")   # replace()'s, the escape first
AROUND = ("%,", *_ESCAPES, ",%", "\\")   # the parameters of a ``contains`` of a column


def around(*values: str) -> tuple[str, ...]:
    """``contains``'s parameters for each of ``values``."""
    out: tuple[str, ...] = ()
    for value in values:
        out += ("%,", value, *_ESCAPES, ",%", "\\")
    return out


def decode_segment(blob: Any) -> list[Row]:
    """A segment's events (as stored: a blob, ``bytea``'s memoryview, or a TEXT value
    written by hand). ``msgspec.MsgspecError`` when it cannot be decoded, or its ids
    are not positive and increasing."""
    if isinstance(blob, str):
        blob = blob.encode("utf-8", "surrogatepass")
    elif not isinstance(blob, (bytes, bytearray, memoryview)):
        raise msgspec.DecodeError(f"a segment of type {type(blob).__name__}")
    rows = _DECODER.decode(blob)
    last = 0
    for row in rows:
        if row[0] <= last:
            raise msgspec.ValidationError(f"event id {row[0]} after {last}")
        last = row[0]
    if not rows:
        raise msgspec.ValidationError("a segment without events")
    return rows


def readable(sid: str, first: Any, blob: Any, *, logged: bool = True) -> list[Row] | None:
    """``decode_segment(blob)``, or ``None`` for a segment that cannot be decoded
    (logged unless not ``logged``: ``first`` its first id, ``sid`` its session's)."""
    try:
        return decode_segment(blob)
    except msgspec.MsgspecError as exc:
        if logged:
            log.error("session journal: the events of session %s from id %s are "
                      "unreadable (%s): skipped", sid, first, exc)
        return None


def events_of(sid: str, segments: Iterable[tuple[Any, ...]], after: int = 0,
              unreadable: list[int] | None = None, *, logged: bool = True
              ) -> Iterator[Row]:
    """The events of ``segments`` (rows whose last two columns are ``first_id`` and
    ``events``, in ``last_id`` order) past ``after``, each id once. A segment that
    cannot be decoded is skipped (logged unless not ``logged``: a read beside the
    ring's, which logs it); its ``first_id`` is added to ``unreadable`` when given."""
    last = after
    for row in segments:
        first = row[-2]
        events = readable(sid, first, row[-1], logged=logged)
        if events is None:
            if unreadable is not None:
                unreadable.append(int(first))
            continue
        for event in events:
            if event[0] > last:
                last = event[0]
                yield event


def split_newest(events: list[Row], bound: int, keep_one: bool) -> list[Row]:
    """The newest of ``events`` whose envelopes take at most ``bound`` bytes (at least
    the newest one when ``keep_one``)."""
    total, start = 0, len(events)
    while start:
        total += len(events[start - 1][3])
        if total > bound and not (keep_one and start == len(events)):
            break
        start -= 1
    return events[start:]


def segments_apart(conn: Any, postgres: bool) -> None:
    """Migration 8: every row of ``session_events`` (one an event) into
    ``session_segments``, a session's run of consecutive ids (at most ``RUN`` events)
    a segment, the write-behind marker (``id = 0``) its own empty one; then
    ``session_events`` is dropped. The envelopes are copied as stored (one that
    cannot be decoded stays so: the restore skips it, as before). On SQLite a TEXT
    value that is not UTF-8 (a row written by hand) reads as U+FFFD, as the restore
    read it before (``session_reads._tolerant_text``): never a migration that fails,
    so a store that can never be opened."""
    if postgres:
        _segments_apart(conn, postgres)
        return
    before = conn.text_factory
    conn.text_factory = _replacing
    try:
        _segments_apart(conn, postgres)
    finally:
        conn.text_factory = before


def _replacing(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _segments_apart(conn: Any, postgres: bool) -> None:
    mark = "%s" if postgres else "?"
    exists = conn.execute(
        "SELECT 1 FROM information_schema.tables WHERE table_name = 'session_events' "
        "AND table_schema = current_schema()" if postgres else
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'session_events'"
    ).fetchone()
    if exists is None:
        return
    envelope = "envelope" if postgres else "CAST(envelope AS BLOB)"
    marker = MARKER_INSERT.replace("?", mark)
    insert = SEGMENT_INSERT[0].format("(" + ",".join([mark] * SEGMENT_INSERT[1]) + ")")
    sids = [row[0] for row in conn.execute(
        "SELECT DISTINCT session_id FROM session_events").fetchall()]
    for sid in sids:
        after = -1
        while True:   # at most BATCH rows of a session in memory at a time
            rows = conn.execute(
                f"SELECT id, type, prompt_id, {envelope} FROM session_events "
                f"WHERE session_id = {mark} AND id > {mark} ORDER BY id LIMIT {BATCH}",
                (sid, after)).fetchall()
            run: list[Row] = []
            for event_id, kind, pid, env in rows:
                event_id = int(event_id)
                if event_id == 0:
                    conn.execute(marker, (sid, b""))
                    continue
                if run and (event_id != run[-1][0] + 1 or len(run) >= RUN):
                    conn.execute(insert, segment_values(sid, run))
                    run = []
                run.append((event_id, str(kind), None if pid is None else str(pid),
                            bytes(env) if isinstance(env, (bytes, bytearray, memoryview))
                            else str(env).encode("utf-8", "surrogatepass")))
            if run:
                conn.execute(insert, segment_values(sid, run))
            if len(rows) < BATCH:
                break
            after = int(rows[-1][0])
    conn.execute("DROP TABLE session_events")


RUN = 64      # events a migrated segment (the byte trim's unit on what was migrated)
BATCH = 4096  # rows a migration reads at a time

