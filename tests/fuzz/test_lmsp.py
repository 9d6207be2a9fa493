"""Fuzz every LMSP route: generated bodies, headers, cursors and task ids. No 5xx,
every error a problem object, the server healthy afterwards."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.budget import Budget, fuzz_settings
from tests.fuzz.http import send
from tests.fuzz.live import Live
from tests.fuzz.shapes import check_lmsp, check_rest
from tests.fuzz.strategies import CONTENT_TYPE, HEADERS, LMSP_KEYS, QUERY, bodies, path_ids

pytestmark = pytest.mark.slow   # hypothesis against a live server: tens of seconds

ROUTES = [
    ("GET", "/lmsp/v1/capabilities"), ("POST", "/lmsp/v1/responses"),
    ("POST", "/lmsp/v1/tasks"), ("GET", "/lmsp/v1/tasks/{id}"),
    ("POST", "/lmsp/v1/tasks/{id}/cancel"), ("GET", "/lmsp/v1/tasks/{id}/events"),
    ("DELETE", "/lmsp/v1/tasks/{id}"), ("OPTIONS", "/lmsp/v1/tasks"), ("GET", "/lmsp/v1/{id}"),
]


def test_lmsp_routes(live: Live) -> None:
    budget = Budget()

    @fuzz_settings()
    @given(route=st.sampled_from(ROUTES), task_id=path_ids([live.task_id]),
           body=bodies(LMSP_KEYS), headers=HEADERS, content_type=CONTENT_TYPE, query=QUERY)
    def run(route: tuple[str, str], task_id: str, body: bytes, headers: dict[str, str],
            content_type: str, query: dict[str, str]) -> None:
        if budget.spent:
            return
        method, template = route
        sent = {**headers, "content-type": content_type} if content_type else headers
        response = send(live.http, method, template.replace("{id}", task_id),
                        content=body if method == "POST" else None, headers=sent, params=query)
        path = response.request.url.path   # a client may normalise "/lmsp/v1/.." away
        if path == "/lmsp" or path.startswith("/lmsp/"):
            check_lmsp(response)
        else:
            check_rest(response)

    run()
