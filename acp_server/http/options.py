"""The HTTP layer's options: which server, TLS, and the caps on request heads.

    options = HttpOptions.from_flags(server="granian", tls_cert="c.pem", tls_key="k.pem",
                                     allow_host=["dev.box"], max_header_bytes="65536")
    options.tls        # True
    options.server     # "granian"

Contracts: ``HttpOptions(...)`` and ``from_flags`` raise ``ValueError`` with the message
the CLI prints before exiting 2: an unknown server, a certificate without its key (or
the reverse), a client CA without a certificate, a file that cannot be read, a
certificate, key, client CA or fleet CA that TLS cannot load (not PEM, a key of another
certificate, an encrypted key: no passphrase is asked), a cap that is not a positive
integer, or a malformed ``--allow-host``.

``peer_ca`` is the CA bundle this instance trusts for the other instances of its fleet
when it forwards to them (``acp_server.fleet.tls``): ``--fleet-ca``, else
``--tls-client-ca`` (a fleet whose instances require client certificates from that CA
present their own certificates to each other, so they chain to it), else ``None`` (the
public CAs).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterable
from dataclasses import dataclass

from acp_server.http.clients import parse_networks
from acp_server.http.policy import (
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_HEADERS,
    DEFAULT_MAX_REQUEST_LINE,
    split_host,
)

SERVERS = ("granian", "uvicorn")   # hypercorn runs only the tests' in-process server (trio)
DEFAULT_SERVER = "uvicorn"   # HTTP/1.1 and HTTP/2 in the event loop (docs/benchmarks.md)
GRANIAN_INTERFACES = ("asgi", "rsgi")   # rsgi: acp_server.http.rsgi (no stream back-pressure)
DEFAULT_GRANIAN_INTERFACE = "asgi"
GRANIAN_INTERFACE_ENV = "ACP_SERVER_GRANIAN_INTERFACE"   # the flag's default when set


@dataclass(frozen=True, slots=True)
class HttpOptions:
    server: str = DEFAULT_SERVER
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None    # mutual TLS: clients must show a certificate it signed
    fleet_ca: str | None = None         # the other instances' certificates chain to it
    require_tls: bool = False           # refuse to start on a non-loopback bind without TLS
    allow_hosts: tuple[str, ...] = ()
    trusted_proxies: tuple[str, ...] = ()   # X-Forwarded-For believed from these
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_headers: int = DEFAULT_MAX_HEADERS
    max_request_line: int = DEFAULT_MAX_REQUEST_LINE
    granian_interface: str = DEFAULT_GRANIAN_INTERFACE

    def __post_init__(self) -> None:
        if self.server not in SERVERS:
            raise ValueError(f"Invalid http-server: {self.server!r}. Must be one of "
                             f"{', '.join(SERVERS)}.")
        if self.granian_interface not in GRANIAN_INTERFACES:
            raise ValueError(f"Invalid granian-interface: {self.granian_interface!r}. Must be "
                             f"one of {', '.join(GRANIAN_INTERFACES)}.")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together: pass both or neither.")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key.")
        for flag, path in (("tls-cert", self.tls_cert), ("tls-key", self.tls_key),
                           ("tls-client-ca", self.tls_client_ca),
                           ("fleet-ca", self.fleet_ca)):
            if path is not None and not (os.path.isfile(path) and os.access(path, os.R_OK)):
                raise ValueError(f"Invalid {flag}: {path!r}. Must be a readable PEM file.")
        if self.tls_cert is not None and self.tls_key is not None:
            _check_tls(self.tls_cert, self.tls_key, self.tls_client_ca)
        if self.fleet_ca is not None:
            _check_ca("fleet-ca", self.fleet_ca)
        for name, flag in (("max_header_bytes", "max-header-bytes"),
                           ("max_headers", "max-headers"),
                           ("max_request_line", "max-request-line-bytes")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Invalid {flag}: {value!r}. Must be a positive integer.")
        parse_networks(self.trusted_proxies)   # ValueError names a bad one
        for host in self.allow_hosts:
            if not host or split_host(host) is None or "/" in host:
                raise ValueError(f"Invalid allow-host: {host!r}. Must be a host name or "
                                 "address, optionally with :port (e.g. dev.box:4170).")

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def peer_ca(self) -> str | None:
        """See the module docstring."""
        return self.fleet_ca or self.tls_client_ca

    @classmethod
    def from_flags(cls, *, server: str = DEFAULT_SERVER, tls_cert: str | None = None,
                   tls_key: str | None = None, tls_client_ca: str | None = None,
                   fleet_ca: str | None = None, require_tls: bool = False,
                   allow_host: Iterable[str] = (),
                   trusted_proxy: Iterable[str] = (),
                   max_header_bytes: str | int = DEFAULT_MAX_HEADER_BYTES,
                   max_headers: str | int = DEFAULT_MAX_HEADERS,
                   max_request_line: str | int = DEFAULT_MAX_REQUEST_LINE,
                   granian_interface: str = DEFAULT_GRANIAN_INTERFACE) -> HttpOptions:
        return cls(server=server, tls_cert=tls_cert, tls_key=tls_key,
                   tls_client_ca=tls_client_ca, fleet_ca=fleet_ca, require_tls=require_tls,
                   allow_hosts=tuple(h.strip().lower() for h in allow_host),
                   trusted_proxies=tuple(t.strip() for t in trusted_proxy),
                   max_header_bytes=_int(max_header_bytes), max_headers=_int(max_headers),
                   max_request_line=_int(max_request_line),
                   granian_interface=granian_interface)


def _check_tls(cert: str, key: str, client_ca: str | None) -> None:
    """The files loaded as the server will load them, so that a bad one is one line at
    start-up rather than a traceback once the store is open."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # an encrypted key would make OpenSSL ask for a passphrase on the terminal
        context.load_cert_chain(cert, key, password=lambda: b"")
    except (ssl.SSLError, OSError) as exc:
        why = _pem_problem(cert, key) or _ssl_reason(exc)
        raise ValueError(f"Invalid tls-cert / tls-key: TLS cannot load {cert!r} with "
                         f"{key!r}: {why}. Pass a PEM certificate chain and its unencrypted "
                         "PEM private key.") from None
    if client_ca is not None:
        _check_ca("tls-client-ca", client_ca)


def _check_ca(flag: str, path: str) -> None:
    """A bundle of PEM CA certificates TLS can load, else ``ValueError``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=path)
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"Invalid {flag}: {path!r}: TLS cannot load it "
                         f"({_ssl_reason(exc)}). Pass a file of PEM CA certificates."
                         ) from None


def _pem_problem(cert: str, key: str) -> str | None:
    """Which file is wrong, when its text says so."""
    def text(path: str) -> str:
        with open(path, "rb") as file:
            return file.read(1 << 20).decode("ascii", "replace")
    try:
        cert_text, key_text = text(cert), text(key)
    except OSError:
        return None
    if "-----BEGIN CERTIFICATE-----" not in cert_text:
        return f"{cert!r} holds no PEM certificate"
    if "ENCRYPTED" in key_text:
        return f"{key!r} is encrypted (no passphrase is asked: decrypt it with `openssl pkey`)"
    if "PRIVATE KEY-----" not in key_text:
        return f"{key!r} holds no PEM private key"
    return None


def _ssl_reason(exc: ssl.SSLError | OSError) -> str:
    reason = getattr(exc, "reason", None)
    if reason == "KEY_VALUES_MISMATCH":
        return "the key is another certificate's"
    if reason:
        return str(reason).lower().replace("_", " ")
    return exc.strerror or str(exc)


def _int(value: str | int) -> int | str:
    if isinstance(value, int):
        return value
    try:
        return int(value)
    except ValueError:
        return value   # named by the validator's message


__all__ = ["DEFAULT_GRANIAN_INTERFACE", "DEFAULT_SERVER", "GRANIAN_INTERFACES", "GRANIAN_INTERFACE_ENV",
           "SERVERS",
           "HttpOptions"]
