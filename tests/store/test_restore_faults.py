"""A session whose restore raises midway at start (``bridge.restore.restore_session``) is
all or nothing, on SQLite and on PostgreSQL, over real HTTP: the other sessions are
restored and serve prompts, the failed one is neither live nor listed, holds no slot,
and its journal is left as it was (what its restore had journaled by then, a running
prompt's ``server_restarted`` and an open permission's resolution, is not written), so
the next start restores it whole.

The fault: ``Session.readmit`` raises for one prompt of one session, after the restore
had registered the session and journaled its first changes (before the fix, the session
stayed live, listed and half-restored: a prompt queued behind the failed one never ran,
and the journal kept the changes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from acp_server.rest.workspace import workspace_id
from acp_server.store.postgres import PostgresTaskStore
from acp_server.store.sessions import StoreSessionJournal
from acp_server.store.sqlite import SqliteTaskStore
from bridge import events as ev
from bridge import wire
from bridge.events import Event
from bridge.journal import EventRecord, PromptAccepted, SessionOpened
from bridge.session import Session
from tests.harness import local_server
from tests.lmsp import stores
from tests.store.test_journal_refusals import _run_sql
from tests.store.test_session_journal import _settled
from tests.store.test_session_restart import _prompt

pytestmark = pytest.mark.anyio

BROKEN, FAULTY_PROMPT = "b-broken", "p-queued"


def _store(tmp_path: Path, store_name: str) -> tuple[Any, str | None]:
    """The test's store, the same instance at every open (PostgreSQL: its identity in
    the state dir, so each start restores the sessions the last one ran)."""
    if store_name == "postgres":
        url = stores.postgres_url_for(tmp_path, "restore")
        return PostgresTaskStore(url, lease_s=stores.TEST_LEASE_S, renew_s=stores.TEST_RENEW_S,
                                 poll_s=stores.TEST_POLL_S,
                                 state_dir=str(tmp_path / "state")), url
    (tmp_path / "state").mkdir(exist_ok=True)
    return SqliteTaskStore(str(tmp_path / "state" / "lmsp.sqlite3")), None


def _event(sid: str, event_id: int, kind: str, data: Any, pid: str | None = None
           ) -> EventRecord:
    event = Event(event_id, kind, data, prompt_id=pid, timestamp_ms=1000 + event_id)
    return EventRecord(session_id=sid, event_id=event_id, type=kind, prompt_id=pid,
                       envelope=wire.envelope(event))


async def _journal(tmp_path: Path, store_name: str) -> None:
    """Three sessions as a server killed mid-turn left them: ``a`` and ``c`` idle,
    ``BROKEN`` with a turn running (``p-running``), a permission it asked open, and a
    prompt queued behind it (``FAULTY_PROMPT``)."""
    store, _ = _store(tmp_path, store_name)
    async with store:
        async with StoreSessionJournal(store) as journal:
            for n, sid in enumerate(("a", BROKEN, "c")):
                journal.append(SessionOpened(session_id=sid, agent="reference",
                                             cwd=str(tmp_path), created_at=1.0 + n,
                                             epoch=f"e-{sid}"))
            for seq, pid in enumerate(("p-running", FAULTY_PROMPT), start=1):
                journal.append(PromptAccepted(
                    session_id=BROKEN, prompt_id=pid, queued_at_ms=1000 + seq, seq=seq,
                    prompt=[{"type": "text", "text": f"text of {pid}"}]))
                journal.append(_event(BROKEN, seq, ev.PENDING_PROMPT_ADDED,
                                      ev.PendingPromptAdded(session_id=BROKEN, prompt_id=pid,
                                                            text=f"text of {pid}",
                                                            queued_at=1000 + seq), pid))
            journal.append(_event(BROKEN, 3, ev.PENDING_PROMPT_STARTED, ev.PendingPromptStarted(
                session_id=BROKEN, prompt_id="p-running", text="text of p-running"),
                "p-running"))
            journal.append(_event(BROKEN, 4, ev.PERMISSION_REQUEST, ev.PermissionRequest(
                request_id="q1", session_id=BROKEN, params={"toolCall": {}})))
            await journal.wait(journal.appended)


def _rows(tmp_path: Path, store_name: str, url: str | None, sid: str) -> list[Any]:
    """Every journal row of ``sid`` (its record, prompts, events), as stored."""
    return [[tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
             for row in _run_sql(tmp_path, store_name, url, statement, (sid,))]
            for statement in (
                "SELECT record, closed_at, seed FROM sessions WHERE id = ?",
                "SELECT prompt_id, seq, record, terminal FROM session_prompts "
                "WHERE session_id = ? ORDER BY seq",
                "SELECT first_id, last_id, size, events FROM session_segments "
                "WHERE session_id = ? ORDER BY last_id")]


async def test_a_session_whose_restore_raises_midway_is_not_restored_at_all(
        tmp_path: Path, store_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    await _journal(tmp_path, store_name)
    store, url = _store(tmp_path, store_name)
    before = _rows(tmp_path, store_name, url, BROKEN)
    readmit = Session.readmit

    def faulty(session: Session, record: PromptAccepted) -> Any:
        if record.prompt_id == FAULTY_PROMPT:
            raise RuntimeError("a restore step failed")
        return readmit(session, record)

    monkeypatch.setattr(Session, "readmit", faulty)
    async with local_server(tmp_path, lmsp_store=store) as srv:
        bridge = srv.bridge
        assert bridge.restored == ["a", "c"]
        assert not bridge.has_session(BROKEN)
        assert sorted(s.session_id for s in bridge.list_sessions()) == ["a", "c"]
        assert bridge.capacity.taken == 2   # its slot was given back
        listed = await srv.client.get(f"/workspace/{workspace_id(str(tmp_path))}/sessions")
        assert listed.status_code == 200
        assert BROKEN not in [s["sessionId"] for s in listed.json()["sessions"]]
        prompted = await srv.client.post(f"/session/{BROKEN}/prompt", json=_prompt("hi"))
        assert prompted.status_code == 404, prompted.text   # never admitted here
        # nor made anew by a load (it would reset its events): refused, for this run (on
        # PostgreSQL its adoption is tried again, fails, and it is refused as busy)
        loaded = await srv.client.post(f"/session/{BROKEN}/load", json={})
        assert (loaded.status_code, loaded.json()["code"]) == (
            (503, "session_busy_elsewhere") if store_name == "postgres"
            else (409, "session_not_restorable")), loaded.text
        for sid in ("a", "c"):   # the others serve
            accepted = await srv.client.post(f"/session/{sid}/prompt", json=_prompt("hello"))
            assert accepted.status_code == 202, accepted.text
            await _settled(srv.client, sid, accepted.json()["promptId"])
        assert (await srv.client.get("/health")).status_code == 200
        await bridge.journal.wait(bridge.journal.appended)
        assert _rows(tmp_path, store_name, url, BROKEN) == before   # untouched
    monkeypatch.undo()
    store, url = _store(tmp_path, store_name)
    async with local_server(tmp_path, lmsp_store=store) as srv:   # the next start: whole
        assert srv.bridge.restored == ["a", BROKEN, "c"]
        session = srv.bridge.get_session(BROKEN)
        terminals = {t.prompt_id: t for t in session.prompt_terminals}
        assert terminals["p-running"].error_code == "server_restarted"
        await _settled(srv.client, BROKEN, FAULTY_PROMPT)   # the queued one runs
        events = await srv.client.post(f"/session/{BROKEN}/load", json={})
        resolved = [e for e in events.json()["compactedReplay"]
                    if e["type"] == "permission_resolved"]
        assert [e["data"]["reason"] for e in resolved] == ["server_restarted"]
