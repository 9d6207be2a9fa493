"""A hostile pass over ``/lmsp/v1``: values no store or parser holds are a 4xx problem
object on every route and store, never a 500 (real HTTP on loopback)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.lmsp.server import LmspServer

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
            ("DELETE", "/lmsp/v1/responses/{}", "response_not_found")]:
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
