"""Instances behind a real load balancer (Debian's HAProxy, started by the test) on one
PostgreSQL store: what works across instances today.

* LMSP background responses through round robin, with the official ``openai`` SDK: a
  response created on one instance is retrieved, streamed and cancelled through the
  balancer whichever instance each request lands on (the task store is shared).
* REST sessions with cookie affinity (``ACPSRV``, inserted by HAProxy): a client that
  keeps cookies, as the ACP Streamable HTTP RFD asks of clients, stays on the instance
  that made its session, so creating, prompting and reading the stream all work through
  the balancer, and the other instance lists the session too. Sessions that move
  between instances are issue #24's.

The sync ``OpenAI`` client and ``httpx.Client`` run in worker threads, so the tests
run under both anyio backends.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from tests.harness import ServeProcess
from tests.harness.haproxy import SKIP, HAProxy, haproxy_binary
from tests.lmsp import stores

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def two_instances(tmp_path: Path) -> Iterator[list[ServeProcess]]:
    if haproxy_binary() is None:
        pytest.skip(SKIP)
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    url = stores.postgres_url_for(tmp_path, "lb")
    children: list[ServeProcess] = []
    try:
        for name in ("a", "b"):
            workspace = tmp_path / "ws"      # one workspace folder, as a team host has
            workspace.mkdir(exist_ok=True)
            children.append(ServeProcess(workspace, "--store", url, *stores.lease_flags(),
                                         state_dir=f"state-{name}").start())
        yield children
    finally:
        for child in children:
            child.kill()


def _openai(base_url: str) -> Any:
    return openai.OpenAI(base_url=base_url + "/lmsp/v1", api_key="unused", max_retries=0,
                         timeout=20)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the servers are child processes
async def test_background_responses_round_robin(tmp_path: Path,
                                                two_instances: list[ServeProcess]) -> None:
    with HAProxy(tmp_path, [c.base_url for c in two_instances]) as lb:
        lb.wait_up(2)

        def run() -> tuple[Any, Any, list[Any], Any]:
            with _openai(lb.base_url) as client:
                made = client.responses.create(model="reference", input="across the fleet",
                                               background=True)
                done = made
                while done.status in ("queued", "in_progress"):
                    done = client.responses.retrieve(made.id)   # each lands anywhere
                streamed = list(client.responses.create(model="reference", stream=True,
                                                        input="/chunks 4 streamed"))
                slow = client.responses.create(model="reference", input="/sleep 60s never",
                                               background=True)
                cancelled = client.responses.cancel(slow.id)
                return made, done, streamed, cancelled

        made, done, streamed, cancelled = await anyio.to_thread.run_sync(run)
        assert made.status in ("queued", "in_progress", "completed")
        assert done.status == "completed" and done.output_text == "Echo: across the fleet"
        assert streamed[-1].type == "response.completed"
        assert streamed[-1].response.output_text == "".join(
            e.delta for e in streamed if e.type == "response.output_text.delta")
        assert cancelled.status == "cancelled"
        # both instances read the same response (the shared store), directly
        for child in two_instances:
            with _openai(child.base_url) as direct:
                again = await anyio.to_thread.run_sync(direct.responses.retrieve, made.id)
            assert again.output_text == "Echo: across the fleet"


@pytest.mark.parametrize("anyio_backend", ["trio"])   # the servers are child processes
async def test_sessions_stay_on_their_instance_with_cookie_affinity(
        tmp_path: Path, two_instances: list[ServeProcess]) -> None:
    with HAProxy(tmp_path, [c.base_url for c in two_instances], affinity="cookie") as lb:
        lb.wait_up(2)

        def run() -> tuple[str, str | None, dict[str, Any], str, int]:
            with httpx.Client(base_url=lb.base_url, timeout=20) as client:   # keeps cookies
                made = client.post("/session", json={"sessionScope": "thread"})
                made.raise_for_status()
                sid = made.json()["sessionId"]
                backend = HAProxy.backend_of(made)
                for n in range(6):   # would reach the other instance half the time without
                    accepted = client.post(f"/session/{sid}/prompt",
                                           json={"prompt": [{"type": "text", "text": f"p{n}"}]})
                    assert accepted.status_code == 202, accepted.text
                said, turns, deadline = "", 0, time.monotonic() + 60
                with client.stream("GET", f"/session/{sid}/events",
                                   headers={"Last-Event-ID": "0"}) as stream:
                    for line in stream.iter_lines():
                        if not line.startswith("data:"):
                            continue
                        event = json.loads(line[5:])
                        update = (event.get("data") or {}).get("update") or {}
                        if update.get("sessionUpdate") == "agent_message_chunk":
                            said += update["content"].get("text", "")
                        turns += event.get("type") == "turn_complete"
                        if turns == 6 or time.monotonic() > deadline:
                            break
                status = client.get(f"/session/{sid}/status").json()
                return sid, backend, status, said, turns

        sid, backend, status, said, turns = await anyio.to_thread.run_sync(run)
        assert backend in ("s0", "s1") and turns == 6
        assert status["sessionId"] == sid and status["pendingPrompts"] == 0
        assert said == "".join(f"Echo: p{n}" for n in range(6))
        owner = two_instances[int(backend[1:])]
        # the direct reads' timeouts bound a hang (a loaded machine may not run an
        # instance for seconds): what is judged is each answer
        direct = httpx.get(f"{owner.base_url}/session/{sid}/status", timeout=30)
        assert direct.status_code == 200 and direct.json()["sessionId"] == sid

        # the listing is the same whichever instance answers: the other lists it too
        other = two_instances[1 - int(backend[1:])]
        wid = httpx.get(f"{other.base_url}/capabilities", timeout=30).json()[
            "workspaces"][0]["id"]
        with anyio.fail_after(20):   # the others' sessions: read once a --store-poll-ms
            while sid not in [s["sessionId"] for s in httpx.get(
                    f"{other.base_url}/workspace/{wid}/sessions", timeout=30).json()["sessions"]]:
                await anyio.sleep(0.05)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the servers are child processes
async def test_the_audit_log_names_the_client_behind_the_balancer(tmp_path: Path) -> None:
    """Two instances with ``--trusted-proxy 127.0.0.1`` behind HAProxy (``option
    forwardfor``), round robin: a client connecting from 127.0.0.9 is recorded as
    127.0.0.9 in the shared audit log, for requests served where they landed and for
    those one instance forwarded to the other, never as the balancer or an instance."""
    if haproxy_binary() is None:
        pytest.skip(SKIP)
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    url = stores.postgres_url_for(tmp_path, "lbaudit")
    token = "lb-audit-s3cret-token"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    children = [ServeProcess(workspace, "--store", url, *stores.lease_flags(), "--token", token,
                             "--trusted-proxy", "127.0.0.1", state_dir=f"state-{name}")
                for name in ("a", "b")]
    try:
        for child in children:
            child.start()
        auth = {"Authorization": f"Bearer {token}"}
        with HAProxy(tmp_path, [c.base_url for c in children]) as lb:
            lb.wait_up(2, headers=auth)

            def run() -> tuple[list[dict[str, Any]], int]:
                elsewhere = httpx.HTTPTransport(local_address="127.0.0.9")
                with httpx.Client(base_url=lb.base_url, timeout=20, headers=auth,
                                  transport=elsewhere) as client:   # no cookies kept
                    client.cookies.clear()
                    sid = client.post("/session", json={"sessionScope": "thread"}).json()[
                        "sessionId"]
                    for n in range(4):   # round robin: half land on the other instance
                        client.cookies.clear()
                        sent = client.post(f"/session/{sid}/prompt", json={
                            "prompt": [{"type": "text", "text": f"p{n}"}]})
                        assert sent.status_code == 202, sent.text
                forwards = 0
                for child in children:
                    with httpx.Client(base_url=child.base_url, headers=auth,
                                      timeout=20) as direct:
                        status = direct.get("/daemon/status").json()
                        forwards += status["runtime"]["instances"]["forwards"]
                        records = direct.get("/audit").json()["records"]
                return records, forwards

            records, forwards = await anyio.to_thread.run_sync(run)
    finally:
        for child in children:
            child.kill()
    assert forwards >= 1   # some prompts landed on the instance without the session
    made = [r for r in records if r["action"] in ("session.created", "prompt.accepted")]
    assert [r["action"] for r in made].count("prompt.accepted") == 4
    assert {r["client"] for r in made} == {"127.0.0.9"}
