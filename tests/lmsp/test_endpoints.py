"""``acp_server.lmsp.endpoints``: ``POST /lmsp/v1/tasks`` on the front layer's hot path
(``FastCreate``) answers as its route does."""

from __future__ import annotations

from typing import Any

import pytest

from acp_server.lmsp.endpoints import FastCreate
from tests.lmsp.server import LmspServer

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("store_name")]

TASK = {"type": "response", "input": {"model": "reference", "input": "/sleep 50ms hi"}}


def _spied(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each create's path: ``fast`` (answered by ``FastCreate``), ``declined`` (it
    declined on its own) or ``route`` (made to decline: the route answers)."""
    paths: list[str] = []
    real = FastCreate.__call__

    async def spy(self: FastCreate, scope: Any, body: bytes) -> Any:
        if paths.count("fast") > paths.count("route"):   # every other one: the route
            paths.append("route")
            return None
        answer = await real(self, scope, body)
        paths.append("fast" if answer is not None else "declined")
        return answer

    monkeypatch.setattr(FastCreate, "__call__", spy)
    return paths


def _headers(response: Any) -> list[tuple[str, str]]:
    return [(k, v) for k, v in response.headers.multi_items()
            if k not in ("date", "location", "content-length")]


async def test_a_create_is_answered_on_the_hot_path_as_the_route_answers(
        server: LmspServer, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _spied(monkeypatch)
    fast = await server.client.post("/lmsp/v1/tasks", json=TASK)
    route = await server.client.post("/lmsp/v1/tasks", json=TASK)
    assert paths == ["fast", "route"]
    assert fast.status_code == route.status_code == 202
    assert _headers(fast) == _headers(route)
    for answer in (fast, route):
        task = answer.json()
        assert answer.headers["location"] == f"/lmsp/v1/tasks/{task['id']}"
        assert task["status"] == "queued" and "idempotent-replayed" not in answer.headers
    assert fast.json().keys() == route.json().keys()


async def test_a_keyed_create_and_its_replay_on_the_hot_path(
        server: LmspServer, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _spied(monkeypatch)
    headers = {"Idempotency-Key": "k-1"}
    first = await server.client.post("/lmsp/v1/tasks", json=TASK, headers=headers)
    again = await server.client.post("/lmsp/v1/tasks", json=TASK, headers=headers)
    replay = await server.client.post("/lmsp/v1/tasks", json=TASK, headers=headers)
    assert paths == ["fast", "route", "fast"]
    assert first.json()["id"] == again.json()["id"] == replay.json()["id"]
    assert again.headers["idempotent-replayed"] == replay.headers["idempotent-replayed"] == "true"
    assert _headers(again) == _headers(replay)
    other = await server.client.post("/lmsp/v1/tasks", headers=headers, json={
        **TASK, "input": {"model": "reference", "input": "else"}})
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"


@pytest.mark.parametrize("body, code", [
    ({"type": "response", "input": {"model": "qwen3:14b", "input": "x"}}, "model_not_found"),
    ({"type": "response", "input": {"model": "reference", "input": "x",
                                    "previous_response_id": "resp_gone"}},
     "response_not_found"),
])
async def test_a_refusal_of_the_service_is_the_routes_byte_for_byte(
        server: LmspServer, monkeypatch: pytest.MonkeyPatch, body: dict, code: str) -> None:
    paths = _spied(monkeypatch)
    fast = await server.client.post("/lmsp/v1/tasks", json=body)
    route = await server.client.post("/lmsp/v1/tasks", json=body)
    assert paths == ["fast", "route"]
    assert fast.json()["code"] == code
    assert (fast.status_code, _headers(fast), fast.content) == \
        (route.status_code, _headers(route), route.content)


@pytest.mark.parametrize("content", [b"", b"{", b'{"type": "response"}',
                                     b'{"type": "x", "input": {}}'])
async def test_a_body_the_route_refuses_before_creating_is_declined(
        server: LmspServer, monkeypatch: pytest.MonkeyPatch, content: bytes) -> None:
    paths = _spied(monkeypatch)
    answer = await server.client.post("/lmsp/v1/tasks", content=content,
                                      headers={"content-type": "application/json"})
    assert paths == ["declined"]
    assert answer.status_code == 400 and answer.json()["code"] == "invalid_request"
    assert answer.headers["content-type"] == "application/problem+json"


async def test_a_bug_in_the_create_is_the_doors_500_problem(
        server: LmspServer, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    paths = _spied(monkeypatch)

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(type(server.service), "create_task", broken)
    answer = await server.client.post("/lmsp/v1/tasks", json=TASK)
    assert paths == ["fast"]
    assert answer.status_code == 500 and answer.json()["code"] == "server_error"
    assert answer.headers["content-type"] == "application/problem+json"
    assert "a bug" not in answer.text and "lmsp: POST /lmsp/v1/tasks failed" in caplog.text
