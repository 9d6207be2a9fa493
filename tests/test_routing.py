"""The indexed router answers exactly as Starlette's would (first full match, 405, 404)."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from acp_server.routing import IndexedRouter

pytestmark = pytest.mark.anyio


def endpoint(name: str):
    async def handler(request):
        return PlainTextResponse(f"{name} {dict(request.path_params)}")
    return handler


ROUTES = [
    Route("/health", endpoint("health"), methods=["GET"]),
    Route("/session", endpoint("create"), methods=["POST"]),
    Route("/session/{sid}", endpoint("delete"), methods=["DELETE"]),
    Route("/session/{sid}/prompt", endpoint("prompt"), methods=["POST"]),
    Route("/session/{sid}/pending-prompts/{pid}", endpoint("remove"), methods=["DELETE"]),
    Route("/session/{sid}/{verb}", endpoint("verb"), methods=["POST"]),
    Mount("/static", routes=[Route("/{name:path}", endpoint("static"))]),
]


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/health"), ("POST", "/session"), ("DELETE", "/session/a"), ("POST", "/session/a/prompt"),
    ("GET", "/session/a/prompt"), ("POST", "/session/a/cancel"), ("DELETE", "/session/a/pending-prompts/p"),
    ("GET", "/static/x/y.css"), ("GET", "/nope"), ("GET", "/session/a/b/c/d/e"), ("GET", "/"),
])
async def test_same_answers_as_starlette(method, path):
    plain = Starlette(routes=ROUTES)
    indexed = Starlette()
    indexed.router = IndexedRouter(routes=ROUTES)
    answers = []
    for app in (plain, indexed):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            response = await client.request(method, path)
            answers.append((response.status_code, response.text))
    assert answers[0] == answers[1]


async def test_routes_added_later_are_found():
    app = Starlette()
    app.router = IndexedRouter(routes=ROUTES[:1])
    app.router.routes.append(Route("/late/{x}", endpoint("late")))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        assert (await client.get("/late/1")).text == "late {'x': '1'}"


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "//health"), ("GET", "/health/"), ("POST", "/session//prompt"),
    ("POST", "//session/a/prompt"), ("POST", "/session/a/prompt/"), ("DELETE", "/session/a//"),
])
async def test_a_path_is_matched_as_it_is_as_starlette_does(method, path):
    """Empty segments and a trailing slash match no route (the front layer makes a
    trailing slash canonical before the router; ``acp_server.http.front``)."""
    plain = Starlette(routes=ROUTES)
    plain.router.redirect_slashes = False
    indexed = Starlette()
    indexed.router = IndexedRouter(routes=ROUTES)
    answers = []
    for app in (plain, indexed):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            response = await client.request(method, client.base_url.copy_with(raw_path=path.encode()))
            answers.append((response.status_code, response.text))
    assert answers[0] == answers[1] and answers[0][0] == 404
