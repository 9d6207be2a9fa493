"""``GET /workspace/{id}/ended-sessions``: the closed sessions the journal keeps, newest
end first, a page at a time: what ``/load`` can bring back.

    $ curl -s localhost:4170/workspace/6a48a62980ca2198/ended-sessions?size=2
    {"sessions":[{"sessionId":"3c0f…","workspaceCwd":"/abs/ws","agent":"reference",
      "createdAt":"2026-12-05T01:02:03.456Z","endedAt":"2026-12-05T01:09:12.001Z",
      "origin":null,"owner":"ci","forkedFrom":null}],"nextCursor":"RUHaTCe6HqKbM2MwZ…"}

A session whose agent died, that the idle timeout closed, whose ``/acp`` connection
went (any close that is not a deletion), leaves the live listing (``rest.workspace``,
as the peer's does) but not the journal: its conversation is kept for ``--session-retention``, and
``POST /session/{id}/load`` (or ``/resume``, or ``/acp`` ``session/load``) brings it
back (``bridge.restore.reseed_closed`` when its agent forgot it). This listing is how a
client finds those ids again. Contracts:

* The items are the journal's closed sessions (``SessionJournal.ended``), newest end
  first, ties by id: a deleted session (``DELETE``, ``/acp`` ``session/close`` and
  ``session/delete``) is not kept, nor one past the retention, nor one live here (a
  loaded one is live again: the live listing has it). Without a durable journal
  (``--session-journal memory``) the list is empty.
* Each principal lists the sessions it sees, as in the live listing: its own, every
  one for an admin or with ``--share-sessions``; a session with no owner in the
  journal, admins only.
* ``{id}`` as the live listing's (404 ``workspace_not_found``); ``size`` as there
  (1..100, default 20, read as the peer reads it). ``cursor`` is the ``nextCursor``
  of the previous page, a position (``acp_server.http.ended_cursor``), exactly as this
  route mints it, else 400 ``invalid_cursor``. A session ended before the walk and kept during it
  is on exactly one page; one that ends during the walk is newer than the cursor and
  not listed by it.
* A page reads at most ``ended_cursor.MAX_SCAN`` journal rows: where the caller sees
  few of them, a page may hold fewer than ``size`` sessions with a ``nextCursor``:
  follow it until it is absent.
* The store down is 503 ``store_unavailable`` with ``Retry-After`` (the door's shape).
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from acp_server.http.endpoints import route
from acp_server.http.ended_cursor import InvalidCursor, decode, encode, ended_page
from acp_server.principals import caller_of
from acp_server.rest import wire
from acp_server.rest.errors import bad_request, json_response
from acp_server.rest.workspace import check_workspace, page_size
from bridge import Bridge
from bridge.journal import EndedSession


def _item(ended: EndedSession) -> wire.EndedSession:
    record = ended.record
    return wire.EndedSession(
        sessionId=record.session_id, workspaceCwd=record.cwd, agent=record.agent,
        createdAt=wire.iso(record.created_at), endedAt=wire.iso(ended.ended_at),
        origin=record.origin, owner=record.owner, forkedFrom=record.forked_from)


async def list_ended(request: Request, *, bridge: Bridge) -> Response:
    check_workspace(request, bridge)
    size = page_size(request)
    cursor = request.query_params.get("cursor") or None
    try:
        after = None if cursor is None else decode(cursor)
    except InvalidCursor:
        raise bad_request(f'Invalid cursor: "{cursor[:64]}" is not a valid ended-session '
                          "cursor", "invalid_cursor") from None
    caller = caller_of(request.scope)

    def keep(ended: EndedSession) -> bool:
        return (not bridge.has_session(ended.record.session_id)
                and caller.sees(ended.record.owner))

    page, more = await ended_page(bridge.journal, keep, size, after)
    return json_response(200, wire.EndedSessionPage(
        sessions=[_item(e) for e in page],
        nextCursor=msgspec.UNSET if more is None else encode(more)))


def routes(bridge: Bridge) -> list[BaseRoute]:
    return [route("/workspace/{workspace}/ended-sessions", list_ended, ["GET"],
                  bridge=bridge)]
