"""Two real ``acp-server serve`` instances on one PostgreSQL store, serving TLS with
certificates a private CA (made here) signed: a prompt sent to the instance that does
not run the session is forwarded to the one that does, over TLS.

* Both require client certificates of that CA (``--tls-client-ca``, no ``--fleet-ca``:
  the same CA is trusted for the peers), or ``--fleet-ca`` names it (no mutual TLS):
  the forward presents the instance's own certificate, verifies the owner's, and the
  client, talking only to the other instance, sees the answer.
* The peers do not trust each other (no ``--fleet-ca``, no ``--tls-client-ca``: the
  public CAs only): the prompt is a 503 ``owner_unreachable`` with ``Retry-After: 5``
  (REST's shape, sending it again is safe) and the log names the certificate problem.
* The owner requires client certificates and the forwarding instance's own lacks
  clientAuth: it warned at start, and the forward, refused in the handshake (after the
  request was written, in TLS 1.3), is ``owner_unreachable`` (never ``owner_lost``:
  the owner never read it), logged as a TLS refusal.

Synchronous tests (``httpx`` clients), so nothing depends on an anyio backend.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from acp_server.fleet.tls import client_auth_allowed, tls_failure
from tests.harness import ServeProcess
from tests.instances.fleet_certs import make_ca, needs_openssl, sign
from tests.lmsp import stores

pytestmark = needs_openssl


@pytest.fixture
def pg_url(tmp_path: Path) -> str:
    return stores.postgres_url_or_skip(tmp_path, "fleet-tls")


@contextmanager
def _pair(tmp_path: Path, url: str, a_flags: list[str], b_flags: list[str]
          ) -> Iterator[tuple[ServeProcess, ServeProcess]]:
    with ExitStack() as stack:
        a, b = (stack.enter_context(ServeProcess(tmp_path, "--store", url, *flags,
                                                 state_dir=f"state-{name}"))
                for name, flags in (("a", a_flags), ("b", b_flags)))
        assert a.base_url.startswith("https://127.0.0.1:"), a.listening
        yield a, b


def _client(child: ServeProcess, ca: list[Path], cert: tuple[Path, Path] | None
            ) -> httpx.Client:
    context = ssl.create_default_context()
    context.load_verify_locations(cadata="".join(path.read_text() for path in ca))
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    return httpx.Client(base_url=child.base_url, verify=context, timeout=20)


def _tls(cert: tuple[Path, Path]) -> list[str]:
    return ["--tls-cert", str(cert[0]), "--tls-key", str(cert[1])]


def _events_until_done(client: httpx.Client, sid: str, pid: str) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    with client.stream("GET", f"/session/{sid}/events",
                       headers={"Last-Event-ID": "0"}) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                seen.append(json.loads(line[len("data: "):]))
                if seen[-1]["type"] in ("turn_complete", "turn_error") \
                        and seen[-1].get("promptId") == pid:
                    return seen
    raise AssertionError(f"the stream ended before the turn: {seen}")


def _forwards(client: httpx.Client) -> dict[str, Any]:
    fleet = client.get("/daemon/status").json()["runtime"]["instances"]
    return {key: fleet[key] for key in ("forwards", "forwardFailures")}


def _wait_for(child: ServeProcess, text: str, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while text not in (log := child.stderr_text()):
        assert time.monotonic() < deadline, f"{text!r} not logged:\n{log[-3000:]}"
        time.sleep(0.02)
    return log


@pytest.mark.slow
@pytest.mark.parametrize("trust", ["tls-client-ca", "fleet-ca"])
def test_a_prompt_is_forwarded_to_the_owner_over_tls(tmp_path: Path, pg_url: str,
                                                     trust: str) -> None:
    ca = make_ca(tmp_path, "fleet")
    certs = {name: sign(tmp_path, ca, name) for name in ("a", "b", "client")}
    flag = "--tls-client-ca" if trust == "tls-client-ca" else "--fleet-ca"
    with _pair(tmp_path, pg_url, [*_tls(certs["a"]), flag, str(ca[0])],
               [*_tls(certs["b"]), flag, str(ca[0])]) as (a, b):
        mine = certs["client"] if trust == "tls-client-ca" else None
        with _client(a, [ca[0]], mine) as on_a, _client(b, [ca[0]], mine) as on_b:
            created = on_a.post("/session", json={"sessionScope": "thread"})
            assert created.status_code == 200, created.text
            sid = created.json()["sessionId"]
            accepted = on_b.post(f"/session/{sid}/prompt", json={
                "prompt": [{"type": "text", "text": "/chunks 2 over tls"}]})
            assert accepted.status_code == 202, (accepted.text, b.stderr_text()[-3000:])
            events = _events_until_done(on_b, sid, accepted.json()["promptId"])
            assert events[-1]["type"] == "turn_complete", events[-1]
            said = "".join(e["data"]["update"]["content"]["text"] for e in events
                           if e["type"] == "session_update" and e["data"]["update"]
                           ["sessionUpdate"] == "agent_message_chunk"
                           and e.get("promptId") == accepted.json()["promptId"])
            assert said == "Echo: over tls"
            assert _forwards(on_b) == {"forwards": 1, "forwardFailures": 0}
    assert "does not allow clientAuth" not in a.stderr_text() + b.stderr_text()


@pytest.mark.slow
def test_peers_that_do_not_trust_each_other_answer_owner_unreachable(
        tmp_path: Path, pg_url: str) -> None:
    ca = make_ca(tmp_path, "fleet")
    with _pair(tmp_path, pg_url, _tls(sign(tmp_path, ca, "a")),
               _tls(sign(tmp_path, ca, "b"))) as (a, b):
        with _client(a, [ca[0]], None) as on_a, _client(b, [ca[0]], None) as on_b:
            sid = on_a.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
            refused = on_b.post(f"/session/{sid}/prompt", json={
                "prompt": [{"type": "text", "text": "hello"}]})
            assert refused.status_code == 503, refused.text
            assert refused.json()["code"] == "owner_unreachable"
            assert refused.headers["retry-after"] == "5"
            log = _wait_for(b, "could not be forwarded to")
            line = next(x for x in log.splitlines() if "could not be forwarded to" in x)
            assert f"could not be forwarded to {a.base_url}: TLS: the owner's certificate " \
                   "is not trusted here: unable to get local issuer certificate " \
                   "(the CA it chains to goes in --fleet-ca" in line, line
            assert _forwards(on_b) == {"forwards": 1, "forwardFailures": 1}


@pytest.mark.slow
def test_a_client_certificate_the_owner_refuses_is_owner_unreachable_and_warned(
        tmp_path: Path, pg_url: str) -> None:
    ca = make_ca(tmp_path, "fleet")
    client = sign(tmp_path, ca, "client")
    server_only = sign(tmp_path, ca, "b", usage="serverAuth")   # no clientAuth
    common = ["--tls-client-ca", str(ca[0])]
    with _pair(tmp_path, pg_url, [*_tls(sign(tmp_path, ca, "a")), *common],
               [*_tls(server_only), *common]) as (a, b):
        assert f"--tls-cert {server_only[0]} does not allow clientAuth" in b.stderr_text()
        assert "does not allow clientAuth" not in a.stderr_text()
        with _client(a, [ca[0]], client) as on_a, _client(b, [ca[0]], client) as on_b:
            sid = on_a.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
            refused = on_b.post(f"/session/{sid}/prompt", json={
                "prompt": [{"type": "text", "text": "hello"}]})
            assert refused.status_code == 503, refused.text
            assert refused.json()["code"] == "owner_unreachable"   # never read: not lost
            log = _wait_for(b, "could not be forwarded to")
            line = next(x for x in log.splitlines() if "could not be forwarded to" in x)
            # granian (rustls) says why in an alert; uvicorn (asyncio's TLS) closes
            assert "TLS: the owner refused this instance in the TLS handshake" in line \
                or "TLS: the owner closed the TLS handshake without an alert" in line, line


# -- the pieces: acp_server.fleet.tls --------------------------------------------------------
def test_client_auth_is_read_from_the_extended_key_usage(tmp_path: Path) -> None:
    ca = make_ca(tmp_path, "fleet")
    for usage, allowed in (("serverAuth,clientAuth", True), ("serverAuth", False),
                           ("clientAuth", True), (None, True), ("anyExtendedKeyUsage", True),
                           ("serverAuth,codeSigning", False)):
        cert, _ = sign(tmp_path, ca, f"c{allowed}{len(usage or '')}", usage=usage)
        assert client_auth_allowed(str(cert)) is allowed, usage
    assert client_auth_allowed(str(ca[0]))   # a CA made by `openssl req -x509`: no EKU


def test_only_a_handshake_failure_is_a_tls_failure() -> None:
    def raised_from(cause: BaseException) -> BaseException:
        try:
            try:
                raise cause
            except BaseException as exc:
                raise httpx.ConnectError("wrapped") from exc
        except httpx.ConnectError as outer:
            return outer

    verify = ssl.SSLCertVerificationError(1, "certificate verify failed")
    verify.verify_message = "Hostname mismatch, certificate is not valid for 'x'"
    assert "not trusted here: Hostname mismatch" in str(tls_failure(raised_from(verify)))
    alert = ssl.SSLError(1, "[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca")
    alert.reason = "TLSV1_ALERT_UNKNOWN_CA"
    assert "refused this instance in the TLS handshake (tlsv1 alert unknown ca)" in str(
        tls_failure(raised_from(alert)))
    # the handshake closed without an alert (uvicorn's way of refusing a certificate)
    eof = ssl.SSLEOFError(8, "EOF occurred in violation of protocol")
    assert "closed the TLS handshake without an alert" in str(tls_failure(raised_from(eof)))
    # an owner that stopped once connected (perhaps after reading the request): not TLS
    try:
        raise httpx.ReadError("read") from eof
    except httpx.ReadError as read:
        assert tls_failure(read) is None
    assert tls_failure(raised_from(BrokenPipeError(32, "Broken pipe"))) is None
