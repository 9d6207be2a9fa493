"""``GET /workspace/{id}/sessions``: the live sessions of the workspace, newest first.

    $ curl -s localhost:4170/capabilities | jq -r '.workspaces[0].id'     # 6a48a62980ca2198
    $ curl -s localhost:4170/workspace/6a48a62980ca2198/sessions?size=2
    {"sessions":[{"sessionId":"3c0f…","workspaceCwd":"/abs/ws","createdAt":"2026-…Z",
      "clientCount":1,"hasActivePrompt":true,"agent":"reference","pendingPrompts":3,
      "queuedPrompts":2,"maxPendingPrompts":5,"activePromptId":"…","activePromptText":"…",
      "subscribers":1,"isWaitingForPermission":false,…}],"nextCursor":"eyJjcmVhdGVkVXMi…"}

The peer serves this route (``GET /workspace/:id/sessions``, also
``/workspaces/:workspace/sessions``, an alias here too: ``acp_server.app``) with
persisted sessions merged in; this daemon lists its live ones (restored ones
included). Contracts: ``{id}`` is the workspace id of ``/capabilities``
(``workspaces[0].id``); another id, a relative path (``rel%2Fx``, decoded by the
server into segments no route has: ``rest.errors.handle_http``) is 400 with qwen's
message (its ``resolveRuntimeFromWorkspaceParam``: "`:id` must decode to a workspace id
or absolute path") and ``code`` ``workspace_not_found`` (qwen's has none). The
workspace's absolute path there (URL-encoded, as the peer takes it) is the same listing
through the front layer's mounts (``acp_server.app.workspace_mounts``); another
folder's is qwen's 400 ``{error: 'Workspace mismatch: daemon is bound to "<cwd>"',
code: "workspace_mismatch", boundWorkspace, requestedWorkspace}`` (the path normalized
as the mounts do, no symlink followed: qwen's follows them). ``size`` 1..100
(default 20; clamped, and anything not a number is the default, as the peer reads
it); ``cursor`` is the ``nextCursor`` of the previous page (empty: the first page),
else 400 ``invalid_cursor``. Paging is by
keyset (``session_cursor``): newest first, and a session live for the whole walk is on
exactly one page whatever is created or closed between the reads; the numeric offsets
of earlier versions are 400 ``invalid_cursor`` (the client starts again).
``maxPendingPrompts`` is ``null`` when the cap is off. Each principal lists the
sessions it sees (its own; every one for an admin or with ``--share-sessions``);
``owner`` names the principal that made the session (``null``: none this instance
knows, as the LMSP runner's).
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import unquote

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from acp_server.http import session_cursor
from acp_server.http.endpoints import route
from acp_server.http.mounts import ABSOLUTE
from acp_server.http.session_cursor import SessionKey
from acp_server.principals import caller_of
from acp_server.rest import wire
from acp_server.rest.errors import NOT_AN_ID, RestError, bad_request, json_response
from acp_server.rest.sessions import status_fields
from bridge import Bridge, SessionStatus

DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100


def workspace_id(cwd: str) -> str:
    """A stable id of the workspace folder (16 hex digits, as the peer's ids look)."""
    return hashlib.sha256(cwd.encode()).hexdigest()[:16]


def workspaces(bridge: Bridge) -> list[wire.WorkspaceInfo]:
    """``/capabilities`` ``workspaces``: the one workspace this daemon serves."""
    return [wire.WorkspaceInfo(id=workspace_id(bridge.workspace_cwd),
                               cwd=bridge.workspace_cwd, primary=True)]


def session_summary(status: SessionStatus, owner: str | None = None) -> wire.SessionSummary:
    fields = status_fields(status)
    fields["updatedAt"] = wire.iso(status.updated_at)   # the listing's: the last activity
    return wire.SessionSummary(
        **fields, agent=status.agent,
        maxPendingPrompts=status.max_pending_prompts,
        activePromptText=status.active_prompt_text, origin=status.origin, owner=owner,
        displayName=msgspec.UNSET if status.display_name is None else status.display_name)


_SIGNED_DIGITS = re.compile(r"[+-]?[0-9]+", re.ASCII)


def page_size(request: Request) -> int:
    """``size`` as the peer reads it: ASCII digits with an optional sign, spaces
    around them ignored, clamped to 1..``MAX_PAGE_SIZE``; anything else (absent, empty,
    ``x``, ``²``, ``1.5``) is the default. Never an error: ``@qwen-code/sdk`` asks for up
    to 1000 and gets the peer's 100."""
    raw = request.query_params.get("size")
    text = "" if raw is None else raw.strip()
    if not _SIGNED_DIGITS.fullmatch(text):
        return DEFAULT_PAGE_SIZE
    if len(text) > 20:   # far out of range either way (and past ``int``'s digit limit)
        return 1 if text.startswith("-") else MAX_PAGE_SIZE
    return min(max(int(text), 1), MAX_PAGE_SIZE)


def _after(request: Request) -> SessionKey | None:
    """The key the ``cursor`` names (``None``: none or empty, the first page)."""
    cursor = request.query_params.get("cursor") or None
    if cursor is None:
        return None
    try:
        return session_cursor.decode(cursor)
    except session_cursor.InvalidCursor:
        raise bad_request(f'Invalid cursor: "{cursor[:64]}" is not a valid live cursor',
                          "invalid_cursor") from None


MAX_ECHOED_PATH = 4096   # characters of another folder's path named in the answer


def check_workspace(request: Request, bridge: Bridge, *, as_peer: bool = False) -> None:
    """404 ``workspace_not_found`` unless ``{workspace}`` is this daemon's; ``as_peer``
    (the peer's route, ``/workspace/{id}/sessions``): 400 as qwen serve 0.24.4's
    ``resolveRuntimeFromWorkspaceParam`` answers, another folder's absolute path (one
    segment starting ``%2F``, as ``acp_server.http.mounts`` hands it over)
    ``workspace_mismatch`` with qwen's message and fields, anything else qwen's
    ``NOT_AN_ID`` (and our ``code`` ``workspace_not_found``)."""
    requested = request.path_params["workspace"]
    if requested == workspace_id(bridge.workspace_cwd):
        return
    if not as_peer:
        raise RestError(404, {"error": "Workspace is not registered with this daemon.",
                              "code": "workspace_not_found", "workspace": requested[:256]})
    if requested.startswith(ABSOLUTE):
        bound = bridge.workspace_cwd
        raise RestError(400, {"error": f'Workspace mismatch: daemon is bound to "{bound}"',
                              "code": "workspace_mismatch", "boundWorkspace": bound,
                              "requestedWorkspace": unquote(requested)[:MAX_ECHOED_PATH]})
    raise RestError(400, {"error": NOT_AN_ID, "code": "workspace_not_found",
                          "workspace": unquote(requested)[:256]})


async def list_sessions(request: Request, *, bridge: Bridge) -> Response:
    check_workspace(request, bridge, as_peer=True)
    size, after = page_size(request), _after(request)
    caller = caller_of(request.scope)
    owners = caller.gate.sessions
    sessions = await bridge.list_all_sessions()   # with several instances, theirs too
    visible = (s for s in sessions if caller.sees(owners.owner(s.session_id)))
    page, more = session_cursor.page_after(session_cursor.ordered(visible), after, size)
    return json_response(200, wire.SessionPage(
        sessions=[session_summary(s, owners.owner(s.session_id)) for _, s in page],
        nextCursor=session_cursor.encode(page[-1][0]) if more else msgspec.UNSET))


PLURAL_MISMATCH = ("Workspace mismatch: the requested workspace is not registered with this "
                   "daemon.")   # qwen 0.24.4's, for another folder on its plural routes


async def workspace_mismatch(request: Request) -> Response:
    """``/workspaces/{ws}/sessions`` and ``/workspaces/{ws}/acp`` of a ``{ws}`` that is
    not this daemon's workspace (its own are aliases, ``acp_server.app``), as qwen serve
    0.24.4's ``resolveWorkspaceEntryFromParam`` answers them: 400 ``workspace_mismatch``,
    for another folder's absolute path (``%2Fsrv%2Fother``, as ``acp_server.http.mounts``
    hands it over) with qwen's ``sendWorkspaceMismatch`` message and ``workspaceCount``,
    else (an id, a relative path) with its "`:workspace` must decode …"; ``workspace``
    (ours) echoes ``{ws}`` as routed."""
    requested = request.path_params["workspace"]
    if requested.startswith(ABSOLUTE):
        raise RestError(400, {"error": PLURAL_MISMATCH, "code": "workspace_mismatch",
                              "workspaceCount": 1, "workspace": requested[:256]})
    raise RestError(400, {"error": "`:workspace` must decode to a workspace id or absolute path",
                          "code": "workspace_mismatch", "workspace": requested[:256]})



def routes(bridge: Bridge) -> list[BaseRoute]:
    return [route("/workspace/{workspace}/sessions", list_sessions, ["GET"], bridge=bridge),
            route("/workspaces/{workspace}/sessions", workspace_mismatch, ["GET"]),
            route("/workspaces/{workspace}/acp", workspace_mismatch, ["GET", "POST", "DELETE"])]
