"""TLS between the instances of a fleet: what a forward trusts and presents.

    context = peer_context(ca="fleet-ca.pem", cert="cert.pem", key="key.pem")
    Forwarder(..., ssl_context=context)
    tls_failure(exc)                 # "certificate verify failed: ..." or None
    client_auth_allowed("cert.pem")  # False: its extended key usage lacks clientAuth

Contracts:

* ``peer_context``: a client context (TLS 1.2 at least, ALPN ``http/1.1``, the peer's
  host name checked against its certificate) that trusts only the PEM CA bundle ``ca``
  (``--fleet-ca``, else ``--tls-client-ca``: the composition chooses), or, with none,
  the public CAs (certifi, as httpx does; no ``SSL_CERT_FILE``). With ``cert`` and
  ``key`` (this instance's own ``--tls-cert`` / ``--tls-key``) it presents them when a
  peer asks for a client certificate (a peer with ``--tls-client-ca``); a peer that
  asks nothing is sent nothing. ``mutual`` (the peers require client certificates:
  this instance has ``--tls-client-ca``) caps it at TLS 1.2, whose handshake ends only
  once the server accepted the client's certificate: a peer that refuses it fails the
  connection, before a byte of the request is written. (In TLS 1.3 the client writes
  as soon as it sent its certificate; the refusal then comes as a reset after the
  request, which looks like an owner that took it and died: ``owner_lost``.)
* ``tls_failure``: the TLS reason of a failed request, in a few words, when the
  exception or one it was raised from says the handshake failed: the peer's
  certificate not trusted here or not naming its host (``SSLCertVerificationError``),
  the peer refusing this one's by a handshake alert (``REFUSALS``), a peer that does
  not speak TLS, a peer that closed the handshake itself (an ``SSLEOFError`` while
  connecting: asyncio's TLS, uvicorn's, refuses a client certificate without an alert);
  ``None`` for any other failure (an ``SSLEOFError`` after the connection was made too:
  a peer that stopped, perhaps after it read the request). A peer that refuses the handshake
  never reads the request, whatever was written before its alert arrived (in TLS 1.3
  a client may write before the server has checked its certificate).
* ``client_auth_allowed``: whether the first certificate of a PEM file may be
  presented as a client certificate: it has no extended key usage, or one that lists
  clientAuth (or anyExtendedKeyUsage). The DER is read here (no X.509 library).
"""

from __future__ import annotations

import ssl

import certifi
import httpx

EKU_OID = bytes.fromhex("551d25")                   # 2.5.29.37
CLIENT_AUTH = bytes.fromhex("2b06010505070302")     # 1.3.6.1.5.5.7.3.2
ANY_EKU = bytes.fromhex("551d2500")                 # 2.5.29.37.0
# TLS alerts (OpenSSL's reasons) by which a server refuses a handshake: it read nothing
REFUSALS = ("CERTIFICATE", "UNKNOWN_CA", "HANDSHAKE_FAILURE", "ACCESS_DENIED",
            "DECRYPT_ERROR", "PROTOCOL_VERSION", "INSUFFICIENT_SECURITY")


def peer_context(*, ca: str | None, cert: str | None = None, key: str | None = None,
                 mutual: bool = False) -> ssl.SSLContext:
    """See the module docstring."""
    context = ssl.create_default_context(cafile=ca or certifi.where())
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if mutual:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    if cert is not None and key is not None:
        context.load_cert_chain(cert, key, password=lambda: b"")
    return context


def tls_failure(exc: BaseException) -> str | None:
    """See the module docstring."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            why = (getattr(current, "verify_message", None)
                   or getattr(current, "reason", None) or str(current))
            return (f"the owner's certificate is not trusted here: {why} (the CA it chains "
                    f"to goes in --fleet-ca; it must name the host of the owner's "
                    f"advertised URL)")
        if isinstance(current, ssl.SSLError):
            reason = str(getattr(current, "reason", None) or "")
            if "ALERT" in reason and any(word in reason for word in REFUSALS):
                return (f"the owner refused this instance in the TLS handshake "
                        f"({reason.lower().replace('_', ' ')}): its --tls-client-ca does "
                        f"not accept this instance's --tls-cert (another CA signed it, or its "
                        f"extended key usage lacks clientAuth), or none was presented")
            if reason == "WRONG_VERSION_NUMBER":
                return "the owner does not speak TLS at its advertised URL"
            if isinstance(current, ssl.SSLEOFError) and isinstance(exc, httpx.ConnectError):
                return ("the owner closed the TLS handshake without an alert: its "
                        "--tls-client-ca may not accept this instance's --tls-cert (another "
                        "CA signed it, or its extended key usage lacks clientAuth; uvicorn, "
                        "the default server, refuses a client certificate so), or it was at "
                        "its connection cap")
            return None   # an EOF, say: an owner that stopped, maybe after the request
        current = current.__cause__ or current.__context__
    return None


def client_auth_allowed(pem_path: str) -> bool:
    """See the module docstring."""
    with open(pem_path, encoding="ascii", errors="replace") as file:
        text = file.read()
    end = "-----END CERTIFICATE-----"
    first = text[text.index("-----BEGIN CERTIFICATE-----"):text.index(end) + len(end)]
    usages = _extended_key_usages(ssl.PEM_cert_to_DER_cert(first))
    return usages is None or CLIENT_AUTH in usages or ANY_EKU in usages


def _extended_key_usages(der: bytes) -> list[bytes] | None:
    """The OIDs (their DER values) of a certificate's extended key usage, ``None`` when
    it has none."""
    certificate = _children(der, 0, len(der))[0]
    tbs = _children(der, certificate[1], certificate[2])[0]
    for tag, start, end in _children(der, tbs[1], tbs[2]):
        if tag != 0xA3:   # [3] extensions
            continue
        extensions = _children(der, start, end)[0]
        for _, ext_start, ext_end in _children(der, extensions[1], extensions[2]):
            parts = _children(der, ext_start, ext_end)
            if der[parts[0][1]:parts[0][2]] == EKU_OID:
                value = parts[-1]   # OCTET STRING holding a SEQUENCE OF OID
                usages = _children(der, value[1], value[2])[0]
                return [der[s:e] for _, s, e in _children(der, usages[1], usages[2])]
    return None


def _children(der: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    """The DER elements between ``start`` and ``end``: (tag, content start, content end)."""
    found = []
    i = start
    while i < end:
        tag, length = der[i], der[i + 1]
        i += 2
        if length & 0x80:
            count = length & 0x7F
            length = int.from_bytes(der[i:i + count], "big")
            i += count
        found.append((tag, i, i + length))
        i += length
    return found


__all__ = ["client_auth_allowed", "peer_context", "tls_failure"]
