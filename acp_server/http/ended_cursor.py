"""The ended-session listings' paging (REST ``GET /workspace/{id}/ended-sessions``,
``/acp`` ``session/list`` after the live sessions): pages of the closed sessions the
journal keeps, newest end first, and their keyset cursor.

    page, more = await ended_page(bridge.journal, keep, 20, decode(cursor) if cursor else None)
    next_cursor = encode(more) if more is not None else None

Contracts:

* The order is ``SessionJournal.ended``'s: ``(ended_at, session id)`` descending. A
  page is up to ``size`` rows that ``keep`` accepts, strictly after the position;
  ``more`` is the position to go on from, ``None`` when no row follows. A page reads
  at most ``MAX_SCAN`` rows, and then the rest of the rows that ended at the very
  instant the last of them did (sessions closed together): where ``keep`` accepts
  few, it may hold fewer than ``size`` with a position (follow it until ``None``).
* A position names only a session ``keep`` accepted: the last of a full page, or,
  where the scan stopped, no session at all (``(ended_at, "")``: everything that
  ended before that instant). A row ``keep`` refused (another principal's session)
  is never in a cursor, neither its id nor its end.
* A cursor is unpadded ``base64url`` of ``E``, the end (a big-endian IEEE double,
  seconds) and the id's UTF-8 (none for an instant): at most ``MAX_CURSOR_CHARS``
  characters whatever the id, so a request line holds it. ``decode`` accepts exactly
  what ``encode`` makes of a finite time and a storable id (``bridge.journal.storable``)
  or none, else ``InvalidCursor``; no live listing's cursor (``session_cursor``) is one.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import struct
from collections.abc import Callable

from bridge.journal import MAX_SESSION_ID_BYTES, EndedSession, SessionJournal, storable

_ALPHABET = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)

BATCH = 100        # journal rows read at a time
MAX_SCAN = 2_000   # journal rows a page reads at most
_AT = struct.Struct(">cd")   # the tag (no other listing's cursor starts so), the end
_TAG = b"E"
# base64url of the tag, the end's 8 bytes and the id's UTF-8, unpadded: bounded
MAX_CURSOR_CHARS = -(-(_AT.size + MAX_SESSION_ID_BYTES) * 4 // 3)


class InvalidCursor(ValueError):
    """Not a cursor this listing made."""


def encode(key: tuple[float, str]) -> str:
    """The cursor of a position ``(ended_at, session id)``."""
    raw = _AT.pack(_TAG, key[0]) + key[1].encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode(cursor: str) -> tuple[float, str]:
    """The ``(ended_at, session id)`` a cursor names; ``InvalidCursor`` unless it is
    exactly what ``encode`` makes of a finite time and a storable id."""
    if len(cursor) > MAX_CURSOR_CHARS or not _ALPHABET.fullmatch(cursor):
        raise InvalidCursor(cursor)
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        tag, at = _AT.unpack_from(raw)
        sid = raw[_AT.size:].decode()
    except (binascii.Error, ValueError, struct.error):
        raise InvalidCursor(cursor) from None
    if (tag != _TAG or not math.isfinite(at) or not storable(sid)
            or encode((at, sid)) != cursor):
        raise InvalidCursor(cursor)   # another spelling of some key: not one we mint
    return at, sid


async def ended_page(journal: SessionJournal, keep: Callable[[EndedSession], bool],
                     size: int, after: tuple[float, str] | None
                     ) -> tuple[list[EndedSession], tuple[float, str] | None]:
    """Up to ``size`` kept sessions after ``after``, and the position to go on from
    (``None``: no more), reading at most ``MAX_SCAN`` rows and the rest of the last
    one's instant (see the contracts)."""
    page: list[EndedSession] = []
    before, scanned = after, 0
    while True:
        rows = await journal.ended(before=before, limit=BATCH)
        for row in rows:
            if scanned >= MAX_SCAN and before is not None and row.ended_at != before[0]:
                return page, (before[0], "")   # every row of that instant was read
            scanned += 1
            if keep(row):
                if len(page) == size:   # one more follows
                    return page, page[-1].key()
                page.append(row)
            before = row.key()
        if len(rows) < BATCH:
            return page, None
