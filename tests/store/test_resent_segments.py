"""A commit that landed but whose answer was lost (a PostgreSQL connection dropped after
COMMIT: the outcome unknown) is sent again with the records that follow it: its
events then come in a longer segment holding the same first ids. The stored one it
covers is replaced, not kept beside it: no two segments of a session hold one id, and
the session's size (what the byte bound counts) counts each event once. On SQLite the
outcome is always known, but a retry that replaces nothing does no harm: the same
test runs on both stores (``store_name``), the fault staged by ``faults``. A prompt or
a session answered 503 whose record had in fact landed is undone by what the bridge
journals after the failure, so it does not come back at the next start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_server.store.sessions import StoreSessionJournal
from bridge.journal import PromptAccepted, SessionOpened
from tests.harness import local_server
from tests.store.faults import faulty
from tests.store.test_journal_bytes import _event
from tests.store.test_journal_trims import _opened
from tests.store.test_session_restart import _is, _prompt, read_events

pytestmark = pytest.mark.anyio


async def _segments(store: Any, store_name: str, sid: str) -> list[tuple[int, int, int]]:
    """Its stored segments' (first id, last id, size), in order, read through the store."""
    mark = "%s" if store_name == "postgres" else "?"
    rows = await store._read(lambda conn: conn.execute(
        f"SELECT first_id, last_id, size FROM session_segments WHERE session_id = {mark} "
        "AND last_id > 0 ORDER BY last_id", (sid,)).fetchall())
    return [(int(first), int(last), int(size)) for first, last, size in rows]


def _carries(journal: Any, kind: type) -> bool:
    """The journal's commit starting now carries a record of ``kind``."""
    return any(isinstance(record, kind) for _, record in journal._batch)


async def test_a_commit_sent_again_replaces_the_segment_it_covers(tmp_path: Path,
                                                                  store_name: str) -> None:
    store = faulty(tmp_path)
    async with store, StoreSessionJournal(store) as journal:
        journal.append(_opened("s"))
        events = [_event("s", n, 30) for n in range(1, 13)]
        for record in events[:5]:
            journal.append(record)
        await journal.wait(journal.appended)
        store.faults.land_then_fail()
        for record in events[5:10]:   # committed, its answer lost: sent again
            journal.append(record)
        with anyio.fail_after(30):
            while store.faults.refused_writes < 2:   # and its first retry failed too
                await anyio.sleep(0.01)
        for record in events[10:]:    # the retry after the outage carries these too
            journal.append(record)
        store.faults.off()
        with anyio.fail_after(30):
            await journal.wait(journal.appended)
        segments = await _segments(store, store_name, "s")
        read = await journal.read_after("s", 0, 100)
    assert [e[0] for e in read[2]] == list(range(1, 13))   # each event once, in order
    held = [n for first, last, _ in segments for n in range(first, last + 1)]
    assert sorted(held) == list(range(1, 13)), segments   # no id in two segments
    assert sum(size for _, _, size in segments) == sum(len(e.envelope) for e in events)


async def test_a_prompt_and_a_session_refused_though_their_commit_landed_stay_undone(
        tmp_path: Path, store_name: str) -> None:
    """The ambiguity the other way: a prompt's and a session's record landed, the answer
    lost, so both were answered 503. What the bridge journals to undo them (the prompt
    settled ``failed``, the session deleted) commits once the store is back: after a
    restart the refused prompt does not run and the refused session is not there."""
    async with local_server(tmp_path, lmsp_store=faulty(tmp_path, state_dir=tmp_path)) as srv:
        store: Any = srv.server.lmsp.store
        client = srv.client
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()[
            "sessionId"]
        journal: Any = srv.bridge.journal
        store.faults.land_then_fail(lambda: _carries(journal, PromptAccepted))
        refused = await client.post(f"/session/{sid}/prompt", json=_prompt("refused"))
        assert refused.status_code == 503, refused.text
        assert not store.faults.landing   # its batch is the one that landed
        store.faults.off()
        store.faults.land_then_fail(lambda: _carries(journal, SessionOpened))
        made = await client.post("/session", json={"sessionScope": "thread"})
        assert made.status_code == 503, made.text
        assert not store.faults.landing
        store.faults.off()
        kept = await client.post(f"/session/{sid}/prompt", json=_prompt("kept"))
        assert kept.status_code == 202, kept.text
        kept_id = kept.json()["promptId"]
        await read_events(client, sid, _is("turn_complete", kept_id), last_event_id=0)
    async with local_server(tmp_path, lmsp_store=faulty(tmp_path, state_dir=tmp_path)) as srv:
        assert [s.session_id for s in srv.bridge.list_sessions()] == [sid]
        assert srv.bridge.session_status(sid).pending_prompts == 0   # nothing readmitted
        loaded = (await srv.client.post(f"/session/{sid}/load", json={})).json()
        terminals = loaded["promptTerminals"]
        assert [t["terminal"] for t in terminals] == ["failed", "completed"], terminals
        assert terminals[0]["errorCode"] == "store_unavailable"
        assert terminals[1]["promptId"] == kept_id
        events = await read_events(srv.client, sid, _is("turn_complete", kept_id),
                                   last_event_id=0)
        ran = {e.get("promptId") for e in events if e["type"] == "turn_complete"}
        assert ran == {kept_id}   # the refused prompt never ran, before or after
