"""A hostile pass over ``/lmsp/v1``: values no store or parser holds are a 4xx problem
object on every route and store, never a 500 (real HTTP on loopback)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from acp_server.lmsp import LmspConfig
from acp_server.lmsp.conversation import CUT_NOTE
from acp_server.lmsp.responses import count_tokens
from acp_server.store.sqlite import SqliteTaskStore
from tests.lmsp.server import LmspServer, running_lmsp

pytestmark = pytest.mark.anyio
PROBLEM = "application/problem+json"


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict[str, Any] = response.json()
    assert body["code"] == code and body["status"] == status, body
    return body


async def test_a_limit_of_thousands_of_digits_is_400(server: LmspServer) -> None:
    # int() refuses strings of more than 4300 digits (a ValueError, was a 500)
    for digits in ("1" * 5000, "9" * 4301, "0" * 5000 + "101"):
        response = await server.client.get("/lmsp/v1/tasks", params={"limit": digits})
        assert assert_problem(response, 400, "invalid_request")["param"] == "limit"
    await server.create("one")
    await server.create("two")
    for zeros in ("01", "0" * 5000 + "1"):   # leading zeros, as int() reads them
        page = await server.client.get("/lmsp/v1/tasks", params={"limit": zeros})
        assert page.status_code == 200 and len(page.json()["data"]) == 1


NUL_IDS = ["%00", "x%00y", "task_01HZZZZZZZZZZZZZZZZZZZZZZZ%00"]


@pytest.mark.parametrize("raw_id", NUL_IDS)
async def test_an_id_with_a_nul_is_not_found_everywhere(server: LmspServer, raw_id: str
                                                        ) -> None:
    # PostgreSQL text cannot hold a NUL: the lookup raised (a 500) instead of finding nothing
    for method, path, code in [
            ("GET", "/lmsp/v1/tasks/{}", "task_not_found"),
            ("POST", "/lmsp/v1/tasks/{}/cancel", "task_not_found"),
            ("GET", "/lmsp/v1/tasks/{}/events", "task_not_found"),
            ("GET", "/lmsp/v1/responses/{}", "response_not_found"),
            ("GET", "/lmsp/v1/responses/{}?stream=true", "response_not_found"),
            ("POST", "/lmsp/v1/responses/{}/cancel", "response_not_found"),
            ("DELETE", "/lmsp/v1/responses/{}", "response_not_found"),
            ("GET", "/lmsp/v1/responses/{}/input_items", "response_not_found")]:
        response = await server.client.request(method, path.format(raw_id))
        assert_problem(response, 404, code)


async def test_a_previous_response_id_with_a_nul_is_not_found(server: LmspServer) -> None:
    done = (await server.client.post("/lmsp/v1/responses", json={
        "model": "reference", "input": "hi"})).json()
    for previous in ("\u0000", done["id"] + "\u0000", "\u0000" + done["id"]):
        for path, body in [
                ("/lmsp/v1/responses", {"model": "reference", "input": "x",
                                        "previous_response_id": previous}),
                ("/lmsp/v1/tasks", {"type": "response", "input": {
                    "model": "reference", "input": "x", "previous_response_id": previous}})]:
            response = await server.client.post(path, json=body)
            assert assert_problem(response, 404, "response_not_found")["param"] == \
                "previous_response_id"
    assert (await server.client.get("/health")).json()["status"] == "ok"


async def _respond(srv: LmspServer, text: str, previous: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "reference", "input": text}
    if previous is not None:
        body["previous_response_id"] = previous
    response = await srv.client.post("/lmsp/v1/responses", json=body)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def _text(response: dict[str, Any]) -> str:
    return "".join(part["text"] for item in response["output"] for part in item["content"])


async def test_a_fresh_sessions_history_is_bounded_newest_kept(tmp_path: Path,
                                                               store_name: str) -> None:
    # A chain of 1 MiB turns was one prompt of the whole chain (up to MAX_DEPTH turns: GBs,
    # built in memory for every continuation that does not get the live session).
    budget = 200
    config = LmspConfig(live_sessions=0, history_chars=budget)   # every turn: the history
    async with running_lmsp(tmp_path, config=config) as srv:
        short = await _respond(srv, "hi")
        whole = _text(await _respond(srv, "/history ?", short["id"]))
        assert whole.splitlines() == ["History:", "user: hi", "assistant: Echo: hi", "Echo: ?"]
        previous = short["id"]
        for turn in range(4):
            previous = (await _respond(srv, f"turn {turn} " + "x" * 30, previous))["id"]
        answer = await _respond(srv, "/history ?", previous)
    lines = _text(answer).splitlines()
    assert lines[0] == "History:" and lines[-1] == "Echo: ?"
    history = lines[1:-1]
    assert history[0] == f"system: {CUT_NOTE}"
    assert len("\n".join(history)) == budget   # the room left is filled by the tail
    newest = ["user: turn 3 " + "x" * 30, "assistant: Echo: turn 3 " + "x" * 30]
    assert history[-2:] == newest
    cut = history[1]   # the end of the message before them
    assert cut.startswith("assistant: ") and cut != "assistant: " and \
        ("assistant: Echo: turn 2 " + "x" * 30).endswith(cut[len("assistant: "):])
    assert len(history) == 4
    # the input counted is what the agent got: the history as cut, and the new text
    assert answer["usage"]["input_tokens"] == \
        count_tokens("\n".join(history)) + count_tokens("/history ?")


class FaultyStore(SqliteTaskStore):
    """``get_task`` of ``BOOM`` raises what no door expects (a bug's stand-in)."""

    async def get_task(self, task_id: str) -> Any:
        if task_id == BOOM:
            raise RuntimeError("a bug in the store")
        return await super().get_task(task_id)


BOOM = "task_boom"


async def test_an_unexpected_error_is_a_500_problem_with_its_traceback_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The daemon's HTTP servers log nothing of an exception the app re-raises (granian
    # runs with its log off): the door's own handler logs it, or it leaves no trace.
    store = FaultyStore(str(tmp_path / "lmsp.sqlite3"))
    with caplog.at_level(logging.ERROR, logger="acp_server.lmsp"):
        async with running_lmsp(tmp_path, store=store, app_errors_expected=True) as srv:
            response = await srv.client.get(f"/lmsp/v1/tasks/{BOOM}")
            body = assert_problem_500(response)
            assert body["detail"] == "Internal error." and "bug" not in response.text
            assert (await srv.client.get("/health")).json()["status"] == "ok"
    logged = [r for r in caplog.records if r.name == "acp_server.lmsp" and r.exc_info]
    assert len(logged) == 1
    assert "GET /lmsp/v1/tasks/task_boom" in logged[0].getMessage()
    assert isinstance(logged[0].exc_info[1], RuntimeError)   # type: ignore[index]


def assert_problem_500(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 500, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict[str, Any] = response.json()
    assert body["code"] == "server_error" and body["type"].endswith("/server_error"), body
    return body


class DeletedFirst(SqliteTaskStore):
    """A DELETE of the response lands between a cancel's read and its update."""

    async def request_cancel(self, task_id: str, finish: Any, *, now: float) -> Any:
        await self.delete_task(task_id)
        return await super().request_cancel(task_id, finish, now=now)


async def test_a_cancel_that_loses_to_a_delete_is_response_not_found(tmp_path: Path) -> None:
    # It was 404 task_not_found (with a task_id) on the /responses route.
    store = DeletedFirst(str(tmp_path / "lmsp.sqlite3"))
    async with running_lmsp(tmp_path, store=store) as srv:
        done = await _respond(srv, "finished")
        response = await srv.client.post(f"/lmsp/v1/responses/{done['id']}/cancel")
        body = assert_problem(response, 404, "response_not_found")
        assert body["response_id"] == done["id"] and "task_id" not in body


class DeletedAfterLookup(SqliteTaskStore):
    """A DELETE lands right after a response's lookup (``gone`` names the response)."""

    gone = ""

    async def get_by_response(self, response_id: str) -> Any:
        record = await super().get_by_response(response_id)
        if record is not None and response_id == self.gone:
            await self.delete_task(record.id)
        return record


async def test_a_stream_of_a_response_deleted_meanwhile_is_response_not_found(
        tmp_path: Path) -> None:
    store = DeletedAfterLookup(str(tmp_path / "lmsp.sqlite3"))
    async with running_lmsp(tmp_path, store=store) as srv:
        done = await _respond(srv, "finished")
        store.gone = done["id"]
        response = await srv.client.get(f"/lmsp/v1/responses/{done['id']}?stream=true")
        body = assert_problem(response, 404, "response_not_found")
        assert body["response_id"] == done["id"] and "task_id" not in body


async def test_a_foreground_response_past_retention_when_it_ends_is_answered(
        tmp_path: Path) -> None:
    # Its waiter re-read the finished task through the retention check: 404 inside a
    # task group, so an exception group, a 500.
    async with running_lmsp(tmp_path, config=LmspConfig(task_retention_s=0)) as srv:
        for text in ("hi", "/chunks 3 a b c"):
            answer = await _respond(srv, text)
            assert answer["status"] == "completed" and _text(answer).startswith("Echo")
            gone = await srv.client.get(f"/lmsp/v1/responses/{answer['id']}")
            assert_problem(gone, 404, "response_not_found")   # retention applies after


class DeletedWhenDone(SqliteTaskStore):
    """Another client's DELETE lands as soon as a task has ended, before anyone reads it:
    a finished task reads as gone."""

    async def get_task(self, task_id: str) -> Any:
        record = await super().get_task(task_id)
        return None if record is not None and record.finished_at is not None else record


async def test_a_foreground_response_deleted_as_it_ends_is_404(tmp_path: Path) -> None:
    store = DeletedWhenDone(str(tmp_path / "lmsp.sqlite3"))
    async with running_lmsp(tmp_path, store=store) as srv:
        response = await srv.client.post("/lmsp/v1/responses", json={
            "model": "reference", "input": "hi"})
        assert_problem(response, 404, "response_not_found")
        assert (await srv.client.get("/health")).json()["status"] == "ok"


@pytest.mark.parametrize("number", ["1e999", "-1e999", "1" + "0" * 4400])
async def test_a_number_out_of_range_is_refused_as_such(server: LmspServer, number: str
                                                        ) -> None:
    # valid JSON, so not "not valid JSON" (the /acp door's 1e999 was a 500)
    for path, body in [
            ("/lmsp/v1/responses", '{"model":"reference","input":"x","max_output_tokens":%s}'),
            ("/lmsp/v1/tasks", '{"type":"response","input":{"model":"reference",'
                               '"input":"x","metadata":{"k":%s}}}')]:
        response = await server.client.post(path, content=(body % number).encode(),
                                             headers={"Content-Type": "application/json"})
        problem = assert_problem(response, 400, "invalid_request")
        assert problem["param"] == "body" and "out of range" in problem["detail"]
        assert "not valid JSON" not in problem["detail"]
    big = "1" + "0" * 400   # an int Python holds: read, then refused or taken by its field
    response = await server.client.post("/lmsp/v1/responses", content=(
        '{"model":"reference","input":"x","max_output_tokens":%s}' % big).encode(),
        headers={"Content-Type": "application/json"})
    assert response.status_code == 200 and response.json()["status"] == "completed"
