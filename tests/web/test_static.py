"""The console's files over real HTTP: what ``/`` and ``/web/*`` serve, their headers,
that they are public while the API still needs the token, the Origin rules, and
``--no-web`` (404)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import acp_server.web
from acp_server.web import CSP, FILES, VENDORED
from tests.rest.server import running_server

pytestmark = pytest.mark.anyio


async def test_index_and_modules_are_served_with_a_csp(tmp_path: Path) -> None:
    async with running_server(tmp_path) as srv:
        index = await srv.client.get("/")
        assert index.status_code == 200
        assert index.headers["content-type"] == "text/html; charset=utf-8"
        assert index.headers["content-security-policy"] == CSP
        assert index.headers["x-content-type-options"] == "nosniff"
        assert index.headers["referrer-policy"] == "no-referrer"
        assert b'<script type="module" src="/web/app.js"></script>' in index.content
        for name in ("app.js", "api.js", "sse.js", "sessions.js", "session.js", "tasks.js",
                     "task.js", "daemon.js", "transcript.js", "dom.js"):
            response = await srv.client.get(f"/web/{name}")
            assert response.status_code == 200, name
            assert response.headers["content-type"] == "text/javascript; charset=utf-8"
            assert response.content == FILES[name][0]
        css = await srv.client.get("/web/style.css")
        assert css.headers["content-type"] == "text/css; charset=utf-8"
        assert (await srv.client.head("/")).status_code == 200


async def test_nothing_is_fetched_from_the_network() -> None:
    for name, (body, _) in FILES.items():
        if name in VENDORED:       # URLs in their comments and XML namespaces; pinned below
            continue
        text = body.decode()
        assert "http://" not in text and "https://" not in text, name
        assert "new EventSource" not in text, name   # streams go through fetch()


async def test_vendored_libraries_are_the_published_bytes_with_their_licences() -> None:
    folder = Path(acp_server.web.__file__).parent / "static"
    for name, (package, version, _licence, licence_files, digest) in VENDORED.items():
        assert hashlib.sha256(FILES[name][0]).hexdigest() == digest, (package, version)
        assert version in FILES[name][0].decode()[:400]     # the banner names the version
        for licence in licence_files:
            assert (folder / licence).stat().st_size > 500 and licence not in FILES
    assert "unsafe" not in CSP and "script-src 'self'" in CSP


@pytest.mark.parametrize("path", ["/web/nope.js", "/web/..%2fapp.py", "/web/index.html.bak",
                                  "/web/static", "/favicon.ico"])
async def test_unknown_files_are_404(tmp_path: Path, path: str) -> None:
    async with running_server(tmp_path) as srv:
        response = await srv.client.get(path)
        assert response.status_code == 404
        assert response.json() == {"error": "Not Found"}


async def test_files_are_public_but_the_api_needs_the_token(tmp_path: Path) -> None:
    async with running_server(tmp_path, token="s3cret") as srv:
        assert (await srv.client.get("/")).status_code == 200
        assert (await srv.client.get("/web/app.js")).status_code == 200
        assert (await srv.client.post("/", content=b"")).status_code == 401
        assert (await srv.client.get("/capabilities")).status_code == 401
        ok = await srv.client.get("/capabilities", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200


async def test_same_origin_rules_as_the_api(tmp_path: Path) -> None:
    async with running_server(tmp_path) as srv:
        foreign = await srv.client.get("/", headers={"Origin": "http://evil.example"})
        assert foreign.status_code == 403
        assert foreign.json() == {"error": "Request denied by CORS policy"}
        own = await srv.client.get("/", headers={"Origin": srv.base_url})
        assert own.status_code == 200


async def test_no_web_is_404(tmp_path: Path) -> None:
    async with running_server(tmp_path, web=False, token="s3cret") as srv:
        auth = {"Authorization": "Bearer s3cret"}
        for path in ("/", "/web/app.js"):
            response = await srv.client.get(path, headers=auth)
            assert response.status_code == 404
        assert (await srv.client.get("/")).status_code == 401   # no longer public
