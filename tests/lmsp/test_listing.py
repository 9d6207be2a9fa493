"""``GET /lmsp/v1/tasks`` over real HTTP, on every selected store: newest first,
paging, the status filter, model and usage per item, the caller's tasks only,
retention, and problem objects for bad parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_server.lmsp import LmspConfig
from tests.principals.helpers import bearer, mint
from tests.lmsp.server import LmspServer, running_lmsp

pytestmark = pytest.mark.anyio


async def _list(server: LmspServer, **params: str) -> dict[str, Any]:
    response = await server.client.get("/lmsp/v1/tasks", params=params)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return response.json()  # type: ignore[no-any-return]


async def test_lists_newest_first_with_model_and_usage(server: LmspServer) -> None:
    assert await _list(server) == {"object": "list", "data": [], "first_id": None,
                                   "last_id": None, "has_more": False}
    first = await server.create("one two three")
    second = await server.create("/sleep 30s hold")
    done = await server.wait(first["id"])
    await server.wait(second["id"], {"running"})
    body = await _list(server)
    assert [t["id"] for t in body["data"]] == [second["id"], first["id"]]
    assert (body["first_id"], body["last_id"], body["has_more"]) == (second["id"], first["id"], False)
    running, finished = body["data"]
    assert running["status"] == "running" and running["usage"] is None
    assert running["model"] == finished["model"] == "reference"
    assert (running["input_text"], finished["input_text"]) == ("/sleep 30s hold", "one two three")
    assert finished["status"] == "succeeded"
    assert finished["usage"] == done["response"]["usage"] and finished["usage"]["total_tokens"] > 0
    # Each item is the task object of GET /tasks/{id}, plus model, input_text and usage.
    assert {k: v for k, v in finished.items()
            if k not in ("model", "usage", "input_text")} == done
    await server.client.post(f"/lmsp/v1/tasks/{second['id']}/cancel")


async def test_input_text_joins_messages_and_is_cut(server: LmspServer) -> None:
    messages = [{"role": "user", "content": "first line"},
                {"role": "user", "content": [{"type": "input_text", "text": "x" * 600}]}]
    task = await server.create(messages)  # type: ignore[arg-type]
    await server.wait(task["id"])
    [item] = (await _list(server))["data"]
    assert item["input_text"].startswith("first line\nxxx") and len(item["input_text"]) == 500
    assert item["input_text"].endswith("…")
    # The task's ACP session (kept for a continuation) is labelled as the runner's.
    bridge = server.service.models["reference"][0]
    kept = [bridge.session_status(s.session_id) for s in bridge.sessions()]
    assert kept and {status.origin for status in kept} == {"lmsp"}


async def test_pages_with_limit_and_after(server: LmspServer) -> None:
    made = [(await server.create(f"task {i}"))["id"] for i in range(5)]
    seen: list[str] = []
    params: dict[str, str] = {"limit": "2"}
    while True:
        body = await _list(server, **params)
        seen += [t["id"] for t in body["data"]]
        if not body["has_more"]:
            break
        params = {"limit": "2", "after": body["last_id"]}
    assert seen == made[::-1]


async def test_paging_goes_on_when_its_anchor_is_gone(server: LmspServer) -> None:
    """The last task of a page deleted (or purged) before the next page is asked
    for: the next page starts from the anchor's place, not a 400 (ids are ULIDs)."""
    made = [(await server.create(f"task {i}"))["id"] for i in range(5)]
    for task_id in made:
        await server.wait(task_id)
    first = await _list(server, limit="2")
    assert [t["id"] for t in first["data"]] == made[:2:-1]
    assert await server.service.store.delete_task(first["last_id"])
    rest = await _list(server, limit="10", after=first["last_id"])
    assert [t["id"] for t in rest["data"]] == made[2::-1] and not rest["has_more"]
    # An id older than every task, or newer than every task, is a place too.
    assert (await _list(server, after="task_00000000000000000000000000"))["data"] == []
    newest = await _list(server, after="task_7ZZZZZZZZZZZZZZZZZZZZZZZZZ")
    assert [t["id"] for t in newest["data"]] == [made[4], *made[2::-1]]


async def test_status_filter(server: LmspServer) -> None:
    done = await server.create("quick")
    await server.wait(done["id"])
    slow = await server.create("/sleep 30s slow")
    await server.wait(slow["id"], {"running"})
    assert [t["id"] for t in (await _list(server, status="running"))["data"]] == [slow["id"]]
    assert [t["id"] for t in (await _list(server, status="succeeded"))["data"]] == [done["id"]]
    assert (await _list(server, status="failed"))["data"] == []
    await server.client.post(f"/lmsp/v1/tasks/{slow['id']}/cancel")


async def test_only_the_callers_tasks(tmp_path: Path, store_name: str) -> None:
    """Two principals (stored tokens) on one store, across a restart: each lists its
    own; the bootstrap admin lists both."""
    async with running_lmsp(tmp_path, token="boot") as srv:
        alpha, beta = await mint(srv.server, "alpha"), await mint(srv.server, "beta")
        srv.client.headers.update(bearer(alpha))
        mine = await srv.create("alpha's")
        await srv.wait(mine["id"])
    async with running_lmsp(tmp_path, token="boot") as srv:
        srv.client.headers.update(bearer(beta))
        assert (await _list(srv))["data"] == []
        # another's task as the anchor: a place in time like any gone task, no leak
        assert (await _list(srv, after=mine["id"]))["data"] == []
        theirs = await srv.create("beta's")
        srv.client.headers.update(bearer(alpha))
        assert [t["id"] for t in (await _list(srv))["data"]] == [mine["id"]]
        srv.client.headers.update(bearer("boot"))
        assert [t["id"] for t in (await _list(srv))["data"]] == [theirs["id"], mine["id"]]


async def test_tasks_past_retention_are_left_out(tmp_path: Path, store_name: str) -> None:
    async with running_lmsp(tmp_path, config=LmspConfig(task_retention_s=0)) as srv:
        task = await srv.create("short-lived")
        with anyio.fail_after(10):   # GET answers 404 once it has ended
            while (await srv.client.get(f"/lmsp/v1/tasks/{task['id']}")).status_code != 404:
                await anyio.sleep(0.01)
        assert (await _list(srv))["data"] == []


@pytest.mark.parametrize(("query", "param"), [
    ("limit=0", "limit"), ("limit=101", "limit"), ("limit=ten", "limit"), ("limit=-1", "limit"),
    ("status=done", "status"), ("after=nope", "after"),
    ("after=task_0000000000000000000000000", "after"),   # 25 characters
    ("after=task_0000000000000000000000000u", "after"),   # not Crockford base32
    # digits to str.isdigit, not to int: superscript two, Arabic-Indic one, fullwidth one
    ("limit=%C2%B2", "limit"), ("limit=%D9%A1", "limit"), ("limit=%EF%BC%91", "limit"),
])
async def test_bad_parameters_are_problems(server: LmspServer, query: str, param: str) -> None:
    response = await server.client.get(f"/lmsp/v1/tasks?{query}")
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["code"] == "invalid_request" and body["param"] == param
    assert body["type"] == "https://lmsp.invalid/problems/invalid_request"
    assert body["instance"] == "/lmsp/v1/tasks"


async def test_needs_the_token(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path, token="secret") as srv:
        assert (await _list(srv))["data"] == []
        response = await srv.client.get("/lmsp/v1/tasks", headers={"Authorization": "Bearer no"})
        assert response.status_code == 401
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["code"] == "unauthorized"


async def test_an_after_with_a_trailing_newline_is_refused(server: LmspServer) -> None:
    made = (await server.create("one"))["id"]
    response = await server.client.get("/lmsp/v1/tasks", params={"after": made + "\n"})
    assert response.status_code == 400 and response.json()["param"] == "after"
