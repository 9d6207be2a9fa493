"""Fuzz the principals: random credentials (valid tokens of every scope set, revoked
ones, random and mutated ``acps_`` tokens, the bootstrap token, garbage, WebSocket
subprotocol forms) on random routes of every door. No 5xx; an invalid credential is
exactly 401; a valid one is 403 exactly when the route needs a scope it lacks (the
door's own access table), with the scope named, and else 404 on the bootstrap admin's
session and task unless it is an admin (ownership); every answer in its door's shape."""

from __future__ import annotations

import base64
import contextlib
import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio.from_thread
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from acp_server.acp_http import access as acp_access
from acp_server.lmsp.endpoints import access as lmsp_access
from acp_server.rest.access import access as rest_access
from tests.fuzz.budget import Budget, fuzz_settings
from tests.fuzz.http import send
from tests.fuzz.live import OPTIONS
from tests.fuzz.shapes import check_acp, check_lmsp, check_rest
from tests.harness.local import local_server
from tests.principals.helpers import mint

pytestmark = pytest.mark.slow
BOOT = "fuzz-bootstrap"
VISIBLE = st.characters(min_codepoint=0x21, max_codepoint=0x7E)
LEGAL_HEADER = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
SCOPE_SETS = [frozenset(c) for n in range(1, 4)
              for c in itertools.combinations(("read", "prompt", "admin"), n)]
ROUTES = [
    ("GET", "/capabilities"), ("GET", "/whoami"), ("GET", "/daemon/status"),
    ("GET", "/health"), ("POST", "/session"), ("GET", "/session/{sid}/status"),
    ("POST", "/session/{sid}/prompt"), ("GET", "/session/{sid}/events"),
    ("POST", "/session/{sid}/heartbeat"), ("DELETE", "/session/{sid}/pending-prompts/x"),
    ("GET", "/workspace/x/sessions"), ("GET", "/workspaces/x/sessions"),
    ("GET", "/workspaces/%2Fx/sessions"), ("POST", "/workspaces/%2Fx/acp"),   # another folder
    ("GET", "/tokens"), ("POST", "/tokens"),
    ("DELETE", "/tokens/nobody"), ("GET", "/audit"), ("GET", "/metrics"),
    ("GET", "/lmsp/v1/capabilities"), ("GET", "/lmsp/v1/tasks"), ("POST", "/lmsp/v1/tasks"),
    ("GET", "/lmsp/v1/tasks/{tid}"), ("POST", "/lmsp/v1/tasks/{tid}/cancel"),
    ("POST", "/lmsp/v1/responses"), ("GET", "/acp"), ("DELETE", "/acp"),
]


@contextlib.asynccontextmanager
async def _serve(workspace: Path) -> Any:
    async with local_server(workspace, options=OPTIONS, token=BOOT, rate_limit_prompt=0,
                            rate_limit_mutation=0, rate_limit_read=0,
                            headers={"Authorization": f"Bearer {BOOT}"}) as srv:
        tokens = {}
        for i, scopes in enumerate(SCOPE_SETS):
            tokens[await mint(srv.server, f"p{i}", *sorted(scopes))] = scopes
        revoked = await mint(srv.server, "gone")
        await srv.client.delete("/tokens/gone")
        sid = (await srv.client.post("/session", json={})).json()["sessionId"]
        task = (await srv.client.post("/lmsp/v1/tasks", json={"type": "response", "input": {
            "model": "reference", "input": "seed"}})).json()["id"]
        yield srv.base_url, tokens, revoked, sid, task


@contextlib.contextmanager
def served(workspace: Path, backend: str) -> Iterator[tuple[Any, ...]]:
    with anyio.from_thread.start_blocking_portal(backend) as portal, \
            portal.wrap_async_context_manager(_serve(workspace)) as seeded, \
            httpx.Client(base_url=seeded[0], timeout=15) as http:
        yield (http, *seeded[1:])
        assert http.get("/health").json() == {"status": "ok"}
        assert http.get("/whoami", headers={"Authorization": f"Bearer {BOOT}"}
                        ).json()["name"] == "bootstrap"


def _mutated(token: str, position: int, char: str) -> str:
    index = 5 + position % (len(token) - 5)
    return token[:index] + char + token[index + 1:]


def _access(method: str, path: str) -> Any:
    if path.startswith("/lmsp/"):
        return lmsp_access(method, path)
    if path == "/acp":
        return acp_access(method, path)
    return rest_access(method, path)


def _check(path: str, response: httpx.Response) -> None:
    if path.startswith("/lmsp/"):
        check_lmsp(response)
    elif path == "/acp":
        check_acp(response)
    else:
        check_rest(response)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_random_credentials_and_scopes(tmp_path: Path, backend: str) -> None:
    with served(tmp_path, backend) as (http, tokens, revoked, sid, task):
        valid = sorted(tokens)
        budget = Budget()
        hex_id = st.text("0123456789abcdef", min_size=16, max_size=16)
        secret = st.binary(min_size=0, max_size=48).map(
            lambda b: base64.urlsafe_b64encode(b).decode().rstrip("="))
        credentials = st.one_of(
            st.sampled_from(valid).map(lambda t: ("valid", t)),
            st.just(("invalid", revoked)),
            st.tuples(hex_id, secret).map(lambda p: ("invalid", f"acps_{p[0]}_{p[1]}")),
            st.tuples(st.sampled_from(valid), st.integers(0, 200),
                      st.sampled_from("AZ09_-x")).map(
                lambda p: ("mutated", _mutated(p[0], p[1], p[2]))),
            st.text(VISIBLE, max_size=60).map(lambda t: ("invalid", t)),
            st.just(("none", "")), st.just(("boot", BOOT)))

        @fuzz_settings(1.0)
        @given(route=st.sampled_from(ROUTES), credential=credentials,
               scheme=st.sampled_from(["Bearer ", "bearer ", "Basic ", ""]))
        def run(route: tuple[str, str], credential: tuple[str, str], scheme: str) -> None:
            if budget.spent:
                return
            kind, value = credential
            if kind == "mutated" and value in tokens:
                kind = "valid"
            method, template = route
            path = template.replace("{sid}", sid).replace("{tid}", task)
            headers = {}
            if kind != "none":
                header = scheme + value
                if not LEGAL_HEADER.fullmatch(header):
                    return   # no client sends it (and the HTTP server refuses it first)
                headers["Authorization"] = header
            body = b"{}" if method != "GET" else None
            if path == "/acp" and method == "GET":
                headers["Accept"] = "text/event-stream"
            response = send(http, method, path, content=body, headers={
                **headers, "content-type": "application/json"})
            _check(path, response)
            bearer = scheme.lower() == "bearer "
            if path in ("/health", "/metrics"):
                return   # open on a loopback bind without --require-auth
            if kind == "boot" and bearer:
                assert response.status_code not in (401, 403), response.content
            elif kind == "valid" and bearer:
                needed = _access(method, path).scope
                scopes = tokens[value]
                if needed is not None and needed not in scopes and "admin" not in scopes:
                    assert response.status_code == 403, (path, scopes, response.content)
                    if path != "/acp":
                        text = response.text
                        assert needed in text, text
                else:
                    assert response.status_code not in (401, 403), (path, scopes,
                                                                   response.content)
                    if "admin" not in scopes and ("{sid}" in template or "{tid}" in template):
                        # the bootstrap admin's session and task: another's, so 404
                        assert response.status_code == 404, (path, scopes, response.content)
            else:
                assert response.status_code == 401, (kind, value, path, response.content)

        run()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_random_websocket_credentials(tmp_path: Path, backend: str) -> None:
    """The WebSocket handshake with random ``qwen-bearer.*`` subprotocols: 401 unless
    the credential is valid; a valid one is served."""
    from tests.acp_http.wsclient import WsRejected, ws_connect

    with served(tmp_path, backend) as (http, tokens, revoked, _sid, _task):
        base_url = str(http.base_url).rstrip("/")
        valid = sorted(tokens)
        budget = Budget()

        async def handshake(protocols: list[str]) -> int:
            try:
                async with ws_connect(base_url, subprotocols=protocols):
                    return 101
            except WsRejected as exc:
                return exc.status

        @fuzz_settings(0.1)
        @given(choice=st.one_of(st.sampled_from(valid).map(lambda t: ("valid", t)),
                                st.text(VISIBLE, max_size=40).map(lambda t: ("invalid", t)),
                                st.just(("invalid", revoked))))
        def run(choice: tuple[str, str]) -> None:
            if budget.spent:
                return
            kind, value = choice
            encoded = base64.urlsafe_b64encode(value.encode()).decode().rstrip("=")
            status = anyio.run(handshake, [f"qwen-bearer.{encoded}"], backend=backend)
            assert status == (101 if kind == "valid" else 401), (kind, value, status)

        run()
