"""The keyset cursor of the session listings (REST ``GET /workspace/{id}/sessions``,
``/acp`` ``session/list``): stable paging over a list that changes between page reads.

    rows = ordered(bridge.list_sessions())            # newest first, a total order
    page, more = page_after(rows, decode(cursor), 20)  # cursor None: the first page
    next_cursor = encode(key_of(page[-1])) if more else None
    decode("20")                                       # InvalidCursor (not one we mint)

Contracts:

* The order is ``(created µs descending, session hash ascending)``: ``createdUs`` is the
  session's creation time in whole microseconds, ``sessionHash`` the first 128 bits of
  the BLAKE2b of its id (32 hex digits). Both are fixed for a session's life (a
  restored session keeps its journaled creation time), so the order of the sessions
  that stay is the same on every read: the ties of one microsecond are broken by the
  hash, not by arrival. (A creation time out of ``0..MAX_CREATED_US`` counts as the
  nearer bound, one that is not a number as 0.)
* A page is the ``size`` sessions after the cursor's key in that order (strictly
  after: the key itself, the last session of the previous page, is not repeated). A
  session live for the whole walk is on exactly one page; one created or closed
  during the walk on at most one (one arriving is listed when its key is past the
  cursor's: a new session's is not, an adopted one keeps its journaled creation time
  and may be; a session closed then loaded again gets a new creation time, so it
  cannot come back behind the cursor).
* A cursor is ``base64url`` (no padding) of the JSON
  ``{"createdUs": int, "sessionHash": "…"}``: the key of the previous page's last
  session (a position, not an offset: that session may be gone). It is opaque to
  clients, as ``qwen serve``'s live cursor is (base64url JSON there too). It names the
  hash, not the id: its length is fixed (``MAX_CURSOR_CHARS``) whatever the agent's ids.
* ``decode`` accepts exactly the strings ``encode`` makes: at most
  ``MAX_CURSOR_CHARS`` ASCII base64url characters whose bytes are the canonical JSON of
  a key in range, nothing more (no padding, spaces, other keys, key order or escapes).
  Anything else, the numeric offsets of earlier versions included, is ``InvalidCursor``
  (REST's 400 ``invalid_cursor``, ``/acp``'s ``-32602``: the client starts the walk
  again). A forged
  cursor of that exact form is a position like any other and pages from there.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import math
import re
from collections.abc import Iterable
from typing import Annotated

import msgspec

from bridge import SessionStatus

MAX_CREATED_US = 2**53   # past year 2255; keeps the number exact in a JSON reader's double
_HASH_BYTES = 16
_ALPHABET = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)


class InvalidCursor(ValueError):
    """Not a cursor this listing made."""


class SessionKey(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A session's place in the listing's order (the cursor's JSON)."""

    createdUs: Annotated[int, msgspec.Meta(ge=0, le=MAX_CREATED_US)]
    sessionHash: Annotated[str, msgspec.Meta(pattern=f"^[0-9a-f]{{{2 * _HASH_BYTES}}}$")]

    def order(self) -> tuple[int, str]:
        """The ascending sort key: newest first, then by hash."""
        return -self.createdUs, self.sessionHash


_decoder = msgspec.json.Decoder(SessionKey)
_encoder = msgspec.json.Encoder()


def key_of(status: SessionStatus) -> SessionKey:
    digest = hashlib.blake2b(status.session_id.encode("utf-8", "surrogatepass"),
                             digest_size=_HASH_BYTES).hexdigest()
    created = status.created_at if math.isfinite(status.created_at) else 0.0
    created_us = min(max(round(created * 1_000_000), 0), MAX_CREATED_US)
    return SessionKey(createdUs=created_us, sessionHash=digest)


def encode(key: SessionKey) -> str:
    return base64.urlsafe_b64encode(_encoder.encode(key)).rstrip(b"=").decode("ascii")


MAX_CURSOR_CHARS = len(encode(SessionKey(createdUs=MAX_CREATED_US,
                                         sessionHash="f" * 2 * _HASH_BYTES)))


def decode(cursor: str) -> SessionKey:
    """The key ``cursor`` names; ``InvalidCursor`` unless ``encode`` made it."""
    if len(cursor) > MAX_CURSOR_CHARS or not _ALPHABET.fullmatch(cursor):
        raise InvalidCursor(cursor)
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = _decoder.decode(raw)
    except ValueError:   # binascii.Error, msgspec.DecodeError
        raise InvalidCursor(cursor) from None
    if encode(key) != cursor:   # only the canonical spelling: one string per position
        raise InvalidCursor(cursor)
    return key


def ordered(sessions: Iterable[SessionStatus]) -> list[tuple[SessionKey, SessionStatus]]:
    """The sessions with their keys, in the listing's order."""
    return sorted(((key_of(s), s) for s in sessions), key=lambda row: row[0].order())


def page_after(rows: list[tuple[SessionKey, SessionStatus]], after: SessionKey | None,
               size: int) -> tuple[list[tuple[SessionKey, SessionStatus]], bool]:
    """The ``size`` rows past ``after`` (from the first when ``None``) and whether more
    follow. ``rows`` is ``ordered``'s list."""
    start = 0 if after is None else bisect.bisect_right(
        rows, after.order(), key=lambda row: row[0].order())
    return rows[start:start + size], start + size < len(rows)
