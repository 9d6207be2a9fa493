"""A session journal record the store refuses every time (a real trigger in the test's
SQLite or PostgreSQL database) neither stalls the journal nor is retried for ever: the
commit is isolated, the record fails alone, everything else commits.

* A refused event reaches its readers (no silent gap), the other sessions' events and
  prompts keep committing (read back after a restart), the session comes back under a
  new epoch, the counter and ``/health?deep=1`` show it, and the log line is not
  repeated (the retry loop ended). Also when the refused event is the session's last
  one (no id gap to find at restore: the stored record's epoch changed).
* A refused ``PromptAccepted`` is a 503 in REST's shape that releases the slot once; the
  next prompt to the session works.
* A refused terminal deletes its prompt from the journal (the next start neither runs
  it again nor fails it as interrupted).
* The same through a real ``acp-server serve`` process, killed and started again.
"""

from __future__ import annotations

import logging
import re
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from bridge import BridgeOptions
from bridge.journal import SessionOpened
from tests.harness import ServeProcess, local_server
from tests.lmsp import stores
from tests.store.segment_rows import stored_events
from tests.store.test_session_restart import _flags, _ids, _is, _prompt, read_events
from tests.store.triggers import REASON, refuse_rows

pytestmark = pytest.mark.anyio

MARK = "POISON"
LOGGER = "acp_server.store.sessions"


def _settings(tmp_path: Path, store_name: str) -> dict[str, Any]:
    if store_name == "postgres":
        return {"store": stores.postgres_url_for(tmp_path, "journal")}
    return {}


def _sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "lmsp.sqlite3"


def _run_sql(tmp_path: Path, store_name: str, url: str | None, statement: str,
             params: tuple[Any, ...] = ()) -> list[Any]:
    """One statement on the test's database (autocommit); its rows, if any."""
    if store_name == "postgres":
        import psycopg

        assert url is not None
        with psycopg.connect(url, autocommit=True) as conn:
            cursor = conn.execute(statement.replace("?", "%s"), params)
            return cursor.fetchall() if cursor.description else []
    with sqlite3.connect(_sqlite_path(tmp_path)) as db:
        return db.execute(statement, params).fetchall()


def poison(tmp_path: Path, store_name: str, url: str | None, table: str,
           column: str | None, *, when: str = "", event: str = "INSERT",
           errcode: str = "P0001", row: str = "NEW") -> None:
    """A real trigger: every ``event`` on ``table`` whose ``column`` holds ``MARK``
    (``None``: any; in the ``row`` it writes, or ``OLD``: the one it changes) and that
    meets ``when`` (SQL on NEW) is refused by the database."""
    postgres = store_name == "postgres"
    conditions = [when] if when else []
    if column is not None:
        conditions.append(f"position('{MARK}'::bytea IN {row}.{column}) > 0" if postgres
                          else f"instr({row}.{column}, CAST('{MARK}' AS BLOB)) > 0")
    refuse_rows(url=url if postgres else None, sqlite_path=_sqlite_path(tmp_path),
                name=f"poison_{table}", table=table, event=event,
                when=" AND ".join(conditions) or "TRUE", errcode=errcode)


def stored_epoch(tmp_path: Path, store_name: str, url: str | None, sid: str) -> str:
    rows = _run_sql(tmp_path, store_name, url, "SELECT record FROM sessions WHERE id = ?",
                    (sid,))
    return msgspec.msgpack.decode(bytes(rows[0][0]), type=SessionOpened).epoch


async def _new_session(client: httpx.AsyncClient) -> dict[str, Any]:
    created = await client.post("/session", json={"sessionScope": "thread"})
    assert created.status_code == 200, created.text
    return created.json()


async def _run_prompt(client: httpx.AsyncClient, sid: str, text: str,
                      after: int = 0) -> list[dict[str, Any]]:
    accepted = await client.post(f"/session/{sid}/prompt", json=_prompt(text))
    assert accepted.status_code == 202, accepted.text
    return await read_events(client, sid, _is("turn_complete", accepted.json()["promptId"]),
                             last_event_id=after)


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(1 for r in caplog.records if r.name == LOGGER and text in r.getMessage())


def _refused_metric(body: str, kind: str) -> float:
    found = re.search(rf'^acp_server_journal_records_refused_total{{kind="{kind}"}} (\S+)$',
                      body, re.M)
    assert found is not None, body
    return float(found.group(1))


async def test_a_refused_event_is_isolated_and_the_journal_goes_on(
        tmp_path: Path, store_name: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    settings = _settings(tmp_path, store_name)
    url = settings.get("store")
    async with local_server(tmp_path, **settings) as srv:
        client = srv.client
        a, b = await _new_session(client), await _new_session(client)
        sid_a, sid_b = a["sessionId"], b["sessionId"]
        poison(tmp_path, store_name, url, "session_segments", "events")
        seen = await _run_prompt(client, sid_a, f"{MARK} one")
        ids = _ids(seen)
        assert ids == list(range(1, len(ids) + 1))   # no silent gap: the reader had all
        assert any(MARK in str(e.get("data")) for e in seen)   # the refused ones included
        seen_b = await _run_prompt(client, sid_b, "fine")
        refused = srv.bridge.journal.refusals.by_kind.get("event", 0)
        assert refused >= 1
        after = await _run_prompt(client, sid_a, "after", after=ids[-1])
        assert _ids(after)[0] == ids[-1] + 1
        more_b = await _run_prompt(client, sid_b, "more", after=_ids(seen_b)[-1])
        # the process serves on; counted, reported, logged once per record, not retried
        assert srv.bridge.journal.refusals.total == refused   # nothing refused since
        metrics = (await client.get("/metrics")).text
        assert _refused_metric(metrics, "event") == refused
        assert _refused_metric(metrics, "prompt") == 0
        health = await client.get("/health", params={"deep": "1"})
        assert health.status_code == 200
        report = health.json()
        assert report["status"] == "ok"
        assert report["journal"]["recordsRefused"] == refused
        last = report["journal"]["lastRefused"]
        assert (last["sessionId"], last["kind"]) == (sid_a, "event")
        assert REASON in last["reason"]
        assert _lines(caplog, "the store refused the event") == refused
        assert _lines(caplog, "retrying") == 0
        failed_commits = _lines(caplog, "a commit failed")
        assert 1 <= failed_commits <= refused
        for record in caplog.records:   # the payload never reaches the log
            assert f"{MARK} one" not in record.getMessage()
    assert stored_epoch(tmp_path, store_name, url, sid_a) != a["eventEpoch"]
    assert stored_epoch(tmp_path, store_name, url, sid_b) == b["eventEpoch"]
    async with local_server(tmp_path, **settings) as srv:
        client = srv.client
        assert srv.bridge.session_status(sid_a).event_epoch != a["eventEpoch"]
        assert srv.bridge.session_status(sid_b).event_epoch == b["eventEpoch"]
        # session B: every event committed, the same epoch, no resync
        last_b = _ids(more_b)[-1]
        frames = await read_events(client, sid_b, lambda e: e.get("id") == last_b,
                                   last_event_id=0, epoch=b["eventEpoch"])
        assert not [e for e in frames if e["type"] == "state_resync_required"]
        assert _ids(frames) == list(range(1, last_b + 1))
        # session A: a reader of the old epoch resyncs; what committed is there
        frames = await read_events(client, sid_a, lambda e: e["type"] == "replay_complete",
                                   last_event_id=1, epoch=a["eventEpoch"])
        assert frames[0]["type"] == "state_resync_required"
        assert frames[0]["data"]["reason"] == "epoch_reset"
        ring = await read_events(client, sid_a, lambda e: e.get("id") == _ids(after)[-1],
                                 last_event_id=0)
        assert _ids(ring)[-len(_ids(after)):] == _ids(after)   # the later prompt's events
        assert not [e for e in ring if MARK in str(e.get("data"))]
        # and it journals on
        await _run_prompt(client, sid_a, "again", after=_ids(after)[-1])


async def test_a_postgres_limit_is_a_refusal_not_an_outage(
        tmp_path: Path, store_name: str, caplog: pytest.LogCaptureFixture) -> None:
    """PostgreSQL's class 54 (``program_limit_exceeded``: an index row too large, a
    statement too complex) is an ``OperationalError`` in psycopg, as an outage is; but
    it fails the same record every time, so it is isolated like any refusal, not
    retried for ever with every session's journal stalled behind it."""
    if store_name != "postgres":
        pytest.skip("PostgreSQL's SQLSTATE classes")
    caplog.set_level(logging.INFO, logger=LOGGER)
    settings = _settings(tmp_path, store_name)
    url = settings.get("store")
    async with local_server(tmp_path, **settings) as srv:
        client = srv.client
        a, b = await _new_session(client), await _new_session(client)
        poison(tmp_path, store_name, url, "session_segments", "events", errcode="54000")
        seen = await _run_prompt(client, a["sessionId"], f"{MARK} one")
        assert _ids(seen) == list(range(1, len(_ids(seen)) + 1))
        seen_b = await _run_prompt(client, b["sessionId"], "fine")
        assert srv.bridge.journal.refusals.by_kind.get("event", 0) >= 1
        health = (await client.get("/health", params={"deep": "1"})).json()
        assert health["status"] == "ok"
        assert _lines(caplog, "retrying") == 0
    rows = stored_events(lambda s, p=(): _run_sql(tmp_path, store_name, url, s, p),
                         b["sessionId"])
    assert len(rows) == len(_ids(seen_b))   # the other session's events all committed


async def test_a_refused_last_event_still_gives_a_new_epoch(tmp_path: Path,
                                                            store_name: str) -> None:
    """The turn's last event refused: no id gap for the restore to find, so only the
    stored record's new epoch keeps a reader from a silent gap (and from an id reused
    under the epoch it saw)."""
    settings = _settings(tmp_path, store_name)
    url = settings.get("store")
    async with local_server(tmp_path, **settings) as srv:
        a = await _new_session(srv.client)
        sid = a["sessionId"]
        kind = ("position('turn_complete'::bytea IN NEW.events) > 0"
                if store_name == "postgres" else
                "instr(NEW.events, CAST('turn_complete' AS BLOB)) > 0")
        poison(tmp_path, store_name, url, "session_segments", None,
               when=f"{kind} AND NEW.session_id = '{sid}'")
        seen = await _run_prompt(srv.client, sid, "hi")
        last = _ids(seen)[-1]
        assert srv.bridge.journal.refusals.by_kind == {"event": 1}
    newest = _run_sql(tmp_path, store_name, url,
                      "SELECT MAX(last_id) FROM session_segments WHERE session_id = ?",
                      (sid,))
    assert newest[0][0] == last - 1   # the last one is not in the journal
    async with local_server(tmp_path, **settings) as srv:
        assert srv.bridge.session_status(sid).event_epoch != a["eventEpoch"]
        frames = await read_events(srv.client, sid, lambda e: e["type"] == "replay_complete",
                                   last_event_id=last, epoch=a["eventEpoch"])
        assert frames[0]["type"] == "state_resync_required"
        assert frames[0]["data"]["reason"] == "epoch_reset"


async def test_a_refused_prompt_is_a_503_and_releases_the_slot_once(tmp_path: Path,
                                                                     store_name: str) -> None:
    settings = _settings(tmp_path, store_name)
    url = settings.get("store")
    options = BridgeOptions(max_pending_prompts_per_session=1)
    async with local_server(tmp_path, options=options, **settings) as srv:
        client = srv.client
        sid, other = (await _new_session(client))["sessionId"], \
            (await _new_session(client))["sessionId"]
        poison(tmp_path, store_name, url, "session_prompts", "record")
        refused = await client.post(f"/session/{sid}/prompt", json=_prompt(f"{MARK} lost"))
        assert refused.status_code == 503
        assert refused.json()["code"] == "store_unavailable"
        assert refused.headers["retry-after"]
        assert srv.bridge.session_status(sid).pending_prompts == 0   # the slot is free
        await _run_prompt(client, other, "fine")   # another session's prompt commits
        kept = await _run_prompt(client, sid, "kept")   # the one slot was released, once
        assert srv.bridge.session_status(sid).pending_prompts == 0
        assert srv.bridge.journal.refusals.by_kind == {"prompt": 1}
        report = (await client.get("/health", params={"deep": "1"})).json()
        assert report["status"] == "ok"
        assert report["journal"]["lastRefused"]["kind"] == "prompt"
        kept_id = kept[-1]["promptId"]
    async with local_server(tmp_path, options=options, **settings) as srv:
        terminals = (await srv.client.post(f"/session/{sid}/load", json={})).json()[
            "promptTerminals"]
        assert [(t["promptId"], t["terminal"]) for t in terminals] == [(kept_id, "completed")]
        assert srv.bridge.session_status(sid).pending_prompts == 0   # nothing runs again
        await _run_prompt(client=srv.client, sid=sid, text="next",
                          after=srv.bridge.session_status(sid).last_event_id)


async def test_a_refused_terminal_or_close_is_replaced_by_a_deletion(tmp_path: Path,
                                                                     store_name: str) -> None:
    """A terminal the store refuses: the prompt is deleted from the journal, so the
    next start neither runs it again nor fails it as interrupted. A close it refuses:
    the session's journal is deleted, so it does not come back live."""
    settings = _settings(tmp_path, store_name)
    url = settings.get("store")
    async with local_server(tmp_path, **settings) as srv:
        client = srv.client
        sid = (await _new_session(client))["sessionId"]
        closing = (await _new_session(client))["sessionId"]
        # the settle of a prompt whose body holds MARK (its row keeps no body: OLD's)
        poison(tmp_path, store_name, url, "session_prompts", "record", event="UPDATE",
               row="OLD")
        seen = await _run_prompt(client, sid, f"{MARK} settles")
        poison(tmp_path, store_name, url, "sessions", None, event="UPDATE",
               when=f"NEW.closed_at IS NOT NULL AND NEW.id = '{closing}'")
        await srv.bridge.close_session(closing, reason="idle_timeout")
        later = await _run_prompt(client, sid, "later", after=_ids(seen)[-1])
        assert srv.bridge.journal.refusals.by_kind == {"terminal": 1, "end": 1}
    assert _run_sql(tmp_path, store_name, url, "SELECT id FROM sessions WHERE id = ?",
                    (closing,)) == []
    async with local_server(tmp_path, **settings) as srv:
        assert [s.session_id for s in srv.bridge.list_sessions()] == [sid]
        status = srv.bridge.session_status(sid)
        assert status.pending_prompts == 0   # the settled prompt does not run again
        terminals = (await srv.client.post(f"/session/{sid}/load", json={})).json()[
            "promptTerminals"]
        assert [t["promptId"] for t in terminals] == [later[-1]["promptId"]]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the client side only
async def test_a_serve_process_journals_on_past_a_refused_event(tmp_path: Path,
                                                                store_name: str) -> None:
    flags = _flags(tmp_path, store_name)
    url = flags[flags.index("--store") + 1] if "--store" in flags else None
    child = ServeProcess(tmp_path, *flags).start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            a, b = await _new_session(client), await _new_session(client)
            sid_a, sid_b = a["sessionId"], b["sessionId"]
            poison(tmp_path, store_name, url, "session_segments", "events")
            seen = await _run_prompt(client, sid_a, f"{MARK} one")
            assert _ids(seen) == list(range(1, len(_ids(seen)) + 1))   # no silent gap
            seen_b = await _run_prompt(client, sid_b, "fine")
            after = await _run_prompt(client, sid_a, "after", after=_ids(seen)[-1])
            metrics = (await client.get("/metrics")).text
            refused = _refused_metric(metrics, "event")
            assert refused >= 1
            health = await client.get("/health", params={"deep": "1"})
            assert health.status_code == 200
            assert health.json()["journal"]["recordsRefused"] == refused
            assert health.json()["journal"]["lastRefused"]["sessionId"] == sid_a
            more_b = await _run_prompt(client, sid_b, "more", after=_ids(seen_b)[-1])
            assert _refused_metric((await client.get("/metrics")).text, "event") == refused
        assert child.returncode is None   # it serves on
        log = child.stderr_text()
        assert log.count("the store refused the event") == refused
        assert "retrying" not in log   # the retry loop ended
        assert f"{MARK} one" not in log   # no payload in the log
        child.kill()   # SIGKILL: what was acknowledged must be there
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            frames = await read_events(client, sid_a, lambda e: e["type"] == "replay_complete",
                                       last_event_id=_ids(after)[-1], epoch=a["eventEpoch"])
            assert frames[0]["type"] == "state_resync_required"
            assert frames[0]["data"]["reason"] == "epoch_reset"
            last_b = _ids(more_b)[-1]
            frames = await read_events(client, sid_b, lambda e: e.get("id") == last_b,
                                       last_event_id=0, epoch=b["eventEpoch"])
            assert not [e for e in frames if e["type"] == "state_resync_required"]
            assert _ids(frames) == list(range(1, last_b + 1))
            await _run_prompt(client, sid_a, "again", after=_ids(after)[-1])
    finally:
        child.stop()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the client side only
async def test_a_serve_process_answers_503_for_a_refused_prompt(tmp_path: Path,
                                                                store_name: str) -> None:
    flags = _flags(tmp_path, store_name)
    url = flags[flags.index("--store") + 1] if "--store" in flags else None
    async with ServeProcess(tmp_path, *flags, "--max-pending-prompts-per-session", "1") as child:
        client = child.client
        sid = (await _new_session(client))["sessionId"]
        poison(tmp_path, store_name, url, "session_prompts", "record")
        refused = await client.post(f"/session/{sid}/prompt", json=_prompt(f"{MARK} lost"))
        assert refused.status_code == 503
        assert refused.json()["code"] == "store_unavailable"
        assert refused.headers["retry-after"]
        assert MARK not in refused.text and REASON not in refused.text   # not the client's
        await _run_prompt(client, sid, "kept")   # the one slot was released
        status = (await client.get(f"/session/{sid}/status")).json()
        assert status["pendingPrompts"] == 0
        assert _refused_metric((await client.get("/metrics")).text, "prompt") == 1
        assert child.returncode is None
