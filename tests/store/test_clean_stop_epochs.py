"""A clean stop (SIGTERM) and the readers' cursors (issue #23: never a duplicate id).

The drain publishes each prompt's end and ``session_closed`` to the readers it ends,
and journals none of it (the sessions come back at the next start, as after a crash),
so the next start numbers the sessions' events on from the last committed. A session
someone read at the stop comes back under a new epoch: its reader, resuming with the
ids it saw, gets ``state_resync_required`` (``epoch_reset``) and the ring, never a
restored event under an id it already holds with other contents. A session nobody
read keeps its epoch and resumes by cursor exactly, as after ``kill -9``. A real
``acp-server serve`` on SQLite and on PostgreSQL, with the reference agent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.harness import ServeProcess
from tests.store.test_session_restart import _flags, _is, _prompt, read_events

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only; the server is its own process


class Reader:
    """One SSE reader of a session from its first event, until its stream ends."""

    def __init__(self, client: httpx.AsyncClient, sid: str) -> None:
        self.client, self.sid = client, sid
        self.seen: list[dict[str, Any]] = []
        self.changed = anyio.Event()

    async def run(self) -> None:
        async with self.client.stream("GET", f"/session/{self.sid}/events",
                                      headers={"Last-Event-ID": "0"}) as response:
            assert response.status_code == 200
            try:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        self.seen.append(json.loads(line[len("data: "):]))
                        self.changed.set()
                        self.changed = anyio.Event()
            except httpx.RemoteProtocolError:
                pass   # the server went away mid-stream: what it sent is kept

    async def until(self, match: Any) -> None:
        with anyio.fail_after(30):
            while not any(match(e) for e in self.seen):
                await self.changed.wait()


async def _status(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    response = await client.get(f"/session/{sid}/status")
    assert response.status_code == 200, response.text
    return response.json()


async def test_a_clean_stop_gives_read_sessions_a_new_epoch_and_no_id_twice(
        tmp_path: Path, store_name: str) -> None:
    child = ServeProcess(tmp_path, *_flags(tmp_path, store_name)).start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=30) as client:
            read = (await client.post("/session", json={"sessionScope": "thread"})).json()
            quiet = (await client.post("/session", json={"sessionScope": "thread"})).json()
            done = (await client.post(f"/session/{quiet['sessionId']}/prompt",
                                      json=_prompt("hello"))).json()["promptId"]
            before = await read_events(client, quiet["sessionId"], _is("turn_complete", done),
                                       last_event_id=0)
            reader = Reader(client, read["sessionId"])
            async with anyio.create_task_group() as tg:
                tg.start_soon(reader.run)
                running = (await client.post(f"/session/{read['sessionId']}/prompt",
                                             json=_prompt("/sleep 60s long"))).json()["promptId"]
                await reader.until(lambda e: e.get("promptId") == running)   # its echo
                read_epoch = (await _status(client, read["sessionId"]))["eventEpoch"]
                quiet_status = await _status(client, quiet["sessionId"])
                assert await anyio.to_thread.run_sync(child.stop) == 0
            # the drain ended the stream with events the journal does not hold
            shown = [e for e in reader.seen if e.get("id") is not None]
            assert [e["type"] for e in shown][-1] == "session_closed", shown
            assert any(e["type"] == "turn_error" and e.get("promptId") == running
                       for e in shown), shown
            last_seen = shown[-1]["id"]
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=30) as client:
            status = await _status(client, read["sessionId"])
            assert status["eventEpoch"] != read_epoch   # restored under a new epoch
            resumed = await read_events(
                client, read["sessionId"], lambda e: e["type"] == "replay_complete",
                last_event_id=last_seen, epoch=read_epoch)
            assert resumed[0]["type"] == "state_resync_required", resumed
            assert resumed[0]["data"]["reason"] == "epoch_reset", resumed
            again = await _status(client, quiet["sessionId"])
            assert again["eventEpoch"] == quiet_status["eventEpoch"]   # nobody read it
            assert again["lastEventId"] == quiet_status["lastEventId"] == before[-1]["id"]
            exact = await read_events(
                client, quiet["sessionId"], lambda e: e["type"] == "replay_complete",
                last_event_id=before[-1]["id"], epoch=quiet_status["eventEpoch"])
            assert [e["type"] for e in exact] == ["replay_complete"], exact
    finally:
        child.stop()

