"""``--trusted-proxy`` over real HTTP on every server we ship: ``X-Forwarded-For`` from a
trusted proxy names the client in the audit log and for the loopback rule; from any
other peer, or without the flag, it changes nothing (uvicorn's own proxy-header
handling is off, so all servers agree)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness import ServeProcess
from tests.http.test_servers import SERVERS, serving

pytestmark = pytest.mark.anyio
TOKEN = "proxy-test-s3cret-token"


async def _clients(daemon: ServeProcess, xff: str) -> dict[str, Any]:
    """Make a session and fail a credential, both with ``X-Forwarded-For: xff``; the
    audit records' clients, by action."""
    made = await daemon.client.post("/session", json={"sessionScope": "thread"},
                                    headers={"X-Forwarded-For": xff})
    assert made.status_code == 200, made.text
    refused = await daemon.client.get("/capabilities", headers={
        "X-Forwarded-For": xff, "Authorization": "Bearer wrong"})
    assert refused.status_code == 401
    records = (await daemon.client.get("/audit")).json()["records"]
    return {r["action"]: r["client"] for r in records
            if r["action"] in ("session.created", "auth.failed")}


@SERVERS
async def test_a_trusted_proxy_names_the_client(tmp_path: Path, server: str) -> None:
    async with ServeProcess(tmp_path, "--token", TOKEN, "--trusted-proxy", "127.0.0.0/8",
                            *serving(server)) as daemon:
        assert await _clients(daemon, "198.51.100.1, 203.0.113.7") == {
            "session.created": "203.0.113.7", "auth.failed": "203.0.113.7"}


@SERVERS
async def test_without_the_flag_the_header_changes_nothing(tmp_path: Path, server: str) -> None:
    async with ServeProcess(tmp_path, "--token", TOKEN, *serving(server)) as daemon:
        assert await _clients(daemon, "203.0.113.7") == {
            "session.created": "127.0.0.1", "auth.failed": "127.0.0.1"}


async def test_a_remote_client_behind_a_local_proxy_is_not_a_loopback_client(
        tmp_path: Path) -> None:
    """No token (trusted loopback mode) behind a proxy on this host: the proxy's
    clients are remote, so they are refused, as they would be without the proxy."""
    async with ServeProcess(tmp_path, "--trusted-proxy", "127.0.0.1") as daemon:
        remote = await daemon.client.get("/capabilities",
                                         headers={"X-Forwarded-For": "203.0.113.7"})
        assert remote.status_code == 403
        assert remote.json()["code"] == "forbidden"
        local = await daemon.client.get("/capabilities",
                                        headers={"X-Forwarded-For": "127.0.0.1"})
        assert local.status_code == 200
        # hops the proxy writes with a port, or not as an address: still remote (403)
        for hop in ("203.0.113.5:4711", "[2001:db8::5]:4711", "unknown",
                    "198.51.100.7, 203.0.113.5:4711"):
            told = await daemon.client.get("/whoami", headers={"X-Forwarded-For": hop})
            assert told.status_code == 403, (hop, told.text)


async def test_a_bad_trusted_proxy_is_refused_at_start(tmp_path: Path) -> None:
    daemon = ServeProcess(tmp_path, "--trusted-proxy", "lb.internal")
    with pytest.raises(AssertionError, match="Invalid trusted-proxy: 'lb.internal'"):
        daemon.start()


async def test_a_remote_client_guessing_the_token_is_throttled(tmp_path: Path) -> None:
    """Over real HTTP behind a trusted proxy: 20 wrong tokens from one remote address,
    then 429 ``too_many_failed_credentials`` with ``Retry-After`` in each door's shape,
    the right token included; another address and the proxy's own host are served."""
    async with ServeProcess(tmp_path, "--token", TOKEN, "--trusted-proxy", "127.0.0.1") \
            as daemon:
        guesser = {"X-Forwarded-For": "203.0.113.7"}
        for n in range(20):
            told = await daemon.client.get("/capabilities", headers={
                **guesser, "Authorization": f"Bearer guess-{n}"})
            assert told.status_code == 401, told.text
        rest = await daemon.client.get("/capabilities", headers=guesser)   # the right token
        assert rest.status_code == 429, rest.text
        assert rest.json()["code"] == "too_many_failed_credentials"
        assert int(rest.headers["retry-after"]) >= 1
        lmsp = await daemon.client.get("/lmsp/v1/tasks", headers=guesser)
        assert lmsp.status_code == 429 and lmsp.json()["code"] == "too_many_failed_credentials"
        acp = await daemon.client.post("/acp", headers=guesser, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}})
        assert acp.status_code == 429
        assert acp.json()["error"]["data"]["errorKind"] == "too_many_failed_credentials"
        other = await daemon.client.get("/capabilities",
                                        headers={"X-Forwarded-For": "198.51.100.1"})
        assert other.status_code == 200
        assert (await daemon.client.get("/capabilities")).status_code == 200   # the proxy's host
