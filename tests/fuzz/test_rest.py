"""Fuzz every REST route: generated bodies, headers, query strings and path ids.
No 5xx, every error ``{"error": str, "code"?}``, the server healthy afterwards."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.budget import Budget, fuzz_settings
from tests.fuzz.http import send
from tests.fuzz.live import Live
from tests.fuzz.shapes import check_rest
from tests.fuzz.strategies import CONTENT_TYPE, HEADERS, QUERY, REST_KEYS, bodies, path_ids

pytestmark = pytest.mark.slow   # hypothesis against a live server: tens of seconds

ROUTES = [
    ("GET", "/health"), ("GET", "/capabilities"), ("GET", "/daemon/status"),
    ("POST", "/session"), ("POST", "/session/{id}/prompt"), ("GET", "/session/{id}/events"),
    ("POST", "/session/{id}/cancel"), ("POST", "/session/{id}/branch"),
    ("POST", "/session/{id}/permission/{other}"), ("POST", "/permission/{other}"),
    ("POST", "/session/{id}/load"), ("POST", "/session/{id}/resume"),
    ("GET", "/session/{id}/status"), ("GET", "/session/{id}/pending-prompts"),
    ("DELETE", "/session/{id}/pending-prompts/{other}"), ("POST", "/session/{id}/heartbeat"),
    ("DELETE", "/session/{id}"), ("PUT", "/session/{id}"), ("GET", "/nope/{id}"),
]


def test_rest_routes(live: Live) -> None:
    ids = path_ids([live.session_id])
    budget = Budget()

    @fuzz_settings(1.5)
    @given(route=st.sampled_from(ROUTES), sid=ids, other=ids, body=bodies(REST_KEYS),
           headers=HEADERS, content_type=CONTENT_TYPE, query=QUERY)
    def run(route: tuple[str, str], sid: str, other: str, body: bytes,
            headers: dict[str, str], content_type: str, query: dict[str, str]) -> None:
        if budget.spent:
            return
        method, template = route
        path = template.replace("{id}", sid).replace("{other}", other)
        sent = {**headers, "content-type": content_type} if content_type else headers
        check_rest(send(live.http, method, path, content=body if method != "GET" else None,
                        headers=sent, params=query))

    run()
