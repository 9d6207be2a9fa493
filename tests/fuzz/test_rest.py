"""Fuzz every REST route: generated bodies, headers, query strings and path ids.
No 5xx, every error ``{"error": str, "code"?}``, the server healthy afterwards; on
SQLite under each backend, and on PostgreSQL (asyncio) when ``ACP_SERVER_TEST_POSTGRES``
names one (a client's ids and filters reach its queries: a NUL it cannot hold)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import msgspec

from acp_server.http import ended_cursor as ended
from acp_server.http.body import BodyError, decode_json
from acp_server.rest.wire import CreateTokenBody
from tests.fuzz.budget import Budget, fuzz_settings
from tests.fuzz.http import send
from tests.fuzz.live import Live, live_on_postgres
from tests.fuzz.shapes import check_rest
from tests.fuzz.strategies import (
    CONTENT_TYPE, HEADER_VALUE, HEADERS, QUERY, RAW_QUERIES, REST_KEYS, bodies, cursors,
    path_ids)

pytestmark = pytest.mark.slow   # hypothesis against a live server: tens of seconds

ROUTES = [
    ("GET", "/health"), ("GET", "/capabilities"), ("GET", "/daemon/status"),
    ("POST", "/session"), ("POST", "/session/{id}/prompt"), ("GET", "/session/{id}/events"),
    ("POST", "/session/{id}/cancel"), ("POST", "/session/{id}/branch"),
    ("POST", "/session/{id}/permission/{other}"), ("POST", "/permission/{other}"),
    ("POST", "/session/{id}/load"), ("POST", "/session/{id}/resume"),
    ("GET", "/session/{id}/status"), ("GET", "/session/{id}/pending-prompts"),
    ("DELETE", "/session/{id}/pending-prompts/{other}"), ("POST", "/session/{id}/heartbeat"),
    ("POST", "/session/{id}/approval-mode"), ("POST", "/session/{id}/model"),
    ("POST", "/session/{id}/config-option"),
    ("DELETE", "/session/{id}"), ("PUT", "/session/{id}"), ("GET", "/nope/{id}"),
    ("GET", "/workspaces/{id}/sessions"), ("GET", "/workspace/{id}/ended-sessions"),
    ("POST", "/workspaces/{id}/acp"),
    ("GET", "/workspaces/{id}/acp"), ("DELETE", "/workspaces/{other}/acp"),
    # an absolute {ws}, decoded by the server (``acp_server.http.mounts``): another
    # folder's, and this workspace's path with more after it (``%2F..``, ``%2F%2F``: its
    # listing; anything else another folder's)
    ("GET", "/workspaces/%2F{id}/sessions"), ("POST", "/workspaces/%2F{id}%2F{other}/acp"),
    ("GET", "/workspaces/{ws}%2F{id}/sessions"),
    ("GET", "/workspace/{id}/sessions"), ("GET", "/workspace/{ws}/sessions"),
    # the administration (the fuzzed server trusts loopback: its caller is an admin)
    ("DELETE", "/tokens/{id}"), ("GET", "/audit"), ("GET", "/tokens"), ("POST", "/tokens"),
    ("GET", "/whoami"),
    # operability and the web console
    ("GET", "/metrics"), ("GET", "/openapi.json"), ("GET", "/"), ("GET", "/web/{id}"),
]
_TOKEN_BODY = msgspec.json.Decoder(CreateTokenBody)


def _makes_a_token(body: bytes) -> bool:
    """A body ``POST /tokens`` would take: it would configure a first credential and
    lock the loopback caller out (the principals suite drives that)."""
    try:
        decode_json(body if body.strip() else b"{}", _TOKEN_BODY)
    except (BodyError, msgspec.MsgspecError):
        return False
    return True


def test_rest_routes(live: Live) -> None:
    _fuzz_routes(live)


def test_rest_routes_on_postgres(tmp_path: Path) -> None:
    with live_on_postgres(tmp_path) as live:
        _fuzz_routes(live)


def _fuzz_routes(live: Live) -> None:
    ids = path_ids([live.session_id])
    budget = Budget()
    ws = quote(live.http.get("/capabilities").json()["workspaces"][0]["cwd"], safe="")
    none: dict[str, str] = {}

    @fuzz_settings(1.5)
    # found on PostgreSQL (no TEXT holds a NUL): a 500 each
    @example(route=("POST", "/session/{id}/load"), sid="a%00b", other="x", body=b"{}",
             headers=none, content_type="application/json", query=none, raw="")
    @example(route=("DELETE", "/tokens/{id}"), sid="%00", other="x", body=b"",
             headers=none, content_type="", query=none, raw="")
    @example(route=("GET", "/audit"), sid="x", other="x", body=b"", headers=none,
             content_type="", query={"principal": "a\x00b"}, raw="")
    @given(route=st.sampled_from(ROUTES), sid=ids, other=ids, body=bodies(REST_KEYS),
           headers=HEADERS, content_type=CONTENT_TYPE, query=QUERY, raw=RAW_QUERIES)
    def run(route: tuple[str, str], sid: str, other: str, body: bytes,
            headers: dict[str, str], content_type: str, query: dict[str, str],
            raw: str) -> None:
        if budget.spent:
            return
        method, template = route
        path = template.replace("{id}", sid).replace("{other}", other).replace("{ws}", ws)
        if live.http.base_url.join(path).path.startswith(("/acp", "/lmsp/")):
            return   # a dot segment the client resolved (``/workspaces/../acp``): another door
        if template == "/tokens" and method == "POST" and _makes_a_token(body):
            return
        if not live.sendable(body if method != "GET" else None):
            return
        sent_query: dict[str, str] | None = query
        if raw:   # as it is (httpx would encode it, and drops a path's query given params)
            path, sent_query = f"{path}?{raw}", None
        sent = {**headers, "content-type": content_type} if content_type else headers
        check_rest(send(live.http, method, path, content=body if method != "GET" else None,
                        headers=sent, params=sent_query))

    run()


LISTING_ERRORS = {"invalid_cursor"}


def test_workspace_session_listing(live: Live) -> None:
    """``GET /workspace/{id}/sessions`` with generated ``cursor`` and ``size``: a page or
    400 ``invalid_cursor``, never a 5xx (``size`` is clamped, never an error); a real
    cursor (as minted) always pages on."""
    wid = live.http.get("/capabilities").json()["workspaces"][0]["id"]
    for _ in range(3):
        live.http.post("/session", json={"sessionScope": "thread"})
    first = live.http.get(f"/workspace/{wid}/sessions", params={"size": "1"}).json()
    _fuzz_listing(live, f"/workspace/{wid}/sessions", first["nextCursor"], (200, 414))


def test_ended_session_listing(live: Live) -> None:
    """``GET /workspace/{id}/ended-sessions`` with generated ``cursor`` and ``size``: a
    page or 400 ``invalid_cursor``, never a 5xx; a cursor as the route mints it always
    pages on."""
    wid = live.http.get("/capabilities").json()["workspaces"][0]["id"]
    minted = ended.encode((1_764_900_000.5, live.session_id))
    _fuzz_listing(live, f"/workspace/{wid}/ended-sessions", minted, (200,))


def _fuzz_listing(live: Live, path: str, minted: str, minted_answers: tuple[int, ...]) -> None:
    """A listing with generated ``cursor`` and ``size``; ``minted`` (a real cursor) is
    answered one of ``minted_answers``."""
    budget = Budget()

    @fuzz_settings(0.5)
    @given(cursor=cursors(minted), size=st.one_of(st.none(), st.integers(-1, 102).map(str),
                                                  HEADER_VALUE))
    def run(cursor: str, size: str | None) -> None:
        if budget.spent:
            return
        params = {"cursor": cursor, **({"size": size} if size is not None else {})}
        response = send(live.http, "GET", path, params=params)
        check_rest(response)
        assert response.status_code in (200, 400, 414), response.status_code
        if response.status_code == 400:
            assert response.json()["code"] in LISTING_ERRORS, response.json()
        elif response.status_code == 200:
            assert isinstance(response.json()["sessions"], list)
        if cursor == minted:
            assert response.status_code in minted_answers, response.status_code

    run()
