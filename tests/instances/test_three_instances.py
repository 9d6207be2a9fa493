"""Three real ``acp-server serve`` instances on one PostgreSQL store behind a real
HAProxy (issue #24), started once for the module:

* a session created through the balancer is readable and promptable through every
  instance directly (the others forward to its owner);
* the admission race: 50 prompts for one session at once, spread over the three
  instances, give exactly ``limit`` 202s and the rest 503 ``prompt_queue_full`` with
  ``Retry-After: 5`` (only the owner admits);
* affinity by hashing the session id (``balance uri depth 2``) as well as by cookie;
* a paused owner (``SIGSTOP`` past its lease, then ``SIGCONT``) while a client prompts
  through the balancer: another instance adopts the session and runs the prompt, the
  paused one writes nothing more, no event id is written twice;
* last (it kills an instance): ``kill -9`` of the owner while a client streams and
  prompts through the balancer with cookie affinity: another instance adopts the
  session within the lease TTL, the reader resumes by ``Last-Event-ID`` with no gap and
  no duplicate, and every accepted prompt gets its terminal (``--session-on-restart
  continue``: the interrupted one is continued).

The clients are ``httpx`` in threads (the tests are synchronous), so nothing here
depends on an anyio backend.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import psycopg
import pytest

from tests.agents.gated import gated_agent
from tests.bridge.helpers import wait_until
from tests.harness import ServeProcess
from tests.harness.haproxy import SKIP, HAProxy, haproxy_binary
from tests.clients.conftest import acp_sdk, qwen_sdk  # noqa: F401 - the fixtures
from tests.lmsp import stores
from tests.store.segment_rows import stored_events

pytestmark = pytest.mark.slow
TTL_MS, RENEW_MS = 1500, 300
LIMIT = 5


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str,
                                                                         list[ServeProcess]]]:
    if haproxy_binary() is None:
        pytest.skip(SKIP)
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    tmp = tmp_path_factory.mktemp("three")
    url = stores.postgres_url_for(tmp, "three")
    workspace = tmp / "ws"      # one workspace folder, as a team host has
    workspace.mkdir()
    children: list[ServeProcess] = []
    try:
        for name in ("a", "b", "c"):
            children.append(ServeProcess(
                workspace, "--store", url, *stores.lease_flags(),
                "--session-lease-ttl-ms", str(TTL_MS), "--session-lease-renew-ms",
                str(RENEW_MS), "--session-on-restart", "continue",
                "--max-pending-prompts-per-session", str(LIMIT),
                "--agent", f"gated={gated_agent(tmp)}",
                state_dir=f"state-{name}").start())
        yield tmp, url, children
    finally:
        for child in children:
            child.kill()


def _prompt(text: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": text}]}


def _wait(condition: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)
    return value


def _instance_of(child: ServeProcess) -> str:
    return str(child.http.get("/daemon/status").json()["runtime"]["instances"]["instance"])


def _owner(db: psycopg.Connection[Any], sid: str) -> str:
    return str(db.execute("SELECT instance FROM session_leases WHERE session_id = %s",
                          (sid,)).fetchone()[0])


class Reader(threading.Thread):
    """An SSE reader through the balancer that resumes by ``Last-Event-ID`` whenever
    its stream ends or fails, as an editor does; records every event it gets."""

    def __init__(self, base_url: str, sid: str, client: httpx.Client | None = None) -> None:
        super().__init__(daemon=True)
        self.base_url, self.sid = base_url, sid
        self.client = client or httpx.Client(base_url=base_url, timeout=httpx.Timeout(
            30, connect=5))
        self.events: list[dict[str, Any]] = []
        self.reconnects = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def last_id(self) -> int:
        with self.lock:
            ids = [e["id"] for e in self.events if e.get("id") is not None]
        return ids[-1] if ids else 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with self.client.stream("GET", f"/session/{self.sid}/events", headers={
                        "Last-Event-ID": str(self.last_id())}) as stream:
                    if stream.status_code != 200:
                        stream.read()
                        self.reconnects += 1
                        time.sleep(0.05)
                        continue
                    for line in stream.iter_lines():
                        if line.startswith("data:"):
                            with self.lock:
                                self.events.append(json.loads(line[5:]))
                        if self.stop.is_set():
                            return
            except httpx.HTTPError:
                pass
            self.reconnects += 1
            time.sleep(0.05)

    def saw(self, kind: str, prompt_id: str) -> bool:
        with self.lock:
            return any(e["type"] == kind and e.get("promptId") == prompt_id
                       for e in self.events)

    def ids(self) -> list[int]:
        with self.lock:
            return [e["id"] for e in self.events if e.get("id") is not None]


def _post_until_accepted(client: httpx.Client, path: str, body: dict[str, Any],
                         timeout: float = 30) -> httpx.Response:
    """A client that retries a 503 (the owner unreachable, the session moving)."""
    def attempt() -> httpx.Response | None:
        try:   # a paused instance takes the request and never answers: time out, retry
            response = client.post(path, json=body, timeout=3)
        except httpx.HTTPError:
            return None
        return response if response.status_code != 503 else None
    return _wait(attempt, timeout)


def test_created_through_the_balancer_is_served_by_every_instance(
        fleet: tuple[Path, str, list[ServeProcess]]) -> None:
    tmp, _, children = fleet
    with HAProxy(tmp, [c.base_url for c in children]) as lb, \
            httpx.Client(base_url=lb.base_url, timeout=20) as client:
        lb.wait_up(3)
        sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        pids = []
        for n, child in enumerate(children):   # each directly: the owner, or a forward
            assert child.http.get(f"/session/{sid}/status").json()["sessionId"] == sid
            accepted = child.http.post(f"/session/{sid}/prompt", json=_prompt(f"via {n}"))
            assert accepted.status_code == 202, accepted.text
            pids.append(accepted.json()["promptId"])
        for child in children:   # every instance streams the whole session
            reader = Reader(child.base_url, sid)
            reader.start()
            _wait(lambda: all(reader.saw("turn_complete", p) for p in pids))
            reader.stop.set()
            said = "".join(
                e["data"]["update"]["content"]["text"] for e in reader.events
                if (e.get("data") or {}).get("update", {}).get("sessionUpdate")
                == "agent_message_chunk")
            assert said == "Echo: via 0Echo: via 1Echo: via 2"
        reports = [c.http.get("/daemon/status").json()["runtime"]["instances"]
                   for c in children]
        assert sorted(r["sessionsOwned"] > 0 for r in reports) == [False, False, True]


def test_the_admission_race_is_exact_across_instances(
        fleet: tuple[Path, str, list[ServeProcess]]) -> None:
    _, _, children = fleet
    sid = children[0].http.post("/session", json={"sessionScope": "thread"}).json()[
        "sessionId"]
    start = threading.Barrier(50)

    def send(n: int) -> httpx.Response:
        with httpx.Client(base_url=children[n % 3].base_url, timeout=30) as client:
            start.wait()
            return client.post(f"/session/{sid}/prompt", json=_prompt(f"/sleep 30s race {n}"))

    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(send, range(50)))
    accepted = [a for a in answers if a.status_code == 202]
    refused = [a for a in answers if a.status_code == 503]
    assert len(accepted) == LIMIT and len(refused) == 50 - LIMIT
    for answer in refused:
        assert answer.headers["retry-after"] == "5"
        assert answer.json()["code"] == "prompt_queue_full"
    assert {n % 3 for n, a in enumerate(answers) if a.status_code == 202} <= {0, 1, 2}
    assert children[1].http.delete(f"/session/{sid}").status_code == 204   # forwarded


def test_affinity_by_hashing_the_session_id(
        fleet: tuple[Path, str, list[ServeProcess]]) -> None:
    tmp, _, children = fleet
    with HAProxy(tmp, [c.base_url for c in children], affinity="hash") as lb, \
            httpx.Client(base_url=lb.base_url, timeout=20) as client:
        lb.wait_up(1)   # one path, one instance: that is the point of hashing
        sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        before = [c.http.get("/daemon/status").json()["runtime"]["instances"]["forwards"]
                  for c in children]
        pids = [client.post(f"/session/{sid}/prompt", json=_prompt(f"h{n}")).json()[
            "promptId"] for n in range(4)]
        reader = Reader(lb.base_url, sid, client)
        reader.start()
        _wait(lambda: all(reader.saw("turn_complete", p) for p in pids))
        reader.stop.set()
        after = [c.http.get("/daemon/status").json()["runtime"]["instances"]["forwards"]
                 for c in children]
        grew = [n for n in range(3) if after[n] > before[n]]
        assert len(grew) <= 1   # one instance gets all of them (and forwards, or owns it)


def test_a_paused_owner_is_replaced_and_writes_nothing_more(
        fleet: tuple[Path, str, list[ServeProcess]]) -> None:
    tmp, url, children = fleet
    with HAProxy(tmp, [c.base_url for c in children], affinity="cookie") as lb, \
            httpx.Client(base_url=lb.base_url, timeout=20) as client, \
            psycopg.connect(url, autocommit=True) as db:
        lb.wait_up(3)
        sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        ids = {_instance_of(c): c for c in children}
        paused = ids[_owner(db, sid)]
        first = client.post(f"/session/{sid}/prompt", json=_prompt("/chunks 2 before"))
        assert first.status_code == 202
        os.kill(paused.pid, signal.SIGSTOP)
        try:
            # the balancer's check takes it out; the next instance adopts the session
            second = _post_until_accepted(client, f"/session/{sid}/prompt",
                                          _prompt("/chunks 2 after"))
            new_owner = _wait(lambda: (o := _owner(db, sid)) in ids and ids[o] is not paused
                              and o)
        finally:
            os.kill(paused.pid, signal.SIGCONT)
        reader = Reader(lb.base_url, sid, client)
        reader.start()
        pids = [first.json()["promptId"], second.json()["promptId"]]
        _wait(lambda: all(reader.saw("turn_complete", p) for p in pids))
        _wait(lambda: paused.http.get("/daemon/status").json()["runtime"]["instances"][
            "sessionsOwned"] == 0)
        written = len(stored_events(db.execute, sid, "%s"))
        reader.stop.set()
        rows = stored_events(db.execute, sid, "%s")
        assert [r[0] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) == written
        assert reader.ids() == sorted(set(reader.ids()))   # no event twice
        assert _owner(db, sid) == new_owner


def _reads(child: ServeProcess) -> tuple[int, int]:
    """(forwards, journal reads) of one instance."""
    report = child.http.get("/daemon/status").json()["runtime"]["instances"]
    return report["forwards"], report["journalReads"]


def test_reads_on_another_instance_come_from_the_journal(
        fleet: tuple[Path, str, list[ServeProcess]]) -> None:
    """A reader on B of a session A owns gets the live events of prompts sent to A
    (from the journal, woken by A's NOTIFY), then resumes on C by ``Last-Event-ID``
    with no gap and no duplicate; ``/load`` on B answers from the journal (nothing
    taken over) and the client id it gives is accepted by A."""
    _, url, children = fleet
    with psycopg.connect(url, autocommit=True) as db:
        made = children[0].http.post("/session", json={"sessionScope": "thread"}).json()
        sid, epoch = made["sessionId"], made["eventEpoch"]
        ids = {_instance_of(c): c for c in children}
        owner = ids[_owner(db, sid)]
        b, c = [child for child in children if child is not owner]
        before = _reads(b)
        first = Reader(b.base_url, sid)
        first.start()
        pids = [owner.http.post(f"/session/{sid}/prompt",
                                json=_prompt(f"/chunks 3 live {n}")).json()["promptId"]
                for n in range(2)]
        _wait(lambda: all(first.saw("turn_complete", p) for p in pids))
        first.stop.set()
        second = Reader(c.base_url, sid)
        second.events = list(first.events)   # resumes from its last id, on C
        second.start()
        pids += [owner.http.post(f"/session/{sid}/prompt",
                                 json=_prompt(f"/chunks 3 more {n}")).json()["promptId"]
                 for n in range(2)]
        _wait(lambda: all(second.saw("turn_complete", p) for p in pids))
        second.stop.set()
        got = second.ids()
        assert got == list(range(1, len(got) + 1))   # no gap, no duplicate, across B and C
        assert not any(e["type"] == "state_resync_required" for e in second.events)
        forwards, reads = _reads(b)
        assert forwards == before[0] and reads > before[1]   # B forwarded nothing
        assert b.http.get(f"/session/{sid}/status").json()["eventEpoch"] == epoch

        loaded = b.http.post(f"/session/{sid}/load", json={})
        assert loaded.status_code == 200, loaded.text
        body = loaded.json()
        assert body["attached"] is True and body["eventEpoch"] == epoch
        assert body["lastEventId"] == owner.http.get(
            f"/session/{sid}/status").json()["lastEventId"]
        assert {t["promptId"] for t in body["promptTerminals"]} >= set(pids)
        assert _owner(db, sid) == _instance_of(owner)   # nothing taken over
        again = b.http.post(f"/session/{sid}/prompt", json=_prompt("with the load's id"),
                            headers={"X-Qwen-Client-Id": body["clientId"]})
        assert again.status_code == 202, again.text   # forwarded to A, which accepts it
        assert owner.http.delete(f"/session/{sid}").status_code == 204


def test_reads_answer_while_the_owner_is_paused(
        fleet: tuple[Path, str, list[ServeProcess]]) -> None:
    """``SIGSTOP`` the owner while its lease stays live (held here, as a long TTL
    would): status, pending prompts, ``/load`` and the event replay on the other
    instances still answer 200 from the journal; a write is 503 ``owner_lost`` once the
    owner's heartbeat is older than the TTL (not after 30 s): its kernel took the
    request, which the owner may carry out when it wakes, so not ``owner_unreachable``
    (which says that sending it again is safe)."""
    _, url, children = fleet
    with psycopg.connect(url, autocommit=True) as db:
        sid = children[1].http.post("/session", json={"sessionScope": "thread"}).json()[
            "sessionId"]
        ids = {_instance_of(c): c for c in children}
        owner = ids[_owner(db, sid)]
        others = [child for child in children if child is not owner]
        done = owner.http.post(f"/session/{sid}/prompt", json=_prompt("/chunks 2 done"))
        pid = done.json()["promptId"]
        _wait(lambda: owner.http.get(f"/session/{sid}/pending-prompts").json()[
            "pendingPrompts"] == [])

        def committed() -> int | None:
            """The owner's last event id once the turn's end and its prompt's settle
            are committed (status says the committed id; the settle follows the end)."""
            settled = db.execute("SELECT settled_at FROM session_prompts WHERE session_id = %s "
                                 "AND prompt_id = %s", (sid, pid)).fetchone()[0] is not None
            count = len(stored_events(db.execute, sid, "%s"))
            last = owner.http.get(f"/session/{sid}/status").json()["lastEventId"]
            return last if settled and last == count else None

        last = _wait(committed)
        os.kill(owner.pid, signal.SIGSTOP)
        try:
            db.execute("UPDATE session_leases SET expires_at = expires_at + 3600 "
                       "WHERE session_id = %s", (sid,))
            # the reads' timeouts only bound a hang (what is judged is each answer: 200,
            # from the journal): a loaded machine may take more than 5 s over a /load
            for child in others:
                status = child.http.get(f"/session/{sid}/status", timeout=30)
                assert status.status_code == 200, status.text
                assert status.json()["lastEventId"] == last
                assert child.http.get(f"/session/{sid}/pending-prompts",
                                      timeout=30).json() == {"pendingPrompts": []}
                loaded = child.http.post(f"/session/{sid}/load", json={}, timeout=30)
                assert loaded.status_code == 200, loaded.text
                assert pid in {t["promptId"] for t in loaded.json()["promptTerminals"]}
                with child.http.stream("GET", f"/session/{sid}/events", timeout=30,
                                       headers={"Last-Event-ID": "0"}) as stream:
                    assert stream.status_code == 200
                    replayed = []
                    for line in stream.iter_lines():
                        if line.startswith("data:"):
                            replayed.append(json.loads(line[5:]))
                            if replayed[-1]["type"] == "replay_complete":
                                break
                assert [e["id"] for e in replayed[:-1]] == list(range(1, last + 1))
            lost = {**_prompt("/chunks 1 lost"), "promptId": "lost-1"}
            refused = others[0].http.post(f"/session/{sid}/prompt", json=lost, timeout=20)
            assert refused.status_code == 503, refused.text
            assert refused.json()["code"] == "owner_lost"
        finally:
            os.kill(owner.pid, signal.SIGCONT)
        db.execute("UPDATE session_leases SET expires_at = 0 WHERE session_id = %s", (sid,))
        _wait(lambda: owner.http.get("/health").status_code == 200)
        # The owner may run the request its kernel held; sent again under its id, the
        # prompt runs once whoever holds the session now (a 503 while it moves: again).
        _wait(lambda: others[0].http.post(f"/session/{sid}/prompt", json=lost,
                                          timeout=20).status_code in (200, 202))
        def ends() -> list[str]:
            return [e[1] for e in stored_events(db.execute, sid, "%s")
                    if e[2] == "lost-1" and e[1] in ("turn_complete", "turn_error")]

        _wait(lambda: ends() and others[1].http.get(f"/session/{sid}/status").json()[
            "pendingPrompts"] == 0)
        assert ends() == ["turn_complete"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only (a Node process)


@pytest.mark.anyio
@pytest.mark.clients
async def test_qwen_sdk_session_client_round_robin(
        fleet: tuple[Path, str, list[ServeProcess]], qwen_sdk: str) -> None:
    """``@qwen-code/sdk``'s ``DaemonClient``/``DaemonSessionClient`` through round robin
    (no affinity, no cookies kept): every request may land anywhere; the instances
    forward to the owner."""
    from tests.clients.node import run_script

    tmp, _, children = fleet
    with HAProxy(tmp, [c.base_url for c in children]) as lb:
        lb.wait_up(3)
        r = await run_script("qwen_sdk.mjs", qwen_sdk, lb.base_url, "rest", "fleet")
    assert r["prompt"] == {"stopReason": "end_turn"} and r["turn"] == {"stopReason": "end_turn"}
    live = r["loadLive"]
    assert live["attached"] is True and live["complete"] is True
    assert live["lastEventId"] == live["compactedReplay"][-1]["id"]
    after = [e for e in r["afterLoad"] if e["type"] != "replay_complete"]
    assert after[0]["id"] == live["lastEventId"] + 1 and r["afterLoadAccepted"]
    assert r["resume"]["attached"] is True
    assert "coldTurn" not in r   # a deleted session's cold load: not across instances
    replayed = r["replay"]["replayed"]
    assert replayed[0]["id"] == r["replay"]["seenUpTo"] + 1   # Last-Event-ID, anywhere
    assert [e["id"] for e in replayed] == list(range(replayed[0]["id"],
                                                     replayed[0]["id"] + len(replayed)))
    assert r["capRefused"]["name"] == "DaemonPendingPromptLimitError"
    assert r["capHeld"] == {"stopReason": "end_turn"}


@pytest.mark.anyio
@pytest.mark.clients
@pytest.mark.parametrize("transport", ["http", "ws"])
async def test_acp_sdk_through_the_balancer(fleet: tuple[Path, str, list[ServeProcess]],
                                            acp_sdk: str, transport: str) -> None:
    """The ACP TypeScript SDK over Streamable HTTP (it keeps the balancer's cookies, as
    the RFD asks) and over WebSocket (pinned by the balancer), through HAProxy hashing
    the path: an ``/acp`` connection lives on the instance that holds it."""
    from tests.clients.node import run_script

    tmp, _, children = fleet
    with HAProxy(tmp, [c.base_url for c in children], affinity="hash") as lb:
        lb.wait_up(1)
        report = await run_script("acp_sdk.mjs", acp_sdk, lb.base_url, transport,
                                  str(children[0].workspace))
    assert report["protocolVersion"] == 1
    stops = [e["stopReason"] for e in report["first"] if e["kind"] == "stop"]
    assert stops == ["end_turn", "end_turn", "end_turn", "cancelled"]


def _idle(child: ServeProcess, sid: str) -> bool:
    status = child.http.get(f"/session/{sid}/status").json()
    return status.get("pendingPrompts") == 0


@pytest.mark.anyio   # asyncio (the module's anyio_backend): the ACP Python SDK needs it
@pytest.mark.parametrize("transport", ["http", "ws"])
async def test_acp_python_sdk_loads_a_session_live_elsewhere(
        fleet: tuple[Path, str, list[ServeProcess]], transport: str) -> None:
    """The RFD's resume flow on an instance that does not run the session, with the
    ACP Python SDK: ``initialize`` then ``session/load`` on B of a session A runs,
    idle, is handed over (A lets it go through the store, B adopts it): the whole
    history, a prompt that completes, A's status of it then B's, every event once.
    While A runs a long prompt the load is refused at once with the retryable
    ``session_busy_elsewhere`` and A's prompt goes on untouched."""
    acp = pytest.importorskip("acp")
    from acp.exceptions import RequestError

    from tests.acp_http.test_sdk_client import RecordingClient

    _, url, children = fleet
    workspace = str(children[0].workspace)
    with psycopg.connect(url, autocommit=True) as db:
        made = children[0].http.post("/session", json={"sessionScope": "thread"}).json()
        sid = made["sessionId"]
        owner = {_instance_of(c): c for c in children}[_owner(db, sid)]
        b = next(child for child in children if child is not owner)
        busy = owner.http.post(f"/session/{sid}/prompt",
                               json=_prompt("/sleep 30s x")).json()["promptId"]
        _wait(lambda: owner.http.get(f"/session/{sid}/status").json()["activePromptId"]
              == busy)
        client = RecordingClient()
        async with contextlib.AsyncExitStack() as stack:
            if transport == "ws":
                from acp.ws import create_websocket_stream
                stream = await create_websocket_stream(
                    b.base_url.replace("http://", "ws://") + "/acp")
            else:
                from acp.http import create_http_stream
                http = await stack.enter_async_context(
                    httpx.AsyncClient(timeout=httpx.Timeout(None)))
                stream = create_http_stream(f"{b.base_url}/acp", client=http)
            conn = acp.connect_to_agent(client, stream)
            stack.push_async_callback(conn.close)
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            with anyio.fail_after(20), pytest.raises(RequestError) as refused:
                await conn.load_session(cwd=workspace, session_id=sid, mcp_servers=[])
            assert refused.value.data["errorKind"] == "session_busy_elsewhere"
            assert refused.value.data["retryable"] is True
            assert _owner(db, sid) == _instance_of(owner)   # A's prompt goes on
            assert owner.http.get(f"/session/{sid}/status").json()["activePromptId"] == busy
            assert owner.http.post(f"/session/{sid}/cancel").status_code < 300
            _wait(lambda: _idle(owner, sid))
            assert owner.http.post(f"/session/{sid}/prompt", json=_prompt(
                "/chunks 3 before the hand-off")).status_code == 202
            _wait(lambda: _idle(owner, sid))
            with anyio.fail_after(30):
                try:
                    await conn.load_session(cwd=workspace, session_id=sid, mcp_servers=[])
                except RequestError as exc:   # the failure's data in the report
                    raise AssertionError(f"session/load failed: {exc} {exc.data}") from exc
            # the whole history (the SDK runs each notification's handler in its own task)
            await wait_until(lambda: "before the hand-off" in "".join(client.chunks))
            assert _owner(db, sid) == _instance_of(b)
            client.chunks.clear()
            with anyio.fail_after(30):
                result = await conn.prompt(session_id=sid,
                                           prompt=[acp.text_block("/chunks 2 after")])
            assert result.stop_reason == "end_turn"
            await wait_until(lambda: "".join(client.chunks).endswith("Echo: after"))
        last = b.http.get(f"/session/{sid}/status").json()["lastEventId"]
        assert owner.http.get(f"/session/{sid}/status").json()["lastEventId"] == last
        ids = [e[0] for e in stored_events(db.execute, sid, "%s")]
        assert ids == list(range(ids[0], last + 1))   # continuous: nothing written twice
        report = b.http.get("/daemon/status").json()["runtime"]["instances"]
        assert report["handOffsTaken"] >= 1 and report["handOffsRefused"] >= 1


def test_kill_9_of_the_owner_while_a_client_streams_and_prompts(
        fleet: tuple[Path, str, list[ServeProcess]]) -> None:
    tmp, url, children = fleet
    with HAProxy(tmp, [c.base_url for c in children], affinity="cookie") as lb, \
            httpx.Client(base_url=lb.base_url, timeout=20) as client, \
            psycopg.connect(url, autocommit=True) as db:
        lb.wait_up(3)
        # the fixture agent: its 'gate' turn runs until the test creates the file, after
        # the kill (a timed turn could end before the kill on a loaded machine)
        made = client.post("/session", json={"sessionScope": "thread", "agent": "gated"})
        sid = made.json()["sessionId"]
        epoch = made.json()["eventEpoch"]
        gate = tmp / "gate-kill-9"
        ids = {_instance_of(c): c for c in children}
        victim = ids[_owner(db, sid)]
        reader = Reader(lb.base_url, sid, httpx.Client(
            base_url=lb.base_url, timeout=httpx.Timeout(30, connect=5),
            cookies=client.cookies))
        reader.start()
        accepted = [client.post(f"/session/{sid}/prompt", json=_prompt("/chunks 3 one"))]
        _wait(lambda: reader.saw("turn_complete", accepted[0].json()["promptId"]))
        accepted.append(client.post(f"/session/{sid}/prompt", json=_prompt(f"gate {gate}")))
        running = accepted[1].json()["promptId"]
        _wait(lambda: reader.saw("pending_prompt_started", running)
              or reader.saw("session_update", running))
        before = len(reader.ids())
        assert not reader.saw("turn_complete", running)   # running at the kill
        victim.kill()   # SIGKILL: no drain, no lease release
        killed_at = time.monotonic()
        accepted.append(_post_until_accepted(client, f"/session/{sid}/prompt",
                                             _prompt("/chunks 3 after the kill")))
        assert accepted[-1].status_code == 202, accepted[-1].text
        gate.touch()   # the interrupted turn, continued by the new owner, may end
        first_after = _wait(lambda: len(reader.ids()) > before and time.monotonic())
        pids = [a.json()["promptId"] for a in accepted]
        _wait(lambda: all(reader.saw("turn_complete", p) for p in pids), timeout=60)
        reader.stop.set()
        got = reader.ids()
        assert got == list(range(1, len(got) + 1))   # no gap, no duplicate, across the move
        assert not any(e["type"] == "state_resync_required" for e in reader.events)
        new_owner = _owner(db, sid)
        assert new_owner in ids and ids[new_owner] is not victim
        status = ids[new_owner].http.get(f"/session/{sid}/status").json()
        assert status["eventEpoch"] == epoch if "eventEpoch" in status else True
        print(f"failover: kill -> first event served by the new owner "
              f"{(first_after - killed_at) * 1000:.0f} ms (lease TTL {TTL_MS} ms)")
