"""A prompt's terminal the store refuses for good, and the deletion that stands in for
it refused too (real triggers refusing both the UPDATE and the DELETE of the prompt's
row in ``session_prompts``): its row stays unsettled in the journal. A real
``acp-server serve`` process, killed (``SIGKILL``) and started again, on SQLite and on
PostgreSQL, under either ``--session-on-restart``:

* a prompt that completed does not run again, is not failed ``server_restarted``, and
  ``/load``'s ``promptTerminals`` still says ``completed``;
* a prompt removed while queued does not run after the restart either (its terminal
  stays ``cancelled``).

The journal has each one's end in its events (``turn_complete`` / ``turn_error``, written
in the commit before the terminal): the restore settles such a prompt from it, and
writes its terminal again (on the journal itself: the last test).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from acp_server.store.open_reads import TURN_ENDS
from acp_server.store.sessions import StoreSessionJournal
from bridge import events as ev
from bridge import wire
from bridge.events import Event
from bridge.journal import EventRecord, PromptAccepted, SessionOpened
from tests.harness import ServeProcess
from tests.store.test_journal_isolation import _store
from tests.store.test_journal_refusals import (
    MARK,
    _new_session,
    _refused_metric,
    _run_prompt,
    _run_sql,
)
from tests.store.test_session_restart import _flags, _ids, _is, _prompt, read_events
from tests.store.triggers import refuse_rows

pytestmark = pytest.mark.anyio


def refuse_settling(tmp_path: Path, store_name: str, url: str | None) -> None:
    """The store refuses every UPDATE and every DELETE of a prompt whose record holds
    ``MARK``: its terminal (the row it changes: a settled row keeps no body), and the
    deletion in its place."""
    postgres = store_name == "postgres"
    for event in ("UPDATE", "DELETE"):
        when = (f"position('{MARK}'::bytea IN OLD.record) > 0" if postgres
                else f"instr(OLD.record, CAST('{MARK}' AS BLOB)) > 0")
        refuse_rows(url=url if postgres else None,
                    sqlite_path=tmp_path / "state" / "lmsp.sqlite3",
                    name=f"refuse_prompt_{event.lower()}", table="session_prompts",
                    event=event, when=when)


async def _events_of(client: httpx.AsyncClient, sid: str, stop: Any) -> list[dict[str, Any]]:
    return await read_events(client, sid, stop, last_event_id=0)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the client side only
@pytest.mark.parametrize("policy", ["fail", "continue"])
async def test_a_settled_prompt_whose_terminal_is_refused_stays_settled_across_kill_9(
        tmp_path: Path, store_name: str, policy: str) -> None:
    flags = _flags(tmp_path, store_name)
    url = flags[flags.index("--store") + 1] if "--store" in flags else None
    child = ServeProcess(tmp_path, *flags, "--session-on-restart", policy).start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            sid = (await _new_session(client))["sessionId"]
            refuse_settling(tmp_path, store_name, url)
            done = await _run_prompt(client, sid, f"{MARK} done")
            done_id = done[-1]["promptId"]
            long = await client.post(f"/session/{sid}/prompt", json=_prompt("/sleep 30s long"))
            queued = await client.post(f"/session/{sid}/prompt", json=_prompt(f"{MARK} queued"))
            assert (long.status_code, queued.status_code) == (202, 202)
            long_id, queued_id = long.json()["promptId"], queued.json()["promptId"]
            await _events_of(client, sid, lambda e: e.get("promptId") == long_id
                             and e["type"] == "session_update")   # it runs: the other waits
            removed = await client.delete(f"/session/{sid}/pending-prompts/{queued_id}")
            assert removed.status_code < 300, removed.text
            await client.post(f"/session/{sid}/cancel")
            seen = await _events_of(client, sid, _is("turn_complete", long_id))
            ends = {e["promptId"]: e["data"]["stopReason"] for e in seen
                    if e["type"] == "turn_complete"}
            assert ends == {done_id: "end_turn", queued_id: "cancelled", long_id: "cancelled"}
            last = _ids(seen)[-1]
            metrics = (await client.get("/metrics")).text
            assert _refused_metric(metrics, "terminal") == 2   # both refused, ...
            assert child.returncode is None
        assert child.stderr_text().count("the store refused the prompt's deletion too") == 2
        child.kill()   # SIGKILL
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            status = (await client.get(f"/session/{sid}/status")).json()
            assert status["pendingPrompts"] == 0   # nothing to run again
            loaded = (await client.post(f"/session/{sid}/load", json={})).json()
            terminals = {t["promptId"]: (t["terminal"], t.get("errorCode"))
                         for t in loaded["promptTerminals"]}
            assert terminals[done_id] == ("completed", None)
            assert terminals[queued_id] == ("cancelled", None)
            assert terminals[long_id] == ("cancelled", None)
            # a prompt sent now runs next: nothing ran (or failed) before it
            after = await _run_prompt(client, sid, "after", after=last)
            assert _ids(after) == list(range(last + 1, last + 1 + len(_ids(after))))
            assert {e.get("promptId") for e in after if e.get("id")} == {after[-1]["promptId"]}
    finally:
        child.stop()


def _turn_event(sid: str, event_id: int, kind: str, data: Any, pid: str) -> EventRecord:
    event = Event(event_id, kind, data, prompt_id=pid, timestamp_ms=1000 + event_id)
    return EventRecord(session_id=sid, event_id=event_id, type=kind, prompt_id=pid,
                       envelope=wire.envelope(event))


async def test_the_restore_settles_a_prompt_from_its_end_and_writes_its_terminal(
        tmp_path: Path, store_name: str) -> None:
    """On the journal itself: rows with no terminal, the end in the events (as the
    refusals above leave them). A ``turn_error`` gives ``failed`` with its code, a
    ``turn_complete`` its stop reason; a prompt with no end stays unsettled (it runs, or
    fails as interrupted); the terminals found are written again."""
    assert TURN_ENDS == (ev.TURN_COMPLETE, ev.TURN_ERROR)   # the store names them itself
    store, url = _store(tmp_path, store_name)
    sid = "s"
    async with store:
        async with StoreSessionJournal(store) as journal:
            journal.append(SessionOpened(session_id=sid, agent="a", cwd="/", created_at=1.0,
                                         epoch="e"))
            for n, pid in enumerate(("failed", "done", "open"), start=1):
                journal.append(PromptAccepted(session_id=sid, prompt_id=pid, prompt=[],
                                              queued_at_ms=n, seq=n))
            journal.append(_turn_event(sid, 1, ev.TURN_ERROR, ev.TurnError(
                session_id=sid, message="boom", code="prompt_deadline_exceeded",
                prompt_id="failed"), "failed"))
            journal.append(_turn_event(sid, 2, ev.TURN_COMPLETE, ev.TurnComplete(
                session_id=sid, stop_reason="max_tokens", prompt_id="done"), "done"))
            await journal.wait(journal.appended)
        async with StoreSessionJournal(store) as journal:
            [found] = await journal.restore()
            await journal.wait(journal.appended)   # the terminals written again
    assert [(t.prompt_id, t.terminal, t.stop_reason, t.error_code, t.at)
            for t in found.terminals] == [
        ("failed", "failed", None, "prompt_deadline_exceeded", 1001),
        ("done", "completed", "max_tokens", None, 1002)]
    assert [p.prompt_id for p in found.unsettled] == ["open"]
    rows = _run_sql(tmp_path, store_name, url, "SELECT prompt_id FROM session_prompts "
                    "WHERE terminal IS NOT NULL ORDER BY prompt_id")
    assert [r[0] for r in rows] == ["done", "failed"]
