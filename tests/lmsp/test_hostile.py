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
