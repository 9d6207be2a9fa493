"""The session journal on a real PostgreSQL that stops (``pg_ctl stop -m fast`` of a
cluster of the test's own), under a real ``acp-server serve`` on the reference agent,
with an SSE reader following the session. ``test_session_journal.py`` has the same
contracts in process, on a store whose faults are injected; here the connections
really break, the writer really reconnects.

* SIGTERM while PostgreSQL is still down: the process exits 0 within the hang bound
  (its last commit fails at once: no wait on the store). The reader saw nothing that
  was not committed: with PostgreSQL back and the server started again, every id it
  saw holds the same envelope under the same epoch (or the epoch is new and the
  reader's resume is a resync), and its resume by cursor gets the rest, each id once.
  Every prompt acknowledged (202) before the outage is accounted for: the one that
  had ended ``completed``, the running one ``failed`` ``server_restarted`` (or
  ``cancelled``: its cancel was acknowledged in the outage), the queued one run after
  the restart. Every prompt sent during the outage got 503 ``store_unavailable`` with
  ``Retry-After``, never a 500, and none of them runs.
* PostgreSQL stopped and started again, the server never restarted: the turn that
  ran through the outage and the prompt queued behind it end by themselves once it
  is back, a prompt accepted after that completes, and the reader, never
  reconnected, saw every event once, in order, ids without a gap, the same envelopes
  a fresh read from 0 gets. A prompt refused in the outage never reaches the agent
  (its refusal is journaled: ``turn_error`` ``store_unavailable``).
* PostgreSQL restarted and crashed under a load of prompts on three sessions (``slow``):
  connections cut wherever they are, mid-batch or mid-COMMIT; the same promises,
  every acknowledged prompt ending once, in order.

Every wait is on a condition; each bound is only against a hang.
"""

from __future__ import annotations

import os
from functools import partial
import signal
import time
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.harness import ServeProcess, free_port
from tests.lmsp import stores
from tests.store.crash_workload import Reader, settled_in
from tests.store.test_durable_start_outage import _pg
from tests.store.test_outage_processes import own_cluster  # noqa: F401 (a fixture)
from tests.store.test_session_restart import _is, _prompt, read_events

pytestmark = pytest.mark.anyio
HANG_S = 60   # against a hang, never a timing


def _flags(url: str) -> list[str]:
    return ["--store", url, *stores.lease_flags(), "--port", str(free_port()),
            "--max-pending-prompts-per-session", "0"]


def _shown(reader: Reader) -> list[dict[str, Any]]:
    return [e for e in reader.seen if e.get("id") is not None]


def _ids(events: list[dict[str, Any]]) -> list[int]:
    return [e["id"] for e in events if e.get("id") is not None]


async def _accepted(client: httpx.AsyncClient, sid: str, text: str) -> str:
    answer = await client.post(f"/session/{sid}/prompt", json=_prompt(text))
    assert answer.status_code == 202, answer.text
    return str(answer.json()["promptId"])


async def _refused_in_the_outage(client: httpx.AsyncClient, sid: str, n: int,
                                 first: int = 0) -> list[str]:
    """``n`` prompts sent under ids of their own while the store is down: each is a 503
    ``store_unavailable`` with ``Retry-After`` (never a 500). Their ids."""
    sent = []
    for i in range(first, first + n):
        prompt_id = f"in-the-outage-{i}"
        answer = await client.post(f"/session/{sid}/prompt", json={
            **_prompt(f"/chunks 2 in the outage {i}"), "promptId": prompt_id})
        assert answer.status_code == 503, answer.text
        assert answer.json()["code"] == "store_unavailable", answer.text
        assert int(answer.headers["retry-after"]) > 0
        sent.append(prompt_id)
    return sent


def _never_ran(events: list[dict[str, Any]], refused: list[str]) -> None:
    """No prompt refused in the outage reached the agent (no echo, no turn of its own):
    at most its admission undone is journaled (``turn_error`` ``store_unavailable``)."""
    for event in events:
        if event.get("promptId") in refused:
            assert event["type"] in ("pending_prompt_added", "turn_error",
                                     "pending_prompt_completed"), event
            if event["type"] == "turn_error":
                assert event["data"]["code"] == "store_unavailable", event


async def _idle_in_memory(client: httpx.AsyncClient) -> None:
    """No prompt pending on the instance (``/daemon/status``: what runs in memory, not
    what readers were shown)."""
    with anyio.fail_after(HANG_S):
        while True:
            activity = (await client.get("/daemon/status")).json()["runtime"]["activity"]
            if activity["pendingPrompts"] == 0:
                return
            await anyio.sleep(0.05)


async def _a_session_mid_run(client: httpx.AsyncClient, reader: Reader) -> dict[str, str]:
    """The session ``reader`` follows with a prompt ended, one running (``/sleep 60s``,
    its start seen) and one queued (its ``pending_prompt_added`` seen): their ids."""
    sid = reader.session_id
    done = await _accepted(client, sid, "/chunks 3 before the outage")
    await reader.wait_for(lambda seen: settled_in(seen, done), "the first prompt's end")
    running = await _accepted(client, sid, "/sleep 60s through the outage")
    queued = await _accepted(client, sid, "/chunks 4 queued before the outage")
    await reader.wait_for(lambda seen: any(
        e["type"] == "session_update" and e.get("promptId") == running for e in seen) and any(
        e["type"] == "pending_prompt_added" and e.get("promptId") == queued for e in seen),
        "the running prompt's start and the queued one's admission")
    return {"done": done, "running": running, "queued": queued}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the server is a child process
async def test_sigterm_while_postgresql_is_stopped(tmp_path: Path,
                                                   own_cluster: Path) -> None:  # noqa: F811
    url = os.environ["_ACP_OWN_PG"]
    pg_port = urllib.parse.urlsplit(url).port
    child = ServeProcess(tmp_path, *_flags(url))
    await anyio.to_thread.run_sync(child.start)
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=HANG_S) as client:
            sid = (await client.post("/session", json={"sessionScope": "thread"})
                   ).json()["sessionId"]
            epoch = (await client.get(f"/session/{sid}/status")).json()["eventEpoch"]
            reader = Reader(sid, "follower")
            async with anyio.create_task_group() as tg:
                tg.start_soon(reader.run, client)
                prompts = await _a_session_mid_run(client, reader)
                await anyio.to_thread.run_sync(_pg, "stop", own_cluster)
                refused = await _refused_in_the_outage(client, sid, 3)
                # the running turn ends and the queued one runs, in memory: their
                # events are published in the outage and held, never committed
                cancelled = await client.post(f"/session/{sid}/cancel")
                assert cancelled.status_code == 204, cancelled.text
                await _idle_in_memory(client)
                refused += await _refused_in_the_outage(client, sid, 1, first=3)
                assert child.process is not None
                child.process.send_signal(signal.SIGTERM)
                began = time.monotonic()
                with anyio.fail_after(HANG_S):
                    while child.returncode is None:
                        await anyio.sleep(0.05)
                took = time.monotonic() - began
                with anyio.fail_after(HANG_S):   # its stream ends with the process
                    while not reader.ended:
                        await anyio.sleep(0.05)
        assert child.returncode == 0, child.stderr_text()[-3000:]
        assert "Traceback" not in child.stderr_text()
        shown = _shown(reader)
        assert _ids(shown) == list(range(1, len(shown) + 1)), _ids(shown)
        assert not any(settled_in(shown, prompts[k]) for k in ("running", "queued")), (
            took, [(e["id"], e["type"]) for e in shown])

        await anyio.to_thread.run_sync(_pg, "start", own_cluster, pg_port)
        await anyio.to_thread.run_sync(child.start)
        async with httpx.AsyncClient(base_url=child.base_url, timeout=HANG_S) as client:
            whole = await read_events(client, sid, _is("turn_complete", prompts["queued"]),
                                      last_event_id=0, timeout=HANG_S)
            now = (await client.get(f"/session/{sid}/status")).json()["eventEpoch"]
            resumed = Reader(sid, "follower, resumed")
            resumed.seen = list(reader.seen)
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(resumed.run, client, epoch=epoch))
                await resumed.wait_for(
                    lambda seen: settled_in(seen, prompts["queued"])
                    or any(e["type"] == "state_resync_required" for e in seen),
                    "the resume's end or resync")
                resumed.stop()
            after = resumed.seen[len(reader.seen):]
            if now == epoch:   # what the reader saw is the session's, id for id
                by_id = {e["id"]: e for e in whole if e.get("id") is not None}
                assert [by_id.get(e["id"]) for e in shown] == shown
                assert "state_resync_required" not in [e["type"] for e in after]
                end = next(n for n, e in enumerate(after)
                           if _is("turn_complete", prompts["queued"])(e))
                # the rest, each id once, from the one after its cursor: the journal's
                assert [e for e in after[:end + 1] if e.get("id") is not None] == [
                    e for e in whole if e.get("id") is not None and e["id"] > len(shown)]
            else:   # the journal lost events: the reader is told to re-read
                assert "state_resync_required" in [e["type"] for e in after], after

            loaded = await client.post(f"/session/{sid}/load", json={})
            assert loaded.status_code == 200, loaded.text
            terminals = {t["promptId"]: t for t in loaded.json()["promptTerminals"]}
            assert terminals[prompts["done"]]["terminal"] == "completed"
            ended = terminals[prompts["running"]]
            assert (ended["terminal"], ended.get("errorCode")) in (
                ("failed", "server_restarted"), ("cancelled", None)), ended
            assert terminals[prompts["queued"]]["terminal"] == "completed"
            for prompt_id in refused:   # refused: never run (or journaled as refused)
                if prompt_id in terminals:
                    assert (terminals[prompt_id]["terminal"],
                            terminals[prompt_id].get("errorCode")) == (
                        "failed", "store_unavailable"), terminals[prompt_id]
            _never_ran(whole, refused)
    finally:
        child.stop()


@pytest.mark.parametrize("anyio_backend", ["trio"])   # the server is a child process
async def test_postgresql_stopped_and_started_again_under_a_running_server(
        tmp_path: Path, own_cluster: Path) -> None:  # noqa: F811
    url = os.environ["_ACP_OWN_PG"]
    pg_port = urllib.parse.urlsplit(url).port
    async with ServeProcess(tmp_path, *_flags(url)) as child:
        client = child.client
        sid = (await client.post("/session", json={"sessionScope": "thread"})
               ).json()["sessionId"]
        reader = Reader(sid, "follower")
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader.run, client)
            prompts = await _a_session_mid_run(client, reader)
            before = reader.last_id()
            await anyio.to_thread.run_sync(_pg, "stop", own_cluster)
            refused = await _refused_in_the_outage(client, sid, 3)
            cancelled = await client.post(f"/session/{sid}/cancel")
            assert cancelled.status_code == 204, cancelled.text
            await _idle_in_memory(client)   # both turns ended in memory, held
            refused += await _refused_in_the_outage(client, sid, 1, first=3)
            assert not any(settled_in(reader.seen, prompts[k]) for k in ("running", "queued"))
            await anyio.to_thread.run_sync(_pg, "start", own_cluster, pg_port)
            # no request needed: the held events commit and reach the reader by themselves
            await reader.wait_for(lambda seen: settled_in(seen, prompts["queued"]),
                                  "the queued prompt's end after the outage")
            with anyio.fail_after(HANG_S):   # accepted again once the store is back
                while (answer := await client.post(
                        f"/session/{sid}/prompt", json=_prompt("/chunks 3 after"))
                       ).status_code != 202:
                    assert answer.status_code == 503, answer.text
                    assert answer.json()["code"] == "store_unavailable", answer.text
                    await anyio.sleep(0.05)
            prompts["after"] = answer.json()["promptId"]
            await reader.wait_for(lambda seen: settled_in(seen, prompts["after"]),
                                  "the prompt accepted after the outage ends")
            reader.stop()
        assert reader.statuses == [200]   # one stream, through the outage
        shown = _shown(reader)
        assert _ids(shown) == list(range(1, len(shown) + 1)), _ids(shown)   # no gap, no dup
        assert len(shown) > before
        assert "state_resync_required" not in [e["type"] for e in reader.seen]
        whole = await read_events(client, sid, _is("turn_complete", prompts["after"]),
                                  last_event_id=0, timeout=HANG_S)
        assert [e for e in whole if e.get("id") is not None] == shown[:len(_ids(whole))]
        assert _ids(whole)[-1] == next(e["id"] for e in shown
                                      if _is("turn_complete", prompts["after"])(e))
        loaded = await client.post(f"/session/{sid}/load", json={})
        assert loaded.status_code == 200, loaded.text
        terminals = {t["promptId"]: t["terminal"] for t in loaded.json()["promptTerminals"]}
        assert {k: terminals.get(p) for k, p in prompts.items()} == {
            "done": "completed", "running": "cancelled", "queued": "completed",
            "after": "completed"}, terminals
        for prompt_id in refused:   # refused: never run (or journaled as refused)
            assert terminals.get(prompt_id) in (None, "failed"), terminals
        _never_ran(whole, refused)
        assert child.returncode is None
    assert "Traceback" not in child.stderr_text()


@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the server is a child process
async def test_postgresql_restarted_and_crashed_under_a_session_load(
        tmp_path: Path, own_cluster: Path) -> None:  # noqa: F811
    """Prompts sent back to back to three sessions, a reader on each, while PostgreSQL
    is restarted (``-m fast``) and crashed (``-m immediate``, then started) twice
    each: connections cut mid-batch and mid-COMMIT, whenever they happen to be. Every
    answer is a 202 or a 503 ``store_unavailable``; every prompt acknowledged ends
    ``turn_complete``, once, in the order of its 202; each reader, on one stream
    throughout, saw ids without a gap or a duplicate, the envelopes a read from 0
    gets."""
    url = os.environ["_ACP_OWN_PG"]
    pg_port = urllib.parse.urlsplit(url).port
    async with ServeProcess(tmp_path, *_flags(url)) as child:
        client = child.client
        readers = [Reader((await client.post("/session", json={"sessionScope": "thread"})
                           ).json()["sessionId"], f"reader {n}") for n in range(3)]
        accepted: dict[str, list[str]] = {r.session_id: [] for r in readers}
        answers: Counter[tuple[int, str]] = Counter()
        done = anyio.Event()

        async def prompts(reader: Reader) -> None:   # at most 3 pending at once
            sid, n = reader.session_id, 0
            while not done.is_set():
                n += 1
                answer = await client.post(f"/session/{sid}/prompt",
                                           json=_prompt(f"/chunks 20 load {n}"))
                answers[answer.status_code, answer.json().get("code", "")] += 1
                if answer.status_code == 202:
                    accepted[sid].append(answer.json()["promptId"])
                with anyio.fail_after(HANG_S):
                    while len(accepted[sid]) >= 3 and not done.is_set() and not settled_in(
                            reader.seen, accepted[sid][-3]):
                        await anyio.sleep(0.01)
                if answer.status_code != 202:
                    await anyio.sleep(0.02)

        async def more(count: int) -> None:
            target = sum(map(len, accepted.values())) + count
            with anyio.fail_after(HANG_S):
                while sum(map(len, accepted.values())) < target:
                    await anyio.sleep(0.01)

        async with anyio.create_task_group() as tg:
            for reader in readers:
                tg.start_soon(reader.run, client)
            async with anyio.create_task_group() as load:
                for reader in readers:
                    load.start_soon(prompts, reader)
                for how in ("restart", "crash", "restart", "crash"):
                    await more(12)
                    await anyio.to_thread.run_sync(_pg, how, own_cluster)
                    if how == "crash":
                        await anyio.to_thread.run_sync(_pg, "start", own_cluster, pg_port)
                await more(12)   # accepted again after the last one
                done.set()
            for reader in readers:
                sid = reader.session_id
                await reader.wait_for(lambda seen, sid=sid: all(
                    settled_in(seen, p) for p in accepted[sid]), "every prompt's end")
                reader.stop()
        assert set(answers) <= {(202, ""), (503, "store_unavailable")}, answers
        for reader in readers:
            sid, shown = reader.session_id, _shown(reader)
            assert reader.statuses == [200]
            assert _ids(shown) == list(range(1, len(shown) + 1))
            assert "state_resync_required" not in [e["type"] for e in reader.seen]
            ends = [e for e in shown if e["type"] in ("turn_complete", "turn_error")
                    and e.get("promptId") in accepted[sid]]
            assert [(e["type"], e["promptId"]) for e in ends] == [
                ("turn_complete", p) for p in accepted[sid]]
            whole = await read_events(client, sid, _is("turn_complete", accepted[sid][-1]),
                                      last_event_id=0, timeout=HANG_S)
            assert [e for e in whole if e.get("id") is not None] == shown[:len(_ids(whole))]
        assert child.returncode is None
    assert "Traceback" not in child.stderr_text()
