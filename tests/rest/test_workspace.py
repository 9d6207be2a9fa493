"""``GET /workspace/{id}/sessions`` over real HTTP: the live sessions with their queue
against the cap, paging, the workspace id of ``/capabilities``, and its errors."""

from __future__ import annotations

import base64
import math
from urllib.parse import quote
from pathlib import Path

import anyio
import pytest

from acp_server.http.session_cursor import MAX_CURSOR_CHARS
from bridge import BridgeOptions
from tests.rest.server import RunningServer, running_server

pytestmark = pytest.mark.anyio


async def _workspace_id(server: RunningServer) -> str:
    caps = (await server.client.get("/capabilities")).json()
    [workspace] = caps["workspaces"]
    assert workspace["cwd"] == server.settings.workspace and workspace["primary"] is True
    return str(workspace["id"])


async def _pending(server: RunningServer, sid: str, count: int) -> None:
    with anyio.fail_after(30):
        while (await server.client.get(f"/session/{sid}/status")).json()["pendingPrompts"] != count:
            await anyio.sleep(0.01)


async def test_lists_live_sessions_with_their_queue(server: RunningServer) -> None:
    wid = await _workspace_id(server)
    empty = await server.client.get(f"/workspace/{wid}/sessions")
    assert empty.status_code == 200 and empty.json() == {"sessions": []}
    busy = (await server.create_session(sessionScope="thread"))["sessionId"]
    idle = (await server.create_session(sessionScope="thread"))["sessionId"]
    for _ in range(3):
        assert (await server.prompt(busy, "/sleep 30s hold")).status_code == 202
    await _pending(server, busy, 3)
    body = (await server.client.get(f"/workspace/{wid}/sessions")).json()
    assert [s["sessionId"] for s in body["sessions"]] == [idle, busy]   # newest first
    row = body["sessions"][1]
    assert row["agent"] == "reference"
    assert (row["pendingPrompts"], row["queuedPrompts"], row["maxPendingPrompts"]) == (3, 2, 5)
    assert row["activePromptText"] == "/sleep 30s hold"
    assert row["hasActivePrompt"] is True and row["workspaceCwd"] == server.settings.workspace
    assert row["createdAt"].endswith("Z") and row["updatedAt"].endswith("Z")
    assert body["sessions"][0]["activePromptText"] is None
    assert "nextCursor" not in body
    await server.client.delete(f"/session/{busy}")
    after = (await server.client.get(f"/workspace/{wid}/sessions")).json()
    assert [s["sessionId"] for s in after["sessions"]] == [idle]


async def test_a_session_made_by_a_program_carries_its_origin(server: RunningServer) -> None:
    """``_meta["acp-server/origin"]`` of POST /session labels the session in the list;
    a malformed label is no label (the session is a person's), never an error."""
    wid = await _workspace_id(server)
    mine = (await server.create_session(sessionScope="thread"))["sessionId"]
    robot = (await server.create_session(
        sessionScope="thread", _meta={"acp-server/origin": "conformance"}))["sessionId"]
    odd = (await server.create_session(
        sessionScope="thread", _meta={"acp-server/origin": "<b>Not A Label</b>"}))["sessionId"]
    typed = (await server.create_session(sessionScope="thread", _meta=["not", "an", "object"]))
    origins = {s["sessionId"]: s["origin"]
               for s in (await server.client.get(f"/workspace/{wid}/sessions")).json()["sessions"]}
    assert origins == {mine: None, robot: "conformance", odd: None, typed["sessionId"]: None}


async def test_pages_with_size_and_cursor(server: RunningServer) -> None:
    wid = await _workspace_id(server)
    made = [(await server.create_session(sessionScope="thread"))["sessionId"] for _ in range(5)]
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params = {"size": "2", **({"cursor": cursor} if cursor else {})}
        body = (await server.client.get(f"/workspace/{wid}/sessions", params=params)).json()
        seen += [s["sessionId"] for s in body["sessions"]]
        pages += 1
        cursor = body.get("nextCursor")
        if cursor is None:
            break
    assert pages == 3 and seen == made[::-1]


async def _walk_page(server: RunningServer, wid: str, cursor: str | None,
                     size: int = 2) -> tuple[list[str], str | None]:
    params = {"size": str(size), **({"cursor": cursor} if cursor else {})}
    response = await server.client.get(f"/workspace/{wid}/sessions", params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    return [s["sessionId"] for s in body["sessions"]], body.get("nextCursor")


async def _delete(server: RunningServer, *sids: str) -> None:
    for sid in sids:
        assert (await server.client.delete(f"/session/{sid}")).status_code == 204


async def test_a_walk_with_deletes_and_creates_between_pages_sees_each_survivor_once(
        server: RunningServer) -> None:
    """Keyset paging: closing seen sessions does not skip the next ones (an offset did),
    new sessions ahead of the cursor do not repeat the last ones (an offset did), and a
    session closed before its page is not listed."""
    wid = await _workspace_id(server)
    s = [(await server.create_session(sessionScope="thread"))["sessionId"] for _ in range(8)]
    first, cursor = await _walk_page(server, wid, None)
    assert first == [s[7], s[6]] and cursor is not None
    await _delete(server, s[7], s[6], s[1])      # two seen, one not yet
    second, cursor = await _walk_page(server, wid, cursor)
    assert second == [s[5], s[4]]                # an offset of 2 gave s3, s2
    made = [(await server.create_session(sessionScope="thread"))["sessionId"]
            for _ in range(3)]                   # newer than the cursor: not on this walk
    seen = first + second
    while cursor is not None:
        page, cursor = await _walk_page(server, wid, cursor)
        seen += page
    assert seen == [s[7], s[6], s[5], s[4], s[3], s[2], s[0]]   # an offset repeated s4
    assert not set(made) & set(seen)
    everyone, _ = await _walk_page(server, wid, None, size=100)
    assert everyone == [*made[::-1], s[5], s[4], s[3], s[2], s[0]]


async def test_closing_the_cursors_own_session_does_not_lose_the_place(
        server: RunningServer) -> None:
    """The cursor is a position: the session it was taken from may be gone."""
    wid = await _workspace_id(server)
    s = [(await server.create_session(sessionScope="thread"))["sessionId"] for _ in range(4)]
    first, cursor = await _walk_page(server, wid, None)
    await _delete(server, first[-1])
    rest, cursor = await _walk_page(server, wid, cursor)
    assert (first, rest, cursor) == ([s[3], s[2]], [s[1], s[0]], None)


def _cursor(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


HASH = "0" * 32
GOOD = _cursor('{"createdUs":1767225600123456,"sessionHash":"%s"}' % HASH)
HOSTILE_CURSORS = {
    # huge: one past the longest cursor minted, and near the request line's 8 KiB cap
    "one_too_long": GOOD + "A" * (MAX_CURSOR_CHARS - len(GOOD) + 1),
    "huge": "A" * 7000,
    "huge_json": _cursor('{"createdUs":1,"sessionHash":"%s"}' % ("0" * 4000)),
    # non-ASCII
    "latin": "é", "arabic_indic_digit": "\u0661", "fullwidth": "\uff21\uff22\uff23",
    "emoji": "\U0001f600", "non_ascii_in_a_good_one": GOOD[:10] + "é" + GOOD[11:],
    "nul": "\x00", "newline": GOOD + "\n",
    # wrong shape
    "legacy_offset": "20", "zero": "0", "negative": "-1", "word": "x", "spaces": "a b",
    "padding": GOOD + "=", "standard_alphabet": GOOD[:-2] + "+/",
    "not_json": _cursor("hello"), "bad_utf8": _cursor(b"\xff\xfe{}"),
    "array": _cursor("[]"), "empty_object": _cursor("{}"), "null": _cursor("null"),
    "missing_hash": _cursor('{"createdUs":1}'),
    "string_time": _cursor('{"createdUs":"1","sessionHash":"%s"}' % HASH),
    "float_time": _cursor('{"createdUs":1.0,"sessionHash":"%s"}' % HASH),
    "negative_time": _cursor('{"createdUs":-1,"sessionHash":"%s"}' % HASH),
    "time_past_2_53": _cursor('{"createdUs":9007199254740993,"sessionHash":"%s"}' % HASH),
    "huge_time": _cursor('{"createdUs":1e400,"sessionHash":"%s"}' % HASH),
    "short_hash": _cursor('{"createdUs":1,"sessionHash":"00"}'),
    "upper_hash": _cursor('{"createdUs":1,"sessionHash":"%s"}' % ("A" * 32)),
    "surrogate_hash": _cursor('{"createdUs":1,"sessionHash":"\\ud800%s"}' % ("0" * 31)),
    "extra_field": _cursor('{"createdUs":1,"sessionHash":"%s","x":1}' % HASH),
    "nested": _cursor('{"createdUs":{"a":[1]},"sessionHash":"%s"}' % HASH),
    # forged: a key in range, not spelt as minted
    "spaced": _cursor('{"createdUs": 1, "sessionHash": "%s"}' % HASH),
    "reordered": _cursor('{"sessionHash":"%s","createdUs":1}' % HASH),
    "escaped": _cursor('{"createdUs":1,"sessionHash":"\\u0030%s"}' % ("0" * 31)),
    "duplicate_key": _cursor('{"createdUs":2,"createdUs":1,"sessionHash":"%s"}' % HASH),
    "qwen_live_cursor": _cursor('{"activityTime":1767225600123,"sessionId":"s"}'),
}


@pytest.mark.parametrize("cursor", HOSTILE_CURSORS.values(), ids=HOSTILE_CURSORS.keys())
async def test_a_hostile_cursor_is_400_invalid_cursor(server: RunningServer,
                                                     cursor: str) -> None:
    wid = await _workspace_id(server)
    await server.create_session(sessionScope="thread")
    response = await server.client.get(f"/workspace/{wid}/sessions",
                                       params={"cursor": cursor, "size": "1"})
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["code"] == "invalid_cursor" and body["error"].startswith("Invalid cursor: ")
    assert len(body["error"]) < 200   # the cursor is quoted, cut to 64 characters


async def test_a_cursor_past_the_request_line_cap_is_414_not_a_crash(
        server: RunningServer) -> None:
    wid = await _workspace_id(server)
    response = await server.client.get(f"/workspace/{wid}/sessions?cursor={'A' * 20_000}")
    assert response.status_code == 414 and response.json()["code"] == "uri_too_long"


async def test_a_forged_cursor_spelt_as_minted_is_a_position(server: RunningServer) -> None:
    """Any key in range, spelt exactly as the server spells it, pages from there: the
    newest first, so a cursor of time 0 lists nothing and one far ahead lists all."""
    wid = await _workspace_id(server)
    made = [(await server.create_session(sessionScope="thread"))["sessionId"] for _ in range(2)]
    ahead = _cursor('{"createdUs":%d,"sessionHash":"%s"}' % (2**53, HASH))
    behind = _cursor('{"createdUs":0,"sessionHash":"%s"}' % HASH)
    assert (await _walk_page(server, wid, ahead, size=5)) == (made[::-1], None)
    assert (await _walk_page(server, wid, behind, size=5)) == ([], None)


async def test_an_empty_cursor_is_the_first_page(server: RunningServer) -> None:
    wid = await _workspace_id(server)
    sid = (await server.create_session(sessionScope="thread"))["sessionId"]
    body = (await server.client.get(f"/workspace/{wid}/sessions?cursor=")).json()
    assert [s["sessionId"] for s in body["sessions"]] == [sid]


async def test_unlimited_cap_is_null(tmp_path: Path) -> None:
    async with running_server(tmp_path, options=BridgeOptions(
            max_pending_prompts_per_session=math.inf)) as srv:
        wid = await _workspace_id(srv)
        await srv.create_session(sessionScope="thread")
        [row] = (await srv.client.get(f"/workspace/{wid}/sessions")).json()["sessions"]
        assert row["maxPendingPrompts"] is None


@pytest.mark.parametrize(("query", "code"), [
    ("cursor=-1", "invalid_cursor"), ("cursor=abc", "invalid_cursor"),
    ("cursor=" + "9" * 40, "invalid_cursor"),
    # digits to str.isdigit, not to int: superscript two, Arabic-Indic one
    ("cursor=%C2%B2", "invalid_cursor"), ("cursor=%D9%A1", "invalid_cursor"),
])
async def test_bad_query_is_400(server: RunningServer, query: str, code: str) -> None:
    wid = await _workspace_id(server)
    response = await server.client.get(f"/workspace/{wid}/sessions?{query}")
    assert response.status_code == 400
    assert response.json()["code"] == code


@pytest.mark.parametrize(("size", "listed"), [
    ("0", 1), ("-5", 1), ("1", 1), ("+2", 2), (" 3 ", 3), ("101", 100), ("1000", 100),
    ("9" * 40, 100), ("-" + "9" * 40, 1), ("x", 20), ("", 20), ("1.5", 20), ("0x10", 20),
    # not ASCII digits: superscript two, Arabic-Indic one, fullwidth one
    ("%C2%B2", 20), ("%D9%A1", 20), ("%EF%BC%91", 20),
])
async def test_size_is_read_as_the_peer_reads_it(tmp_path: Path, size: str,
                                                 listed: int) -> None:
    """Clamped to 1..100, anything not a signed number the default (20): never an
    error, as ``qwen serve`` 0.24.4 (``@qwen-code/sdk`` asks for up to 1000)."""
    async with running_server(tmp_path, options=BridgeOptions(max_sessions=120)) as srv:
        wid = await _workspace_id(srv)
        for _ in range(110):
            await srv.bridge.create_session()
        response = await srv.client.get(f"/workspace/{wid}/sessions?size={size}")
        assert response.status_code == 200, response.text
        assert len(response.json()["sessions"]) == listed


async def test_unknown_workspace_is_400_as_the_peers(server: RunningServer) -> None:
    """An id that is not this daemon's workspace (nor an absolute path) is qwen serve
    0.24.4's 400 with its message (``resolveRuntimeFromWorkspaceParam``), and our
    ``code``; the ended sessions' route (not the peer's) keeps its 404."""
    response = await server.client.get("/workspace/0123456789abcdef/sessions")
    assert response.status_code == 400
    assert response.json() == {"error": "`:id` must decode to a workspace id or absolute path",
                               "code": "workspace_not_found", "workspace": "0123456789abcdef"}
    ended = await server.client.get("/workspace/0123456789abcdef/ended-sessions")
    assert ended.status_code == 404, ended.text
    assert ended.json()["code"] == "workspace_not_found"


async def test_the_peers_plural_path_is_the_same_listing(server: RunningServer) -> None:
    """``/workspaces/{ws}/sessions`` (qwen serve's per-workspace path, ``{ws}`` the id or
    the absolute path, URL-encoded, however spelled) answers byte for byte what the
    singular path does, paging included; another ``{ws}`` is 400 ``workspace_mismatch``
    with qwen serve 0.24.4's message for it (``resolveWorkspaceEntryFromParam``: an id
    or a relative path, another folder's path), echoing ``{ws}`` as sent."""
    wid = await _workspace_id(server)
    for _ in range(3):
        await server.create_session(sessionScope="thread")
    singular = await server.client.get(f"/workspace/{wid}/sessions", params={"size": "2"})
    absolute = quote(server.settings.workspace, safe="")
    for path in (f"/workspaces/{wid}/sessions", f"/workspaces/{wid}/sessions/",
                 f"/workspaces/{absolute}/sessions", f"/workspaces/{absolute}%2F/sessions",
                 f"/workspaces/%2F{absolute}%2F.%2F/sessions/"):
        plural = await server.client.get(path, params={"size": "2"})
        assert (plural.status_code, plural.content) == (200, singular.content), path
    cursor = singular.json()["nextCursor"]
    rest = await server.client.get(f"/workspaces/{wid}/sessions", params={"cursor": cursor})
    assert rest.content == (await server.client.get(f"/workspace/{wid}/sessions",
                                                    params={"cursor": cursor})).content
    elsewhere = quote(str(Path(server.settings.workspace).parent / "elsewhere"), safe="")
    for other in ("0123456789abcdef", "x" * 300, "%2E%2E"):   # qwen's: not an id nor a path
        mismatch = await server.client.get(f"/workspaces/{other}/sessions")
        assert mismatch.status_code == 400, (other, mismatch.text)
        assert mismatch.json() == {
            "error": "`:workspace` must decode to a workspace id or absolute path",
            "code": "workspace_mismatch", "workspace": other[:256]}
    for other in (elsewhere, f"{absolute}%2F.."):   # qwen's: another folder
        mismatch = await server.client.get(f"/workspaces/{other}/sessions")
        assert mismatch.status_code == 400, (other, mismatch.text)
        assert mismatch.json() == {
            "error": "Workspace mismatch: the requested workspace is not registered with "
                     "this daemon.", "code": "workspace_mismatch", "workspaceCount": 1,
            "workspace": other}
    # the singular path keeps its own answer for another id (qwen's for /workspace/:id)
    unknown = await server.client.get("/workspace/0123456789abcdef/sessions")
    assert (unknown.status_code, unknown.json()["code"]) == (400, "workspace_not_found")


async def test_the_singular_path_takes_the_workspaces_path_as_qwens(
        server: RunningServer) -> None:
    """qwen's ``/workspace/:id/sessions`` takes the workspace's absolute path too (its
    SDK's ``listWorkspaceSessions(cwd)`` sends it there, URL-encoded): it was 404 here.
    It is the same listing."""
    wid = await _workspace_id(server)
    await server.create_session(sessionScope="thread")
    by_id = await server.client.get(f"/workspace/{wid}/sessions")
    absolute = quote(server.settings.workspace, safe="")
    for path in (f"/workspace/{absolute}/sessions", f"/workspace/{absolute}%2F/sessions",
                 f"/workspace/%2F{absolute}%2F.%2F/sessions/"):
        answer = await server.client.get(path)
        assert (answer.status_code, answer.content) == (200, by_id.content), path


async def test_the_singular_path_answers_another_folder_as_qwens(
        server: RunningServer) -> None:
    """Another folder's absolute path on ``/workspace/:id/sessions`` is qwen serve
    0.24.4's 400 of ``sendWorkspaceMismatch`` (its ``resolveRuntimeFromWorkspaceParam``),
    naming the path normalized; not the plural route's answer."""
    bound = server.settings.workspace
    parent = str(Path(bound).parent)
    for sent, named in ((f"{parent}/elsewhere", f"{parent}/elsewhere"),
                        (f"{parent}/x/..//elsewhere/", f"{parent}/elsewhere"),
                        ("/", "/"), (f"{bound}/..", parent)):
        answer = await server.client.get(f"/workspace/{quote(sent, safe='')}/sessions")
        assert answer.status_code == 400, (sent, answer.text)
        assert answer.json() == {"error": f'Workspace mismatch: daemon is bound to "{bound}"',
                                 "code": "workspace_mismatch", "boundWorkspace": bound,
                                 "requestedWorkspace": named}, sent


@pytest.mark.parametrize(("sent", "echoed"), [
    ("rel%2Fx", "rel/x"), ("a%2Fb%2Fc", "a/b/c"), ("rel%2F%2Fx", "rel//x"),
    ("rel%2F..%2Fx", "rel/../x"), ("%2E%2E", ".."),
])
async def test_the_singular_path_answers_a_relative_path_as_qwens(
        server: RunningServer, sent: str, echoed: str) -> None:
    """A relative path as ``:id`` (``rel%2Fx``: the server decodes it into segments no
    route has) is qwen's 400 "`:id` must decode to a workspace id or absolute path" (with
    our ``code``), as an unknown id is; it was a plain 404."""
    answer = await server.client.get(f"/workspace/{sent}/sessions")
    assert answer.status_code == 400, answer.text
    assert answer.json() == {"error": "`:id` must decode to a workspace id or absolute path",
                             "code": "workspace_not_found", "workspace": echoed}
    other = await server.client.get(f"/workspace/{sent}/ended-sessions")   # not qwen's
    assert other.status_code == 404, other.text


async def test_a_session_is_listed_under_its_first_prompt_as_qwens(tmp_path: Path) -> None:
    """qwen's listing names a session without a title by its first prompt
    (``displayName``: its first text, 200 code points then ``...``) and says
    ``isArchived: false`` of a live one (both were missing); the name is journaled, so a
    restart keeps it, and a branch has its parent's (its conversation starts there)."""
    async with running_server(tmp_path) as srv:
        wid = await _workspace_id(srv)
        named, long, blank = [(await srv.create_session(sessionScope="thread"))["sessionId"]
                              for _ in range(3)]
        for sid, words in ((named, "hello there"), (named, "second"), (long, "é" * 250)):
            assert (await srv.prompt(sid, words)).status_code == 202
        for sid in (named, long):
            await _pending(srv, sid, 0)
        branched = await srv.client.post(f"/session/{named}/branch", json={})
        assert branched.status_code == 201, branched.text
        rows = {s["sessionId"]: s for s in
                (await srv.client.get(f"/workspace/{wid}/sessions")).json()["sessions"]}
        assert rows[named]["displayName"] == "hello there"
        assert rows[long]["displayName"] == "é" * 200 + "..."
        assert "displayName" not in rows[blank]
        assert rows[branched.json()["sessionId"]]["displayName"] == "hello there"
        assert {s["isArchived"] for s in rows.values()} == {False}
    async with running_server(tmp_path) as srv:   # the same state: restored
        rows = {s["sessionId"]: s for s in
                (await srv.client.get(f"/workspace/{wid}/sessions")).json()["sessions"]}
        assert (rows[named]["displayName"], rows[long]["displayName"]) == \
            ("hello there", "é" * 200 + "...")
        assert "displayName" not in rows[blank]
