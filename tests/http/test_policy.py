"""``GuardPolicy.check``: the one pure check behind the HTTP front layer and the /acp
WebSocket handshake (issue #22 §3, #21 items 3, 4 and 10)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from acp_server.http import policy as p
from acp_server.http.policy import GuardPolicy, split_host

PORT = 4170


def scope(*headers: tuple[str, str], kind: str = "http", path: str = "/session",
          method: str = "GET", client: str = "127.0.0.1", query: bytes = b"") -> dict[str, Any]:
    return {"type": kind, "method": method, "path": path, "raw_path": path.encode(),
            "query_string": query, "client": (client, 50000), "server": ("127.0.0.1", PORT),
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers]}


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]", f"localhost:{PORT}",
                                  f"127.0.0.1:{PORT}", f"[::1]:{PORT}", "LOCALHOST", "127.0.0.2",
                                  "localhost:1", "127.0.0.1:80", "[::1]:9"])
def test_loopback_hosts_are_accepted(host: str) -> None:
    assert GuardPolicy().check(scope(("host", host))) is None


@pytest.mark.parametrize("host", ["evil.example", f"evil.example:{PORT}", "localhost:x",
                                  "127.0.0.1:999999", "localhost.evil.example",
                                  "127.0.0.1.nip.io", "::1", "[::1", "a:b:c", "x:99999999", ""])
def test_other_hosts_are_misdirected(host: str) -> None:
    refusal = GuardPolicy().check(scope(("host", host)))
    assert refusal is not None and refusal.status == 421
    assert GuardPolicy().check(scope(("host", host), kind="websocket")) == refusal


def test_allow_host_entries_with_and_without_port() -> None:
    policy = GuardPolicy(allow_hosts=("dev.box", "other.box:8443"))
    assert policy.check(scope(("host", "dev.box"))) is None
    assert policy.check(scope(("host", "dev.box:1234"))) is None
    assert policy.check(scope(("host", "other.box:8443"))) is None
    assert policy.check(scope(("host", "other.box"))).status == 421   # type: ignore[union-attr]
    # Off loopback the Host is checked only when an allow-list is given.
    assert GuardPolicy(token="t", loopback_bind=False).check(
        scope(("host", "anything"), ("authorization", "Bearer t"))) is None
    remote = GuardPolicy(token="t", loopback_bind=False, allow_hosts=("dev.box",))
    assert remote.check(scope(("host", "anything"), ("authorization", "Bearer t"))).status == 421  # type: ignore[union-attr]


def test_no_host_passes_and_bad_entries_are_refused() -> None:
    assert GuardPolicy().check(scope()) is None
    with pytest.raises(ValueError):
        GuardPolicy(allow_hosts=("a:b:c",))
    assert split_host("[::1]:4170") == ("[::1]", 4170)
    assert split_host("Example.COM") == ("example.com", None)


def test_head_caps() -> None:
    policy = GuardPolicy(max_headers=3, max_header_bytes=64, max_request_line=40)
    assert policy.check(scope(("a", "1"), ("b", "2"), ("c", "3"))) is None
    assert policy.check(scope(*[("x", "1")] * 4)) is p.TOO_MANY_HEADERS
    assert policy.check(scope(("x", "y" * 64))) is p.HEADERS_TOO_LARGE
    assert policy.check(scope(path="/" + "a" * 40)) is p.LINE_TOO_LONG
    assert policy.check(scope(path="/a", query=b"q" * 40)) is p.LINE_TOO_LONG


@pytest.mark.parametrize("coding", ["gzip, chunked", "identity", "chunked, chunked", "gzip"])
def test_transfer_codings_other_than_chunked_are_501(coding: str) -> None:
    refusal = GuardPolicy().check(scope(("transfer-encoding", coding), method="POST"))
    assert refusal is p.CODING_UNSUPPORTED and refusal.status == 501
    assert GuardPolicy().check(scope(("transfer-encoding", "Chunked"), method="POST")) is None


def test_origin_rules_are_the_same_for_http_and_websocket() -> None:
    policy = GuardPolicy(allow_origins=("http://ok.example",))
    for kind in ("http", "websocket"):
        assert policy.check(scope(("origin", "http://evil.example"), kind=kind)) is p.CORS_DENIED
        assert policy.check(scope(("origin", "http://ok.example/"), kind=kind)) is None
        assert policy.check(scope(("origin", f"http://localhost:{PORT}"), kind=kind)) is None
        # our own origin seen from a non-loopback client is not ours
        assert GuardPolicy(token="t").check(scope(
            ("origin", f"http://localhost:{PORT}"), ("authorization", "Bearer t"),
            client="10.0.0.9", kind=kind)) is p.CORS_DENIED
    refusal, allowed = policy.inspect(scope(("origin", "http://ok.example")))
    assert refusal is None and allowed == b"http://ok.example"


def test_token_on_http_and_websocket() -> None:
    policy = GuardPolicy(token="s3cret")
    assert policy.check(scope()) is p.UNAUTHORIZED
    assert policy.check(scope(("authorization", "Bearer wrong"))) is p.UNAUTHORIZED
    assert policy.check(scope(("authorization", "bearer s3cret"))) is None
    assert policy.check(scope(path="/health")) is None               # open on loopback
    assert GuardPolicy(token="s3cret", health_needs_auth=True).check(
        scope(path="/health")) is p.UNAUTHORIZED
    encoded = base64.urlsafe_b64encode(b"s3cret").decode().rstrip("=")
    ws = scope(("sec-websocket-protocol", f"acp, qwen-bearer.{encoded}"), kind="websocket",
               path="/acp")
    assert policy.check(ws) is None
    # the subprotocol form is a WebSocket's only; /health is not open to a WebSocket
    assert policy.check(scope(("sec-websocket-protocol", f"qwen-bearer.{encoded}"))) \
        is p.UNAUTHORIZED
    assert policy.check(scope(kind="websocket", path="/health")) is p.UNAUTHORIZED


def test_public_paths_and_preflight_need_no_token() -> None:
    policy = GuardPolicy(token="t", allow_origins=("http://ok.example",),
                         public=lambda method, path: method == "GET" and path == "/")
    assert policy.check(scope(path="/")) is None
    assert policy.check(scope(path="/", method="POST")) is p.UNAUTHORIZED
    preflight = scope(("origin", "http://ok.example"), ("access-control-request-method", "POST"),
                      method="OPTIONS")
    assert policy.check(preflight) is None


def test_without_a_token_only_loopback_clients_are_served() -> None:
    for kind in ("http", "websocket"):
        assert GuardPolicy().check(scope(client="192.0.2.7", kind=kind)) is p.NOT_LOOPBACK
        assert GuardPolicy().check(scope(client="::1", kind=kind)) is None
        # an IPv4 loopback client on a dual-stack (``::``) bind: loopback too
        assert GuardPolicy().check(scope(client="::ffff:127.0.0.1", kind=kind)) is None
        assert GuardPolicy().check(scope(client="::ffff:192.0.2.7", kind=kind)) \
            is p.NOT_LOOPBACK
    assert GuardPolicy(token="t").check(scope(("authorization", "Bearer t"),
                                              client="192.0.2.7")) is None


def test_string_ports_from_the_server_are_understood() -> None:
    # granian gives (host, "port") in scope["server"]
    s = scope(("host", f"localhost:{PORT}"), ("origin", f"http://localhost:{PORT}"))
    s["server"], s["client"] = ("127.0.0.1", str(PORT)), ("127.0.0.1", "50000")
    assert GuardPolicy().check(s) is None


def test_the_host_memo_is_bounded() -> None:
    policy = GuardPolicy()
    for i in range(1000):
        assert policy.check(scope(("host", f"h{i}.example"))) is p.MISDIRECTED
    assert len(policy._good_hosts) == p.MEMO_KEPT
    assert policy.check(scope(("host", "localhost"))) is None   # full: still answered


def test_long_host_values_are_checked_not_kept() -> None:
    """A Host value may be ~64 KiB: those over ``MEMO_HOST_BYTES`` are parsed each time,
    so the memo's bytes stay bounded."""
    policy = GuardPolicy()
    for i in range(p.MEMO_KEPT):
        host = f"h{i}" + "x" * (p.MEMO_HOST_BYTES + 10)
        assert policy.check(scope(("host", host))) is p.MISDIRECTED
    assert policy.check(scope(("host", "127.0.0.1:4170"))) is None
    assert list(policy._good_hosts) == [b"127.0.0.1:4170"]


def test_the_local_caller_memo_is_bounded_and_answers_when_full() -> None:
    """Without a credential each loopback address's local Caller is kept (up to
    ``MEMO_KEPT``); past that it is made each time, the same answer."""
    from acp_server.principals import CALLER_KEY, LOCAL

    policy = GuardPolicy()
    addresses = [f"127.0.{i // 250}.{i % 250 + 1}" for i in range(p.MEMO_KEPT + 10)]
    callers = []
    for address in addresses:
        s = scope(client=address)
        assert policy.check(s) is None
        callers.append(s[CALLER_KEY])
    assert len(policy._local_callers) == p.MEMO_KEPT
    assert all(c.principal is LOCAL for c in callers)
    assert [c.client for c in callers] == addresses
    s = scope(client=addresses[0])
    assert policy.check(s) is None and s[CALLER_KEY] is callers[0]   # kept
    late = scope(client=addresses[-1])
    assert policy.check(late) is None and late[CALLER_KEY].client == addresses[-1]
    assert policy.check(scope(client="192.0.2.7")) is p.NOT_LOOPBACK   # never kept
    assert "192.0.2.7" not in policy._local_callers


def test_a_remote_client_guessing_tokens_is_throttled() -> None:
    """20 failed credentials from one address not on loopback, then one every 3 s: past
    them a request from it is 429 ``too_many_failed_credentials`` with its wait, its
    credential not compared (the right token too); other addresses and loopback
    clients are not touched."""
    from acp_server.principals import Gate
    from acp_server.principals.auth import bootstrap_only
    from acp_server.principals.limits import FAILURE_TIERS, RateLimiter

    now = [100.0]
    gate = Gate(bootstrap_only("s3cret"), failures=RateLimiter(FAILURE_TIERS, clock=lambda: now[0]))
    policy = GuardPolicy(token="s3cret", loopback_bind=False, gate=gate)
    wrong, right = ("authorization", "Bearer guess"), ("authorization", "Bearer s3cret")
    remote = "203.0.113.9"
    for _ in range(20):
        assert policy.check(scope(wrong, client=remote)) is p.UNAUTHORIZED
    refused = policy.check(scope(wrong, client=remote))
    assert refused is not None and (refused.status, refused.code) == (
        429, "too_many_failed_credentials")
    assert refused.headers == ((b"retry-after", b"3"),)
    assert policy.check(scope(right, client=remote)).status == 429   # type: ignore[union-attr]
    assert policy.check(scope(right, client="198.51.100.4")) is None
    for _ in range(50):   # loopback: never throttled; no credential at all: no guess
        assert policy.check(scope(wrong)) is p.UNAUTHORIZED
        assert policy.check(scope(client="198.51.100.4")) is p.UNAUTHORIZED
    assert policy.check(scope(right, client="198.51.100.4")) is None
    assert policy.check(scope(right)) is None
    now[0] += 3.0   # one failure's worth back
    assert policy.check(scope(right, client=remote)) is None
    assert policy.check(scope(wrong, client=remote)) is p.UNAUTHORIZED
    assert policy.check(scope(wrong, client=remote)).status == 429   # type: ignore[union-attr]


def test_two_host_fields_are_a_400_even_when_one_is_good() -> None:
    for hosts in (("evil.example", "127.0.0.1"), ("127.0.0.1", "127.0.0.1"),
                  ("127.0.0.1", "evil.example", "localhost")):
        refusal = GuardPolicy().check(scope(*(("host", h) for h in hosts)))
        assert refusal is p.TWO_HOSTS and refusal.status == 400, hosts
        assert GuardPolicy(token="t", loopback_bind=False).check(
            scope(*(("host", h) for h in hosts), ("authorization", "Bearer t"))) is p.TWO_HOSTS


def test_an_empty_host_passes_only_on_http_1_0() -> None:
    """granian's ASGI side gives an HTTP/1.0 request without a Host ``host: ""``; an
    HTTP/1.1 request must name one (an empty value is for URIs without an authority)."""
    for version in ("1.0", "1"):   # granian's ASGI side says "1"
        old = scope(("host", ""))
        old["http_version"] = version
        assert GuardPolicy().check(old) is None
    for version in ("1.1", "2"):   # "2": granian's HTTP/2 with neither :authority nor host
        new = scope(("host", ""))
        new["http_version"] = version
        assert GuardPolicy().check(new).status == 421   # type: ignore[union-attr]
