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
import time
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
from tests.store.test_segments_migration import _rewind

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


def _until(condition: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return value


def _prompt(text: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": text}]}


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
        before = {sid: _loaded(http, sid) for sid in sids}
    finally:
        assert child.stop() == 0
    with psycopg.connect(url, autocommit=True) as db:
        events = {sid: stored_events(db.execute, sid, "%s") for sid in sids}
    assert len(events[sids[0]]) > 300
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
            _until(lambda: _idle(http, sids[1]), "the prompt after the migration never ended")
        with psycopg.connect(url, autocommit=True) as db:
            ids = [e[0] for e in stored_events(db.execute, sids[1], "%s")]
        assert ids == list(range(1, ids[-1] + 1)) and ids[-1] > last   # on from the migrated
        assert "cannot start" in child.stderr_text()   # the outage was waited out, logged
    finally:
        child.stop()
