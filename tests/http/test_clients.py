"""``acp_server.http.clients``: who the client is behind a trusted proxy (X-Forwarded-For,
believed only from ``--trusted-proxy`` addresses) or a forwarding instance (its proof,
keyed with the fleet's secret)."""

from __future__ import annotations

from typing import Any

import pytest

from acp_server.http.clients import (
    FORWARDED_BY_HEADER,
    FORWARDED_FOR_HEADER,
    FORWARDED_PROOF_HEADER,
    ClientResolver,
    UNKNOWN_CLIENT,
    parse_networks,
    proof,
)

SECRET = b"k" * 32


def scope(peer: str, *headers: tuple[bytes, bytes], path: str = "/session/s/prompt",
          method: str = "POST") -> dict[str, Any]:
    return {"type": "http", "client": (peer, 5555), "method": method, "path": path,
            "raw_path": path.encode(), "headers": list(headers)}


def resolved(resolver: ClientResolver, s: dict[str, Any]) -> str:
    resolver(s)
    return s["client"][0]  # type: ignore[no-any-return]


def test_x_forwarded_for_is_believed_only_from_a_trusted_proxy() -> None:
    resolver = ClientResolver(trusted=("127.0.0.1", "10.0.0.0/8"))
    xff = (b"x-forwarded-for", b"203.0.113.7")
    assert resolved(resolver, scope("127.0.0.1", xff)) == "203.0.113.7"
    assert resolved(resolver, scope("10.1.2.3", xff)) == "203.0.113.7"
    assert resolved(resolver, scope("192.0.2.1", xff)) == "192.0.2.1"   # not a proxy of ours
    assert resolved(resolver, scope("127.0.0.1")) == "127.0.0.1"        # no header
    assert resolved(ClientResolver(), scope("127.0.0.1", xff)) == "127.0.0.1"   # off


def test_the_rightmost_untrusted_hop_is_the_client() -> None:
    resolver = ClientResolver(trusted=("127.0.0.1", "10.0.0.0/8"))
    # the client's own claim (1.1.1.1) comes first: only what trusted hops added counts
    chain = (b"x-forwarded-for", b"1.1.1.1, 198.51.100.4, 10.0.0.5")
    assert resolved(resolver, scope("127.0.0.1", chain)) == "198.51.100.4"
    split = [(b"x-forwarded-for", b"1.1.1.1"), (b"x-forwarded-for", b"198.51.100.4")]
    assert resolved(resolver, scope("127.0.0.1", *split)) == "198.51.100.4"
    v6 = (b"x-forwarded-for", b"2001:DB8::1")
    assert resolved(resolver, scope("127.0.0.1", v6)) == "2001:db8::1"   # canonical
    # a port after the address (some proxies write one) is not part of the client
    for hop, client in ((b"198.51.100.4:80", "198.51.100.4"),
                        (b"[2001:db8::5]:4711", "2001:db8::5"), (b"[2001:db8::5]", "2001:db8::5"),
                        (b"1.1.1.1, 198.51.100.4:80, 10.0.0.5:443", "198.51.100.4")):
        assert resolved(resolver, scope("127.0.0.1", (b"x-forwarded-for", hop))) == client
    # every hop trusted: the leftmost (a local request that came through the proxy)
    assert resolved(resolver, scope("127.0.0.1", (b"x-forwarded-for", b"10.0.0.1, 10.0.0.2"))) \
        == "10.0.0.1"
    # not an address: a client that is not known, never the proxy's (loopback) address
    for junk in (b"unknown", b"198.51.100.4, evil", b"", b",,", b"198.51.100.4:x",
                 b"[2001:db8::5]x", b"[::1", b"1.2.3.4:5:6", b"\xff\xfe", b"1" * 5000):
        assert resolved(resolver, scope("127.0.0.1", (b"x-forwarded-for", junk))) \
            == UNKNOWN_CLIENT, junk


def test_a_forwarded_address_is_believed_only_with_its_proof() -> None:
    resolver = ClientResolver(secret=lambda: SECRET)
    good = proof(SECRET, b"inst-b", b"198.51.100.9", b"POST", b"/session/s/prompt")
    headers = [(FORWARDED_BY_HEADER, b"inst-b"), (FORWARDED_FOR_HEADER, b"198.51.100.9"),
               (FORWARDED_PROOF_HEADER, good)]
    assert resolved(resolver, scope("10.0.0.2", *headers)) == "198.51.100.9"
    # the proof covers the instance, the address, the method and the path
    for changed in (scope("10.0.0.2", *headers, method="DELETE"),
                    scope("10.0.0.2", *headers, path="/session/other/prompt"),
                    scope("10.0.0.2", (FORWARDED_BY_HEADER, b"inst-c"), *headers[1:]),
                    scope("10.0.0.2", headers[0], (FORWARDED_FOR_HEADER, b"6.6.6.6"),
                          headers[2]),
                    scope("10.0.0.2", *headers[:2], (FORWARDED_PROOF_HEADER, b"0" * 64)),
                    scope("10.0.0.2", *headers[:2])):
        assert resolved(resolver, changed) == "10.0.0.2"
    assert resolved(ClientResolver(secret=lambda: None), scope("10.0.0.2", *headers)) \
        == "10.0.0.2"   # no secret (yet): nothing is believed
    wrong_key = ClientResolver(secret=lambda: b"other" * 8)
    assert resolved(wrong_key, scope("10.0.0.2", *headers)) == "10.0.0.2"


def test_bad_trusted_proxies_are_named() -> None:
    assert [str(n) for n in parse_networks(["127.0.0.1", " 10.0.0.0/8 ", "::1"])] == \
        ["127.0.0.1/32", "10.0.0.0/8", "::1/128"]
    with pytest.raises(ValueError, match="Invalid trusted-proxy: 'lb.internal'"):
        parse_networks(["lb.internal"])
    assert not ClientResolver().active
    assert ClientResolver(trusted=("::1",)).active
