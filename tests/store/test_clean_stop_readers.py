"""A clean stop (SIGTERM) and the readers' cursors (issue #23: never a duplicate id).

The drain journals nothing of the shutdown (the sessions come back at the next start,
as after a crash), so it shows readers nothing of it either: a stream ends after its
last committed event, no prompt's end, no ``session_closed``. The next start numbers
the events on from there, under the same epoch: the reader resumes by cursor exactly
(the running prompt's ``server_restarted`` the next id), never holding an id the
restored session gives another event. A real ``acp-server serve`` on SQLite and on
PostgreSQL, with the reference agent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.harness import ServeProcess
from tests.store.crash_workload import Reader
from tests.store.test_session_restart import _flags, _is, _prompt, read_events

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only; the server is its own process


async def _status(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    response = await client.get(f"/session/{sid}/status")
    assert response.status_code == 200, response.text
    return response.json()


async def test_a_clean_stop_shows_readers_nothing_it_does_not_journal(
        tmp_path: Path, store_name: str) -> None:
    child = ServeProcess(tmp_path, *_flags(tmp_path, store_name)).start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=30) as client:
            sid = (await client.post("/session", json={"sessionScope": "thread"})
                   ).json()["sessionId"]
            reader = Reader(sid, "reader")   # from its first event, until its stream ends
            async with anyio.create_task_group() as tg:
                tg.start_soon(reader.run, client)
                running = (await client.post(f"/session/{sid}/prompt",
                                             json=_prompt("/sleep 60s long"))).json()["promptId"]
                queued = (await client.post(f"/session/{sid}/prompt",
                                            json=_prompt("after the restart"))).json()["promptId"]
                await reader.wait_for(lambda seen: any(
                    e["type"] == "pending_prompt_added" and e.get("promptId") == queued
                    for e in seen), "the queued prompt's pending_prompt_added")
                epoch = (await _status(client, sid))["eventEpoch"]
                assert await anyio.to_thread.run_sync(child.stop) == 0
            assert reader.statuses == [200] and reader.ended
            shown = [e for e in reader.seen if e.get("id") is not None]
            assert not [e for e in shown if e["type"] in ("session_closed", "turn_error",
                                                           "turn_complete")], shown
            last_seen = shown[-1]["id"]
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=30) as client:
            status = await _status(client, sid)
            assert status["eventEpoch"] == epoch
            resumed = await read_events(client, sid, _is("turn_complete", queued),
                                        last_event_id=last_seen, epoch=epoch)
            ids = [e["id"] for e in resumed if e.get("id") is not None]
            assert ids == list(range(last_seen + 1, last_seen + 1 + len(ids))), resumed
            assert "state_resync_required" not in [e["type"] for e in resumed]
            failed = next(e for e in resumed if e["type"] == "turn_error")
            assert failed["promptId"] == running and failed["id"] == last_seen + 1
            assert failed["data"]["code"] == "server_restarted"
            whole = await read_events(client, sid, _is("turn_complete", queued),
                                      last_event_id=0)
            assert [e for e in whole if e.get("id") is not None and e["id"] <= last_seen] \
                == shown   # what the reader saw is the session's, id for id
    finally:
        child.stop()
