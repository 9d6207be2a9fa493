"""What ``/daemon/status`` tells the operator while the store is down (a real
``acp-server serve``): it said ``"status": "ok"`` with no issues while every write
answered 503 and ``/health?deep=1`` said the store was down."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.harness import ServeProcess

pytestmark = pytest.mark.anyio


async def test_daemon_status_says_the_store_is_down_and_then_up_again(tmp_path: Path) -> None:
    async with ServeProcess(tmp_path) as daemon:
        client = daemon.client
        before = (await client.get("/daemon/status")).json()
        assert (before["status"], before["issues"]) == ("ok", [])

        db = Path(daemon.state_dir) / "lmsp.sqlite3"
        moved = db.with_name("elsewhere.sqlite3")
        os.rename(db, moved)   # the state folder's file gone from under the server
        refused = await client.post("/session", json={})
        assert refused.status_code == 503, refused.text

        during = await client.get("/daemon/status")
        assert during.status_code == 200   # a report, not a probe
        body = during.json()
        assert body["status"] == "degraded", body
        (issue,) = body["issues"]
        assert issue["code"] == "store_unavailable"
        assert "deleted or replaced" in issue["message"] and issue["since"].endswith("Z")

        os.rename(moved, db)   # the very same file back: the store resumes by itself
        assert (await client.get("/health", params={"deep": "1"})).status_code == 200
        after = (await client.get("/daemon/status")).json()
        assert (after["status"], after["issues"]) == ("ok", [])
