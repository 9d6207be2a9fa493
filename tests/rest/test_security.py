"""Bearer token, /health exemption, --require-auth, Origin policy and CORS, over real HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rest.server import running_server

pytestmark = pytest.mark.anyio

UNAUTHORIZED = {"error": "Unauthorized"}
CORS_DENIED = {"error": "Request denied by CORS policy"}


async def test_token_required(tmp_path: Path) -> None:
    async with running_server(tmp_path, token="s3cret") as srv:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"},
                        {"Authorization": "Bearer"}, {"Authorization": "s3cret"},
                        {"Authorization": "Bearer s3cret-and-more"}):
            for method, path in (("GET", "/capabilities"), ("POST", "/session"),
                                 ("GET", "/daemon/status"), ("GET", "/session/x/events")):
                response = await srv.client.request(method, path, headers=headers)
                assert response.status_code == 401, (headers, path)
                assert response.json() == UNAUTHORIZED
        good = {"Authorization": "Bearer s3cret"}
        assert (await srv.client.get("/capabilities", headers=good)).status_code == 200
        assert (await srv.client.post("/session", json={}, headers=good)).status_code == 200
        # /health stays open on a loopback bind.
        assert (await srv.client.get("/health")).status_code == 200


async def test_require_auth_covers_health(tmp_path: Path) -> None:
    async with running_server(tmp_path, token="s3cret", require_auth=True) as srv:
        response = await srv.client.get("/health")
        assert response.status_code == 401
        assert response.json() == UNAUTHORIZED
        response = await srv.client.get("/health", headers={"Authorization": "Bearer s3cret"})
        assert response.status_code == 200
        features = (await srv.client.get("/capabilities",
                                         headers={"Authorization": "Bearer s3cret"})).json()
        assert "require_auth" in features["features"]


async def test_foreign_origin_denied(tmp_path: Path) -> None:
    async with running_server(tmp_path) as srv:
        for path in ("/health", "/capabilities", "/session"):
            response = await srv.client.get(path, headers={"Origin": "http://evil.example"})
            assert response.status_code == 403
            assert response.json() == CORS_DENIED
            assert "access-control-allow-origin" not in response.headers
        port = srv.base_url.rsplit(":", 1)[1]
        response = await srv.client.get("/health", headers={"Origin": "http://127.0.0.1:1"})
        assert response.status_code == 403
        for self_origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
            response = await srv.client.get("/health", headers={"Origin": self_origin})
            assert response.status_code == 200, self_origin
            assert "access-control-allow-origin" not in response.headers


async def test_foreign_origin_denied_before_auth(tmp_path: Path) -> None:
    async with running_server(tmp_path, token="s3cret") as srv:
        response = await srv.client.get("/capabilities", headers={"Origin": "http://evil.example"})
        assert response.status_code == 403


async def test_allowed_origin_and_preflight(tmp_path: Path) -> None:
    origin = "http://app.example:3000"
    async with running_server(tmp_path, token="s3cret", allow_origins=(origin,)) as srv:
        auth = {"Authorization": "Bearer s3cret"}
        response = await srv.client.get("/capabilities", headers={"Origin": origin, **auth})
        assert response.status_code == 200
        assert response.headers["access-control-allow-origin"] == origin
        assert response.headers["access-control-expose-headers"] == (
            "Retry-After, X-Qwen-Event-Epoch, X-Qwen-SSE-Stream-Id, Acp-Connection-Id, "
            "Idempotent-Replayed, Location, x-should-retry, X-RateLimit-Limit, "
            "X-RateLimit-Remaining, X-RateLimit-Reset")
        assert "allow_origin" in response.json()["features"]

        preflight = await srv.client.options("/session", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == origin
        assert preflight.headers["access-control-allow-methods"] == "GET, POST, PATCH, DELETE, OPTIONS"
        assert preflight.headers["access-control-allow-headers"] == (
            "Authorization, Content-Type, X-Qwen-Client-Id, Last-Event-ID, X-Qwen-Event-Epoch, "
            "Acp-Connection-Id, Acp-Session-Id, Idempotency-Key")

        # A 401 to an allowed origin still carries CORS headers (so the page can read it).
        response = await srv.client.get("/capabilities", headers={"Origin": origin})
        assert response.status_code == 401
        assert response.headers["access-control-allow-origin"] == origin

        response = await srv.client.get("/capabilities",
                                        headers={"Origin": "http://other.example", **auth})
        assert response.status_code == 403
