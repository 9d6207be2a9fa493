"""Migration 8 through a real PostgreSQL outage: a real ``acp-server serve`` starts on a
store the version before segment rows wrote (schema 7: ``session_events``, one row an
event), and PostgreSQL is stopped while the migration is in the middle (every event
copied into ``session_segments``, ``session_events`` not yet dropped, nothing
committed). The server does not end: it answers 503 while the store is down, tries
again, and once PostgreSQL is back migrates the store whole, by itself, with no loss:
the same events (ids, types, prompt ids, envelopes), the same epochs, last ids and
terminals, and the ids go on from the migrated ones.

The pause is deterministic: a real event trigger of the throwaway cluster, on the drop
of ``session_events``, waits for an advisory lock the test holds; the test stops
PostgreSQL once the migration's connection waits there.
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.harness import ServeProcess
from tests.lmsp import stores
from tests.store.segment_rows import stored_events
from tests.store.test_durable_start_outage import _pg
from tests.store.test_outage_processes import own_cluster  # noqa: F401 (the fixture)
from tests.store.test_pg_locked_tables import _until
from tests.store.test_segments_migration import _rewind
from tests.store.test_session_restart import _prompt

PAUSE_LOCK = 424242
PAUSE = f"""
CREATE FUNCTION migration_pause() RETURNS event_trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_event_trigger_dropped_objects()
             WHERE object_type = 'table' AND object_name = 'session_events') THEN
    PERFORM pg_advisory_xact_lock({PAUSE_LOCK});
  END IF;
END $$;
CREATE EVENT TRIGGER migration_pause ON sql_drop EXECUTE FUNCTION migration_pause();
"""


def _idle(http: httpx.Client, sid: str) -> bool:
    status = http.get(f"/session/{sid}/status").json()
    return status.get("activePromptId") is None and not status.get("pendingPrompts")


def _loaded(http: httpx.Client, sid: str) -> dict[str, Any]:
    """What a client reloading ``sid`` gets that the migration must keep."""
    answer = http.post(f"/session/{sid}/load", json={})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    return {"lastEventId": body["lastEventId"], "eventEpoch": body.get("eventEpoch"),
            "terminals": [(t["promptId"], t["terminal"]) for t in body["promptTerminals"]]}


def _ended_after(url: str, sid: str, last: int) -> list[int]:
    """The session's stored event ids once a turn ended past event ``last`` (its
    ``turn_complete`` committed), else none."""
    with psycopg.connect(url, autocommit=True) as db:
        stored = stored_events(db.execute, sid, "%s")
    ended = any(e[1] == "turn_complete" and e[0] > last for e in stored)
    return [e[0] for e in stored] if ended else []


def _waiting_on_pause(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as db:
        return db.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND objid = %s", (PAUSE_LOCK,)).fetchone()[0] > 0


def test_postgresql_stopped_in_the_middle_of_migration_8(
        tmp_path: Path, own_cluster: Path) -> None:  # noqa: F811 (the fixture)
    url = os.environ["_ACP_OWN_PG"]
    port = urllib.parse.urlsplit(url).port
    flags = ("--store", url, *stores.lease_flags())
    child = ServeProcess(tmp_path, *flags).start()
    try:   # a store with sessions, prompts and a few hundred events
        http = child.http
        sids = [http.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
                for _ in range(2)]
        for text in ("/chunks 300 many", "/chunks 2 after"):
            assert http.post(f"/session/{sids[0]}/prompt", json=_prompt(text)).status_code == 202
        assert http.post(f"/session/{sids[1]}/prompt", json=_prompt("one")).status_code == 202
        for sid in sids:
            _until(lambda sid=sid: _idle(http, sid), "the prompts never ended")
    finally:
        assert child.stop() == 0   # a clean stop: what it journaled is committed
    # what a restart on schema 8 restores (an idle session's status is settled before
    # its last commit lands: read back from the store, not from the live session)
    child.start()
    try:
        with httpx.Client(base_url=child.base_url, timeout=30) as http:   # (its new port)
            before = {sid: _loaded(http, sid) for sid in sids}
    finally:
        assert child.stop() == 0
    with psycopg.connect(url, autocommit=True) as db:
        events = {sid: stored_events(db.execute, sid, "%s") for sid in sids}
    assert len(events[sids[0]]) > 300
    assert [[t for _, t in before[sid]["terminals"]] for sid in sids] == [
        ["completed", "completed"], ["completed"]]   # every prompt ran before the stop
    _rewind(tmp_path, "postgres", url)   # schema 7, as the version before wrote it

    try:
        with psycopg.connect(url, autocommit=True) as db:
            db.execute(PAUSE)
            db.execute("SELECT pg_advisory_lock(%s)", (PAUSE_LOCK,))   # the pause holds
            child.spawn()   # the same state dir: the same instance, its sessions restored
            _until(lambda: _waiting_on_pause(url), "the migration never reached the drop")
            copied = db.execute("SELECT count(*) FROM session_events").fetchone()[0]
            assert copied == sum(len(e) for e in events.values())   # nothing committed yet
            _pg("stop", own_cluster)   # the migration's transaction dies with the server
        assert child.returncode is None   # no crash: the start is tried again
        _pg("start", own_cluster, port)
        child.wait_listening()   # migrated (the pause's lock is free now), then served
        with httpx.Client(base_url=child.base_url, timeout=30) as http:   # (its new port)
            assert {sid: _loaded(http, sid) for sid in sids} == before
            with psycopg.connect(url, autocommit=True) as db:
                assert {sid: stored_events(db.execute, sid, "%s") for sid in sids} == events
                assert db.execute("SELECT max(version) FROM schema_version").fetchone()[0] == 8
                assert db.execute("SELECT to_regclass('session_events')").fetchone()[0] is None
            last = before[sids[1]]["lastEventId"]
            assert http.post(f"/session/{sids[1]}/prompt",
                             json=_prompt("on")).status_code == 202
        ids = _until(lambda: _ended_after(url, sids[1], last),
                     "the prompt after the migration never ended")
        assert ids == list(range(1, ids[-1] + 1)) and ids[-1] > last   # on from the migrated
        assert "cannot start" in child.stderr_text()   # the outage was waited out, logged
    finally:
        child.stop()
