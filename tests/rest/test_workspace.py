"""``GET /workspace/{id}/sessions`` over real HTTP: the live sessions with their queue
against the cap, paging, the workspace id of ``/capabilities``, and its errors."""

from __future__ import annotations

import math
from pathlib import Path

import anyio
import pytest

from bridge import BridgeOptions
from tests.rest.server import RunningServer, running_server

pytestmark = pytest.mark.anyio


async def _workspace_id(server: RunningServer) -> str:
    caps = (await server.client.get("/capabilities")).json()
    [workspace] = caps["workspaces"]
    assert workspace["cwd"] == server.settings.workspace and workspace["primary"] is True
    return str(workspace["id"])


async def _pending(server: RunningServer, sid: str, count: int) -> None:
    with anyio.fail_after(5):
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


async def test_unlimited_cap_is_null(tmp_path: Path) -> None:
    async with running_server(tmp_path, options=BridgeOptions(
            max_pending_prompts_per_session=math.inf)) as srv:
        wid = await _workspace_id(srv)
        await srv.create_session(sessionScope="thread")
        [row] = (await srv.client.get(f"/workspace/{wid}/sessions")).json()["sessions"]
        assert row["maxPendingPrompts"] is None


@pytest.mark.parametrize(("query", "code"), [
    ("size=0", "invalid_session_page_size"), ("size=101", "invalid_session_page_size"),
    ("size=x", "invalid_session_page_size"), ("cursor=-1", "invalid_cursor"),
    ("cursor=abc", "invalid_cursor"), ("cursor=" + "9" * 40, "invalid_cursor"),
    # digits to str.isdigit, not to int: superscript two, Arabic-Indic one, fullwidth one
    ("size=%C2%B2", "invalid_session_page_size"), ("size=%D9%A1", "invalid_session_page_size"),
    ("size=%EF%BC%91", "invalid_session_page_size"), ("cursor=%C2%B2", "invalid_cursor"),
    ("cursor=%D9%A1", "invalid_cursor"),
])
async def test_bad_query_is_400(server: RunningServer, query: str, code: str) -> None:
    wid = await _workspace_id(server)
    response = await server.client.get(f"/workspace/{wid}/sessions?{query}")
    assert response.status_code == 400
    assert response.json()["code"] == code


async def test_unknown_workspace_is_404(server: RunningServer) -> None:
    response = await server.client.get("/workspace/0123456789abcdef/sessions")
    assert response.status_code == 404
    assert response.json() == {"error": "Workspace is not registered with this daemon.",
                               "code": "workspace_not_found", "workspace": "0123456789abcdef"}
