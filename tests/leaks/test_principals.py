"""Principals come and go (tokens minted, used, revoked); what the server keeps per
principal goes with them, or stays under a fixed bound.

    async with running_acp_server(tmp_path, token=BOOT, headers=bearer(BOOT)) as srv:
        ...   # N tokens, each attaching its default session, closing it, revoked
        assert len(srv.server.gate.sessions._defaults) <= DEFAULTS_SWEPT_FROM
"""

from __future__ import annotations

from pathlib import Path

import pytest

from acp_server.principals.ownership import DEFAULTS_SWEPT_FROM
from tests.acp_http.server import running_acp_server
from tests.principals.helpers import bearer

pytestmark = pytest.mark.anyio

BOOT = "boot-s3cret"
CYCLES = 200


async def test_revoked_principals_default_sessions_are_forgotten(tmp_path: Path) -> None:
    """Each token attaches its default ("single") session, closes it and is revoked:
    the principal's default is not remembered for ever (one per token ever minted)."""
    async with running_acp_server(tmp_path, token=BOOT, headers=bearer(BOOT)) as srv:
        owners = srv.server.gate.sessions
        for n in range(CYCLES):
            minted = await srv.client.post("/tokens", json={"name": f"ci-{n}",
                                                            "scopes": ["prompt", "read"]})
            assert minted.status_code == 201, minted.text
            headers = bearer(minted.json()["token"])
            attached = await srv.client.post("/session", json={}, headers=headers)
            assert attached.status_code == 200, attached.text
            sid = attached.json()["sessionId"]
            assert owners.default((f"ci-{n}", None)) == sid
            assert (await srv.client.delete(f"/session/{sid}", headers=headers)).status_code == 204
            assert (await srv.client.delete(f"/tokens/ci-{n}")).status_code in (200, 204)
        assert srv.bridge.stats().sessions == 0
        assert len(owners._defaults) <= DEFAULTS_SWEPT_FROM


async def test_live_defaults_are_kept_through_a_sweep(tmp_path: Path) -> None:
    """The sweep forgets defaults whose session is gone, never a live one: a principal
    whose default session still runs attaches to it again after many others came and
    went."""
    async with running_acp_server(tmp_path, token=BOOT, headers=bearer(BOOT)) as srv:
        keeper = (await srv.client.post("/tokens", json={"name": "keeper",
                                                         "scopes": ["prompt", "read"]})).json()
        mine = (await srv.client.post("/session", json={}, headers=bearer(keeper["token"])))
        sid = mine.json()["sessionId"]
        for n in range(2 * DEFAULTS_SWEPT_FROM):
            minted = (await srv.client.post("/tokens", json={"name": f"ci-{n}",
                                                             "scopes": ["prompt", "read"]})).json()
            other = await srv.client.post("/session", json={}, headers=bearer(minted["token"]))
            await srv.client.delete(f"/session/{other.json()['sessionId']}",
                                    headers=bearer(minted["token"]))
        again = await srv.client.post("/session", json={}, headers=bearer(keeper["token"]))
        assert again.json()["sessionId"] == sid
        assert again.json()["attached"] is True
