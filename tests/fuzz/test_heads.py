"""Fuzz the front layer's guard: ``Host`` values and header counts and sizes on every
door. The answer is what the policy says: 421 (in the door's shape) for a foreign
Host, 431 past a head cap, never a 5xx, and the server healthy afterwards."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from acp_server.http.policy import DEFAULT_MAX_HEADERS, is_loopback, split_host
from tests.fuzz.budget import Budget, fuzz_settings
from tests.fuzz.http import send
from tests.fuzz.live import Live
from tests.fuzz.shapes import check_acp, check_lmsp, check_rest
from tests.fuzz.strategies import HEAD_SIZES, hosts

pytestmark = pytest.mark.slow   # hypothesis against a live server: tens of seconds
PATHS = [("GET", "/health", check_rest), ("GET", "/capabilities", check_rest),
         ("GET", "/lmsp/v1/tasks", check_lmsp), ("POST", "/acp", check_acp),
         ("GET", "/metrics", check_rest), ("GET", "/nope", check_rest)]


def accepted(host: str) -> bool:
    parsed = split_host(host)
    return parsed is not None and is_loopback(parsed[0])


def test_hosts_and_head_sizes(live: Live) -> None:
    port = int(live.base_url.rsplit(":", 1)[1])
    budget = Budget()

    @fuzz_settings(0.5)
    @given(route=st.sampled_from(PATHS), host=hosts(port), sizes=HEAD_SIZES)
    def run(route: tuple, host: str, sizes: tuple[int, int]) -> None:
        if budget.spent:
            return
        method, path, check = route
        count, size = sizes
        headers = {f"x-fuzz-{i}": "v" * size for i in range(count)}
        if host.strip():
            headers["host"] = host
        body = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}' \
            if method == "POST" else None
        try:
            response = send(live.http, method, path, content=body,
                            headers={**headers, "content-type": "application/json"})
        except Exception as exc:   # a client that refuses to send it (e.g. h2 header rules)
            if type(exc).__module__.startswith(("httpx", "h2", "h11", "httpcore")):
                return
            raise
        head_bytes = count * (size + 12)
        if not (response.status_code in (400, 431) and head_bytes > 16 * 1024):
            check(response)   # else possibly the HTTP server's own refusal (h11: 16 KiB)
        status = response.status_code
        small = head_bytes < 16 * 1024 and count + 8 <= DEFAULT_MAX_HEADERS
        if status == 421:
            assert not accepted(host), host
        if status < 400:   # served: a loopback Host (or none) and a head under the caps
            assert not host.strip() or accepted(host), (host, status)
            assert head_bytes <= 64 * 1024 and count <= DEFAULT_MAX_HEADERS, (count, size)
        if small and host.strip() and not accepted(host):
            assert status in (400, 421), (host, status)   # 400: the server's own parser
        if head_bytes > 70 * 1024 or count > DEFAULT_MAX_HEADERS + 5:
            assert status in (400, 421, 431), (count, size, status)

    run()
