"""``/acp`` ``session/list``: the sessions a caller sees, newest first, a page at a time.

    {"method": "session/list", "params": {"cwd": "/abs/ws"}}
    → {"sessions": [{"sessionId": "3c0f…", "cwd": "/abs/ws",
                     "updatedAt": "2026-12-04T03:01:12.345Z"}, …],
       "nextCursor": "eyJjcmVhdGVkVXMi…"}
    {"method": "session/list", "params": {"cursor": "eyJjcmVhdGVkVXMi…"}}   # the next page

ACP v1 (schema 1.21): ``ListSessionsRequest {cwd?, cursor?}`` →
``ListSessionsResponse {sessions: SessionInfo[], nextCursor?}``, ``SessionInfo
{sessionId, cwd, title?, updatedAt?}``. Contracts:

* The order and the cursor are the REST listing's (``bridge.session_cursor``): newest
  first by creation, a keyset cursor that is opaque to clients; a session live for the
  whole walk is on exactly one page whatever is created or closed between the reads.
  ``nextCursor`` is there only when more sessions follow; its absence ends the walk.
* ``title`` is the session's first prompt's name (``bridge.pending.display_name``, as
  REST's ``displayName`` and qwen's ``title``), absent before its first prompt with text.
* A page holds at most ``PAGE_SIZE`` sessions (the schema has no size parameter).
* ``cwd`` (an absolute path, or absent/``null``) keeps the sessions of that folder,
  resolved as ``session/new`` resolves its ``cwd`` (symbolic links, ``..``, a trailing
  ``/``), so a spelling a session can be made with lists it. One that is not a string
  or not absolute is ``-32602`` (the schema: "Must be an absolute path"). The cursor
  is a position in the whole order, so the filter may change between pages.
* A ``cursor`` that is not a string, or not one this server made (a live key, an
  ended position, ``ENDED_START``), is ``-32602`` (the client starts the walk again);
  an empty one is the first page.
* Each principal lists the sessions it sees (``Caller.sees_session``): its own, or
  every one for an admin or with ``--share-sessions``.
* The sessions are ``Bridge.list_sessions()``, as REST's listing: those restored
  from the journal at start are there from the start (their agent side comes back on
  first use, ``bridge.restore``), under the same order, cursor and visibility.
* After the live sessions come the ended ones the journal keeps (their agent died, the
  idle timeout closed them; not deleted ones), newest end first, under the same ``cwd``
  and visibility (``acp_server.http.ended_cursor``; REST's
  ``/workspace/{id}/ended-sessions``): ACP's list is the sessions a client may
  ``session/load``, and ``session/load`` brings these back. Their ``updatedAt`` is their
  end. The walk goes from the live pages to the ended ones through the cursor
  ``ENDED_START``; a session that ends during the walk may be listed in both parts.
  The store down: a page that has live sessions answers them with ``ENDED_START`` as
  its ``nextCursor``; a page of ended ones only is the store's error
  (``store_unavailable``).
* ``updatedAt`` is REST's ``updatedAt``: the session's last activity (a prompt
  accepted or ended, a client attaching, subscribing or beating), its creation time
  before any, and for a restored session the last the journal knows until it is used
  again (ISO 8601, UTC, milliseconds). There is no ``title`` (the bridge keeps none;
  agents' ``session_info_update`` pass through as events) and no ``_meta``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from acp_server.acp_http.errors import InvalidParamsError
from acp_server.http import session_cursor
from acp_server.http.session_cursor import SessionKey
from acp_server.http import ended_cursor as ended
from bridge.errors import JournalUnavailableError
from bridge.journal import EndedSession
from bridge.wire import iso

if TYPE_CHECKING:
    from acp_server.acp_http.connection import AcpConnection, RpcId

PAGE_SIZE = 50


def _cwd(params: dict[str, Any]) -> str | None:
    """The folder ``cwd`` names, resolved as ``session/new`` resolves its ``cwd``
    (``Bridge.check_workspace``: ``os.path.realpath``), so any spelling of the
    workspace a session can be made with lists its sessions."""
    cwd = params.get("cwd")
    if cwd is None:
        return None
    if not isinstance(cwd, str):
        raise InvalidParamsError('Invalid params: "cwd" must be a string')
    try:
        if os.path.isabs(cwd):
            return os.path.realpath(cwd)   # ValueError: a NUL, a lone surrogate
    except ValueError:
        pass
    raise InvalidParamsError(f'Invalid params: "cwd" must be an absolute path ("{cwd[:64]}")')


ENDED_START = "ended"   # the cursor of the ended sessions' first page (no key spells so)


def _after(params: dict[str, Any]) -> SessionKey | tuple[float, str] | str | None:
    """Where the ``cursor`` goes on: a live session's key, an ended session's position,
    ``ENDED_START`` (the ended sessions from the newest), or ``None`` (none, null or
    empty: the first page)."""
    cursor = params.get("cursor")
    if cursor is None or cursor == "":
        return None
    if not isinstance(cursor, str):
        raise InvalidParamsError('Invalid params: "cursor" must be a string')
    if cursor == ENDED_START:
        return ENDED_START
    try:
        return session_cursor.decode(cursor)
    except session_cursor.InvalidCursor:
        pass
    try:
        return ended.decode(cursor)
    except ended.InvalidCursor:
        raise InvalidParamsError(
            f'Invalid params: "cursor" is not a cursor of this server ("{cursor[:64]}"); '
            "start again without one") from None


def _titled(name: str | None) -> dict[str, str]:
    """ACP's ``title`` of a listed session: its first prompt's name, when it has one."""
    return {} if name is None else {"title": name}


async def session_list(conn: AcpConnection, rpc_id: RpcId, params: dict[str, Any]) -> Any:
    cwd, after = _cwd(params), _after(params)
    sessions: list[dict[str, Any]] = []
    if after is None or isinstance(after, SessionKey):
        sees = conn.caller.sees_session
        visible = (s for s in await conn.bridge.list_all_sessions()
                   if (cwd is None or s.workspace_cwd == cwd) and sees(s.session_id))
        page, more = session_cursor.page_after(session_cursor.ordered(visible), after,
                                               PAGE_SIZE)
        sessions = [{"sessionId": s.session_id, "cwd": s.workspace_cwd,
                     **_titled(s.display_name), "updatedAt": iso(s.updated_at)}
                    for _, s in page]
        if more:
            return {"sessions": sessions, "nextCursor": session_cursor.encode(page[-1][0])}
        after = ENDED_START
    bridge, caller = conn.bridge, conn.caller

    def keep(row: EndedSession) -> bool:
        record = row.record
        return ((cwd is None or record.cwd == cwd) and not bridge.has_session(record.session_id)
                and caller.sees(record.owner))

    room = PAGE_SIZE - len(sessions)
    try:
        if room == 0:   # the live sessions filled the page: the ended ones follow, if any
            follows, _ = await ended.ended_page(bridge.journal, keep, 1, None)
            return {"sessions": sessions, **({"nextCursor": ENDED_START} if follows else {})}
        rows, more = await ended.ended_page(
            bridge.journal, keep, room, None if after == ENDED_START else after)
    except JournalUnavailableError:
        if not sessions:
            raise
        # the live ones answer; the client asks for the ended ones again from here
        return {"sessions": sessions, "nextCursor": ENDED_START}
    sessions += [{"sessionId": r.record.session_id, "cwd": r.record.cwd,
                  **_titled(r.record.display_name), "updatedAt": iso(r.ended_at)}
                 for r in rows]
    result: dict[str, Any] = {"sessions": sessions}
    if more is not None:
        result["nextCursor"] = ended.encode(more)
    return result


__all__ = ["ENDED_START", "PAGE_SIZE", "session_list"]
