"""Each door answers its own errors (``acp_server.http.handlers.by_prefix`` as
``acp_server.app`` composes it), over real HTTP on loopback."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.harness import local_server

pytestmark = pytest.mark.anyio


async def boom(request: Request) -> Response:
    raise RuntimeError("a secret the client must not see")


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with local_server(tmp_path, app_errors_expected=True) as srv:
        # A route of each door that fails unexpectedly (the 500 of its own shape; the
        # door logs it and re-raises it to the server, as starlette's error layer does).
        srv.server.app.router.routes.extend([Route("/lmsp/v1/boom", boom),
                                             Route("/acp/boom", boom),
                                             Route("/session/x/boom", boom)])
        yield srv.client


async def test_an_unexpected_error_is_a_500_in_each_doors_shape(
        client: httpx.AsyncClient) -> None:
    lmsp = await client.get("/lmsp/v1/boom")
    assert lmsp.status_code == 500
    assert lmsp.headers["content-type"].startswith("application/problem+json")
    assert lmsp.json()["code"] == "server_error"
    for path in ("/acp/boom", "/session/x/boom"):
        response = await client.get(path)
        assert response.status_code == 500
        assert response.json() == {"error": "Internal error"}
        assert "secret" not in response.text


async def test_an_unexpected_error_is_logged_by_each_door(
        client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    """granian runs with its log off: the exception a door's 500 answers is logged by
    the door itself, with its traceback (REST and ``/acp`` logged nothing of it)."""
    with caplog.at_level(logging.ERROR, logger="acp_server"):
        for path in ("/lmsp/v1/boom", "/acp/boom", "/session/x/boom"):
            assert (await client.get(path)).status_code == 500
    logged = [(r.getMessage(), r.exc_info[0] if r.exc_info else None) for r in caplog.records
              if r.name.startswith("acp_server")]
    for path in ("/lmsp/v1/boom", "/acp/boom", "/session/x/boom"):
        assert any(path in message and kind is RuntimeError for message, kind in logged), \
            (path, logged)


@pytest.mark.parametrize(("method", "path", "status", "body"), [
    ("PUT", "/acp", 405, {"error": "Method Not Allowed"}),        # the /acp door
    ("GET", "/no/such/route", 404, {"error": "Not Found"}),        # REST, the default
    ("PUT", "/capabilities", 405, {"error": "Method Not Allowed"}),
])
async def test_router_errors_outside_lmsp_are_plain_json(
        client: httpx.AsyncClient, method: str, path: str, status: int,
        body: dict[str, str]) -> None:
    response = await client.request(method, path)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert response.json() == body


async def test_router_errors_under_lmsp_are_problems(client: httpx.AsyncClient) -> None:
    response = await client.get("/lmsp/v1/nope")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "not_found"
