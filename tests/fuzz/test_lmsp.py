"""Fuzz every LMSP route: generated bodies, headers, cursors and task ids. No 5xx,
every error a problem object, the server healthy afterwards; on SQLite under each
backend, and on PostgreSQL (asyncio) when ``ACP_SERVER_TEST_POSTGRES`` names one."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz.budget import Budget, fuzz_settings
from tests.fuzz.http import send
from tests.fuzz.live import Live, live_server
from tests.fuzz.shapes import check_lmsp, check_rest
from tests.fuzz.strategies import (
    CONTENT_TYPE,
    HEADER_VALUE,
    HEADERS,
    LMSP_KEYS,
    QUERY,
    QUERY_VALUES,
    RAW_QUERIES,
    bodies,
    path_ids,
)
from tests.lmsp import stores

pytestmark = pytest.mark.slow   # hypothesis against a live server: tens of seconds

ROUTES = [
    ("GET", "/lmsp/v1/capabilities"), ("POST", "/lmsp/v1/responses"),
    ("POST", "/lmsp/v1/tasks"), ("GET", "/lmsp/v1/tasks/{id}"),
    ("POST", "/lmsp/v1/tasks/{id}/cancel"), ("GET", "/lmsp/v1/tasks/{id}/events"),
    ("DELETE", "/lmsp/v1/tasks/{id}"), ("OPTIONS", "/lmsp/v1/tasks"), ("GET", "/lmsp/v1/{id}"),
    ("GET", "/lmsp/v1/tasks"), ("GET", "/lmsp/v1/responses/{id}"),
    ("POST", "/lmsp/v1/responses/{id}/cancel"), ("DELETE", "/lmsp/v1/responses/{id}"),
    ("GET", "/lmsp/v1/responses/{id}/input_items"),
]
# the listing's and the response stream's parameters, and values past what int() reads
LMSP_QUERY = st.one_of(QUERY, st.dictionaries(
    st.sampled_from(["limit", "after", "before", "order", "status", "starting_after",
                     "stream", "include"]),
    st.one_of(HEADER_VALUE, QUERY_VALUES, st.sampled_from(["1" * 5000, "0" * 5000 + "7", "\x00", "true",
                                             "task_" + "Z" * 26, "running", "1e999"])),
    max_size=3))


def test_lmsp_routes(live: Live) -> None:
    _fuzz(live)


def test_lmsp_routes_on_postgres(tmp_path: Path) -> None:
    # ids and values a PostgreSQL TEXT cannot hold (a NUL) reach its queries, not SQLite's
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    store = stores.STORE_FACTORIES["postgres"](tmp_path, "lmsp", True)
    with live_server(tmp_path, "asyncio", store=store) as live:
        _fuzz(live)


def _fuzz(live: Live) -> None:
    budget = Budget()

    @fuzz_settings()
    @example(route=("GET", "/lmsp/v1/tasks"), task_id="x", body=b"", headers={},
             content_type="", query={"limit": "1" * 5000}, raw="")   # int() refused it: a 500
    @example(route=("POST", "/lmsp/v1/responses/{id}/cancel"), task_id="a%00b", body=b"",
             headers={}, content_type="", query={}, raw="")   # no PostgreSQL TEXT holds a NUL
    @example(route=("POST", "/lmsp/v1/responses"), task_id="x", headers={}, query={},
             content_type="application/json",
             body=b'{"model":"reference","input":"x","previous_response_id":"\\u0000"}', raw="")
    @given(route=st.sampled_from(ROUTES), task_id=path_ids([live.task_id]),
           body=bodies(LMSP_KEYS), headers=HEADERS, content_type=CONTENT_TYPE,
           query=LMSP_QUERY, raw=RAW_QUERIES)
    def run(route: tuple[str, str], task_id: str, body: bytes, headers: dict[str, str],
            content_type: str, query: dict[str, str], raw: str) -> None:
        if budget.spent:
            return
        method, template = route
        if not live.sendable(body if method == "POST" else None):
            return
        sent = {**headers, "content-type": content_type} if content_type else headers
        path = template.replace("{id}", task_id)
        sent_query: dict[str, str] | None = query
        if raw:   # as it is (httpx would encode it, and drops a path's query given params)
            path, sent_query = f"{path}?{raw}", None
        response = send(live.http, method, path, content=body if method == "POST" else None,
                        headers=sent, params=sent_query)
        path = response.request.url.path   # a client may normalise "/lmsp/v1/.." away
        if path == "/lmsp" or path.startswith("/lmsp/"):
            check_lmsp(response)
        else:
            check_rest(response)

    run()
