"""Ids a client sends that no store column holds (a NUL) name nothing, on every store:
the door's 404, never a 503 ``store_unavailable`` nor a 500 (real HTTP on loopback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lmsp.server import running_lmsp

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("raw_id", ["%00", "a%00b"])
async def test_a_session_id_with_a_nul_is_not_found(tmp_path: Path, store_name: str,
                                                    raw_id: str) -> None:
    # On PostgreSQL the session's lease was looked up with the id (psycopg refuses a NUL
    # in TEXT): the REST door answered 503 store_unavailable, and logged a warning.
    async with running_lmsp(tmp_path) as srv:
        for method, path, body in [
                ("DELETE", f"/session/{raw_id}", None),
                ("GET", f"/session/{raw_id}/events", None),
                ("POST", f"/session/{raw_id}/prompt",
                 {"prompt": [{"type": "text", "text": "x"}]})]:
            response = await srv.client.request(method, path, json=body)
            assert response.status_code == 404, (method, path, response.text)
            assert response.json()["code"] == "session_not_found"
        assert (await srv.client.get("/health?deep=1")).json()["status"] == "ok"
