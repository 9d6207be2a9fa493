"""Another principal's session and an unknown id cost the same work to refuse: the
404 of one must not be told from the other's by what the server did (no timings here:
the store reads each made are compared)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.acp_http.server import request, running_acp_server
from tests.principals.helpers import bearer, mint

pytestmark = pytest.mark.anyio
BOOT = "boot-s3cret"


async def test_another_principals_id_reads_the_store_as_an_unknown_id_does(
        tmp_path: Path) -> None:
    """Security pass: ``/load``, ``/resume``, ``POST /session`` naming an id and
    ``DELETE /session/{id}`` (and ``/acp`` ``session/load``) read the journal's record
    of an id they do not know (its maker may have been forgotten), but answered 404 for
    another principal's live or remembered session with no store read at all: the work
    done told "someone's" from "nobody's". Now the record is read for both, once, before
    the 404; an unknown id's check makes that same read first."""
    async with running_acp_server(tmp_path, token=BOOT, headers=bearer(BOOT)) as srv:
        c, bridge = srv.client, srv.server.bridge
        alice = bearer(await mint(srv.server, "alice"))
        mallory = bearer(await mint(srv.server, "mallory", unlimited=True))
        live = (await c.post("/session", json={"sessionScope": "thread"},
                             headers=alice)).json()["sessionId"]
        closed = (await c.post("/session", json={"sessionScope": "thread"},
                               headers=alice)).json()["sessionId"]
        await bridge.close_session(closed, reason="idle")   # kept, its maker remembered
        reads: list[str] = []
        read = bridge.journal.record_of

        async def counted(session_id: str) -> Any:
            reads.append(session_id)
            return await read(session_id)

        bridge.journal.record_of = counted   # type: ignore[method-assign]
        routes: list[tuple[str, str, Any]] = [
            ("POST", "/session/{}/load", {}), ("POST", "/session/{}/resume", {}),
            ("POST", "/session", {"sessionId": "{}"}), ("DELETE", "/session/{}", None)]
        for method, path, body in routes:
            for sid in (live, closed):
                reads.clear()
                answer = await c.request(
                    method, path.format(sid), headers=mallory,
                    json={k: v.format(sid) for k, v in body.items()} if body is not None
                    else None)
                assert (answer.status_code, answer.json()["code"]) == (
                    404, "session_not_found"), (method, path, answer.text)
                assert reads == [sid], (method, path, sid == live, reads)
            unknown = str(uuid.uuid4())
            reads.clear()
            await c.request(method, path.format(unknown), headers=mallory,
                            json={k: v.format(unknown) for k, v in body.items()}
                            if body is not None else None)
            assert reads[:1] == [unknown], (method, path, reads)
        conn, _ = await srv.initialize(**mallory)
        async with srv.stream(conn, **mallory) as stream:
            for rpc_id, sid in enumerate((live, closed), start=1):
                reads.clear()
                sent = await srv.post(conn, request(rpc_id, "session/load", {
                    "sessionId": sid, "cwd": srv.workspace, "mcpServers": []}), **mallory)
                assert sent.status_code == 202
                with anyio.fail_after(10):
                    reply = await stream.wait_for_id(rpc_id)
                assert reply["error"]["code"] == -32602, reply
                assert reads == [sid], (sid == live, reads)
        assert bridge.has_session(live) and not bridge.has_session(closed)
