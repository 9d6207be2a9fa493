"""Idempotency-Key (§9.2): replay, mismatch, concurrency, scope, validation not recorded."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_server.store.postgres import PostgresTaskStore
from acp_server.store.sqlite import SqliteTaskStore
from tests.agents.held import HeldAgent
from tests.lmsp.server import LmspServer, envelope, problem_of, running_lmsp

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("store_name")]


async def test_replay_returns_the_same_task_in_its_current_state(server: LmspServer) -> None:
    body = envelope("hello", on_restart="retry")
    first = await server.client.post("/lmsp/v1/tasks", json=body,
                                     headers={"Idempotency-Key": "k-1"})
    assert first.status_code == 202 and "idempotent-replayed" not in first.headers
    task = first.json()
    await server.wait(task["id"])
    # same body, other key order and whitespace, quoted sf-string form of the key
    text = json.dumps({"on_restart": "retry", "input": body["input"], "type": "response"},
                      indent=3)
    replay = await server.client.post("/lmsp/v1/tasks", content=text.encode(),
                                      headers={"Idempotency-Key": '"k-1"'})
    assert replay.status_code == 202
    assert replay.headers["idempotent-replayed"] == "true"
    again = replay.json()
    assert again["id"] == task["id"] and again["status"] == "succeeded"
    frames = await server.events(task["id"])
    assert sum(f[1] == "response.created" for f in frames) == 1


async def test_changed_body_is_422(server: LmspServer) -> None:
    headers = {"Idempotency-Key": "k-2"}
    await server.create("one", headers=headers)
    response = await server.client.post("/lmsp/v1/tasks", json=envelope("two"), headers=headers)
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    assert problem_of(response) == {
        "type": "https://lmsp.invalid/problems/idempotency_key_reused",
        "title": "Idempotency key reused", "status": 422,
        "detail": "This Idempotency-Key was used with a different request body.",
        "instance": "/lmsp/v1/tasks", "code": "idempotency_key_reused"}


async def test_twenty_concurrent_identical_posts_make_one_task(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path, max_running_tasks=0) as srv:
        answers: list[tuple[int, str, str | None]] = []

        async def post() -> None:
            response = await srv.client.post("/lmsp/v1/tasks", json=envelope("same"),
                                             headers={"Idempotency-Key": "burst"})
            answers.append((response.status_code, response.json()["id"],
                            response.headers.get("idempotent-replayed")))

        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(post)
        assert {a[0] for a in answers} == {202}
        assert len({a[1] for a in answers}) == 1
        assert sorted(a[2] or "" for a in answers) == [""] + ["true"] * 19
        task_id = answers[0][1]
        frames = await srv.events(task_id, limit=1, timeout=30)
        assert frames[0][1] == "response.created"
        events = await srv.service.store.read_events(task_id, -1, 100)
        assert [e.type for e in events] == ["response.created"]

        store = srv.service.store
        assert isinstance(store, (SqliteTaskStore, PostgresTaskStore))

        def count(conn: sqlite3.Connection) -> int:   # one row, whatever the engine says
            return int(conn.execute("SELECT COUNT(*) FROM tasks").fetchone()[0])

        assert await store._read(count) == 1


async def test_keys_are_scoped_by_route(server: LmspServer) -> None:
    headers = {"Idempotency-Key": "shared"}
    task = await server.create("x", headers=headers)
    response = await server.client.post(
        "/lmsp/v1/responses", json={"model": "reference", "input": "x"}, headers=headers)
    assert response.status_code == 200
    assert response.json()["id"] != task["response_id"]


async def test_failed_validation_is_not_recorded(server: LmspServer) -> None:
    headers = {"Idempotency-Key": "fix-me"}
    bad = await server.client.post("/lmsp/v1/tasks", json={"type": "response"}, headers=headers)
    assert bad.status_code == 400
    good = await server.client.post("/lmsp/v1/tasks", json=envelope("x"), headers=headers)
    assert good.status_code == 202 and "idempotent-replayed" not in good.headers


async def test_store_wait_timeout_is_409_in_use(tmp_path: Path) -> None:
    from acp_server.lmsp import LmspConfig

    async with running_lmsp(tmp_path, config=LmspConfig(idempotency_wait_s=0)) as srv:
        response = await srv.client.post("/lmsp/v1/tasks", json=envelope("x"),
                                         headers={"Idempotency-Key": "slow"})
        assert response.status_code == 409
        assert response.headers["retry-after"] == "1"
        assert problem_of(response) == {
            "type": "https://lmsp.invalid/problems/idempotency_key_in_use",
            "title": "Idempotency key in use", "status": 409,
            "detail": "A request with this Idempotency-Key is still being processed.",
            "instance": "/lmsp/v1/tasks", "code": "idempotency_key_in_use"}


class Answered:
    """An ASGI wrap: ``done`` is set once the app has returned from a ``POST`` to
    ``path`` (its client gone, the handler finished what it does then)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.done = anyio.Event()

    def wrap(self, app: Any) -> Any:
        async def wrapped(scope: Any, receive: Any, send: Any) -> None:
            try:
                await app(scope, receive, send)
            finally:
                if scope["type"] == "http" and scope["method"] == "POST" and \
                        scope["path"] == self.path:
                    self.done.set()
        return wrapped


async def _running_task(srv: LmspServer) -> dict[str, Any]:
    with anyio.fail_after(10):
        while not (page := (await srv.client.get("/lmsp/v1/tasks?status=running")).json()
                   )["data"]:
            await anyio.sleep(0.01)
    return page["data"][0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_dropped_foreground_response_with_a_key_runs_on_for_the_retry(
        tmp_path: Path, stream: bool) -> None:
    # It was cancelled when its client dropped (a client-side timeout, say), so the
    # retry with the same key could only ever get the cancelled response.
    # the turn waits in the agent until the client dropped: it is running then,
    # whatever the machine's load (a 1 s turn could be over before a poll saw it)
    answered = Answered("/lmsp/v1/responses")
    body = {"model": "reference", "input": "done", "stream": stream}
    key = {"Idempotency-Key": f"drop-{stream}"}
    agent = HeldAgent()
    async with running_lmsp(tmp_path, wrap=answered.wrap, agent_factory=agent) as srv:
        async with anyio.create_task_group() as tg:
            async def first_try() -> None:
                async with srv.client.stream("POST", "/lmsp/v1/responses", json=body,
                                             headers=key) as response:
                    async for _ in response.aiter_bytes():
                        pass

            tg.start_soon(first_try)
            task = await _running_task(srv)
            tg.cancel_scope.cancel()   # the client drops
        with anyio.fail_after(30):
            await answered.done.wait()
        assert (await srv.get(task["id"]))["status"] == "running"   # not cancelled
        (await agent.arrived(1)).release()
        retry = await srv.client.post("/lmsp/v1/responses", json=body, headers=key)
        assert retry.status_code == 200 and retry.headers["idempotent-replayed"] == "true"
        if stream:
            assert [json.loads(line[6:])["type"] for line in retry.text.splitlines()
                    if line.startswith("data: ")][-1] == "response.completed"
        else:
            assert retry.json()["id"] == task["response_id"]
            assert retry.json()["status"] == "completed"
        assert (await srv.get(task["id"]))["status"] == "succeeded"


async def test_a_dropped_foreground_response_without_a_key_is_cancelled(
        tmp_path: Path) -> None:
    answered = Answered("/lmsp/v1/responses")
    async with running_lmsp(tmp_path, wrap=answered.wrap) as srv:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: srv.client.post("/lmsp/v1/responses", json={
                "model": "reference", "input": "/sleep 30s x"}))
            task = await _running_task(srv)
            tg.cancel_scope.cancel()
        with anyio.fail_after(10):
            await answered.done.wait()
        assert (await srv.get(task["id"]))["status"] in ("cancelling", "cancelled")
