"""Who the client is, behind a trusted proxy or another instance of the fleet.

    resolve = ClientResolver(trusted=("127.0.0.1", "10.0.0.0/8"), secret=lambda: key)
    resolve(scope)       # scope["client"] becomes the caller's own address, when known

The front layer calls it first, so everything after it (the loopback rule, the audit
log's ``client``, the sampling of failed credentials, the request log) sees the
caller's address, not a balancer's or a forwarding instance's. Contracts:

* ``X-Forwarded-For`` (every field joined, as RFC 7230 allows) counts only when the
  connection comes from a ``trusted`` address or network (``--trusted-proxy``): the
  client is its rightmost address that is not trusted itself (each hop appends the
  address it saw, so only what trusted hops appended is believed; ``IP:port`` and
  ``[IPv6]:port`` hops are read without their port), or its leftmost when every one
  is trusted. A hop that is not an address (``unknown``, a name, garbage) makes the
  client ``UNKNOWN_CLIENT``: never loopback, so a remote client behind a proxy on
  this host is not taken for a local one (fail closed).
  Without ``--trusted-proxy`` the header is ignored (uvicorn's own proxy-header
  handling is off: the same rule on every server).
* A request another instance forwarded (``acp_server.fleet.forward``) names the
  client that instance saw in ``FORWARDED_FOR_HEADER``, with ``FORWARDED_PROOF_HEADER``:
  ``proof(secret, …)`` over the forwarding instance's id, that address, the method and
  the path, keyed with the fleet's shared secret (``secret()``, from the store). It is
  believed only when the proof matches (compared in constant time); otherwise, and
  without a secret, it changes nothing.
* The port of a resolved client is 0 (unknown). Nothing here refuses a request.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Callable, Iterable
from typing import Any

FORWARDED_BY_HEADER = b"x-acp-forwarded-by"
FORWARDED_FOR_HEADER = b"x-acp-forwarded-for"
FORWARDED_PROOF_HEADER = b"x-acp-forwarded-proof"
XFF = b"x-forwarded-for"
MAX_HOPS = 32   # addresses of one X-Forwarded-For looked at, from the right
MEMO_KEPT = 4096
UNKNOWN_CLIENT = "unknown"   # a client a trusted proxy named with something not an address


def proof(secret: bytes, instance: bytes, client: bytes, method: bytes, path: bytes) -> bytes:
    """What a forwarding instance sends in ``FORWARDED_PROOF_HEADER`` (hex)."""
    message = b"\n".join((instance, client, method, path))
    return hmac.new(secret, message, hashlib.sha256).hexdigest().encode()


def parse_networks(entries: Iterable[str]) -> tuple[ipaddress.IPv4Network |
                                                    ipaddress.IPv6Network, ...]:
    """``--trusted-proxy`` values: addresses or networks (CIDR); ``ValueError`` names
    a bad one."""
    found = []
    for entry in entries:
        try:
            found.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise ValueError(f"Invalid trusted-proxy: {entry!r}. Must be an IP address or "
                             "a network (e.g. 10.0.0.0/8).") from None
    return tuple(found)


class ClientResolver:
    """See the module docstring."""

    def __init__(self, *, trusted: Iterable[str] = (),
                 secret: Callable[[], bytes | None] | None = None) -> None:
        self.networks = parse_networks(trusted)
        self.secret = secret
        self._trusted: dict[str, bool] = {}

    @property
    def active(self) -> bool:
        """Whether it can change anything (else the front layer skips it)."""
        return bool(self.networks) or self.secret is not None

    def trusts(self, address: str) -> bool:
        known = self._trusted.get(address)
        if known is None:
            try:
                ip = ipaddress.ip_address(address)
            except ValueError:
                known = False
            else:
                known = any(ip in network for network in self.networks)
            if len(self._trusted) < MEMO_KEPT:
                self._trusted[address] = known
        return known

    def __call__(self, scope: Any) -> None:
        client = scope.get("client")
        if not client:
            return
        xff = by = said = shown = None
        for name, value in scope["headers"]:
            if name == XFF:
                xff = value if xff is None else xff + b"," + value
            elif name == FORWARDED_BY_HEADER:
                by = value
            elif name == FORWARDED_FOR_HEADER:
                said = value
            elif name == FORWARDED_PROOF_HEADER:
                shown = value
        if said is not None and shown is not None and by is not None:
            address = self._forwarded(scope, by, said, shown)
            if address is not None:
                scope["client"] = (address, 0)
                return
        if xff is not None and self.networks and self.trusts(str(client[0])):
            address = self._rightmost_untrusted(xff)
            if address is not None:
                scope["client"] = (address, 0)

    def _forwarded(self, scope: Any, by: bytes, said: bytes, shown: bytes) -> str | None:
        secret = self.secret() if self.secret is not None else None
        if not secret:
            return None
        path = scope.get("raw_path") or scope["path"].encode()
        expected = proof(secret, by, said, scope.get("method", "GET").encode(), path)
        if not hmac.compare_digest(expected, shown):
            return None
        return _address(said.decode("latin-1"))

    def _rightmost_untrusted(self, xff: bytes) -> str | None:
        hops = xff.decode("latin-1").split(",")[-MAX_HOPS:]
        address = None
        for hop in reversed(hops):
            address = _address(hop.strip(), with_port=True)
            if address is None:
                return UNKNOWN_CLIENT   # not an address: a client, but not a known one
            if not self.trusts(address):
                return address
        return address   # every hop trusted: the leftmost


def _address(text: str, *, with_port: bool = False) -> str | None:
    """``text`` as a canonical IP address, or ``None``; ``with_port``: also
    ``IPv4:port``, ``[IPv6]`` and ``[IPv6]:port`` (what some proxies write)."""
    if with_port:
        if text.startswith("["):
            host, bracket, port = text[1:].partition("]")
            if not bracket or (port and not (port[0] == ":" and port[1:].isdigit())):
                return None
            text = host
        elif text.count(":") == 1:
            host, _, port = text.partition(":")
            if not port.isdigit():
                return None
            text = host
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None
