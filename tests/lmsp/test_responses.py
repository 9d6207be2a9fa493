"""POST /lmsp/v1/responses (§6.1): non-streaming and ``stream: true``."""

from __future__ import annotations

import json

import anyio
import pytest

from acp_server.store.sqlite import SqliteTaskStore
from tests.lmsp.server import LmspServer

pytestmark = pytest.mark.anyio


async def test_non_streaming_returns_the_response_object(server: LmspServer) -> None:
    response = await server.client.post("/lmsp/v1/responses", json={
        "model": "reference", "input": [{"type": "message", "role": "user", "content": "hi"}],
        "metadata": {"k": "v"}})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "response" and body["status"] == "completed"
    assert body["metadata"] == {"k": "v"}
    assert body["output"][0]["content"][0]["text"] == "Echo: hi"
    assert body["usage"] == {"input_tokens": 1, "output_tokens": 3, "total_tokens": 4,
                             "input_tokens_details": {"cached_tokens": 0,
                                                      "cache_write_tokens": 0},
                             "output_tokens_details": {"reasoning_tokens": 0}}


async def test_non_streaming_failure_is_a_failed_response(server: LmspServer) -> None:
    response = await server.client.post("/lmsp/v1/responses",
                                        json={"model": "reference", "input": "/fail x"})
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "failed" and body["error"]["code"] == "agent_error"


async def test_streaming(server: LmspServer) -> None:
    async with server.client.stream("POST", "/lmsp/v1/responses", json={
            "model": "reference", "input": "/chunks 3 a b c", "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        text = (await response.aread()).decode()
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.completed"
    assert sum(e["type"] == "response.output_text.delta" for e in events) == 3


async def test_validation_and_model_errors(server: LmspServer) -> None:
    response = await server.client.post("/lmsp/v1/responses", json={"model": "reference"})
    assert response.status_code == 400
    assert response.json()["errors"] == [{"pointer": "/input", "detail":
                                         "'input' is required: a string, or an array of "
                                         "input items."}]
    response = await server.client.post("/lmsp/v1/responses", json={"model": "m", "input": "x"})
    assert response.status_code == 404 and response.json()["code"] == "model_not_found"


async def test_closing_a_stream_cancels_the_response(server: LmspServer) -> None:
    async with server.client.stream("POST", "/lmsp/v1/responses", json={
            "model": "reference", "input": "/sleep 60s x", "stream": True}) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                response_id = json.loads(line[6:])["response"]["id"]
                break

    mark = "?" if isinstance(server.service.store, SqliteTaskStore) else "%s"

    def find(conn: object) -> str:
        return conn.execute(f"SELECT id FROM tasks WHERE response_id = {mark}",  # type: ignore
                            (response_id,)).fetchone()[0]

    task_id = await server.service.store._read(find)  # type: ignore[attr-defined]
    with anyio.fail_after(30):   # a hang bound (the 60 s turn ends only by the cancel)
        while (await server.get(task_id))["status"] != "cancelled":
            await anyio.sleep(0.02)


@pytest.mark.parametrize("request_body", [
    {"model": "reference", "input": "hi"},
    {"model": "reference", "input": "hi", "metadata": {"k": "v"}, "store": True,
     "instructions": "Be brief.", "max_output_tokens": 50, "user": "u1"},
])
def test_a_run_looks_for_the_echoed_members_once(monkeypatch: pytest.MonkeyPatch,
                                                request_body: dict) -> None:
    """An attempt's ``response.in_progress`` and its final response repeat the same
    request members, taken from the stored request once (``Attempt.echo``)."""
    from acp_server.lmsp import responses
    from acp_server.store.tasks import NewTask, queued_record

    record = queued_record(NewTask(id="task_1", response_id="resp_1", on_restart="fail",
                                   model="reference", principal=None,
                                   request=json.dumps(request_body).encode(),
                                   created_at=1.0))
    looked = []
    real = responses.echoed
    monkeypatch.setattr(responses, "echoed", lambda r: looked.append(r) or real(r))
    attempt = responses.Attempt(record, "hi")
    opening = responses.in_progress_event(record, attempt.echo)
    attempt.text("Echo: hi")
    _, finish = attempt.finish("end_turn", 2.0)
    assert len(looked) == 1
    final = json.loads(finish.response)
    assert attempt.echo == ({} if len(request_body) == 2 else {
        "metadata": {"k": "v"}, "store": True, "instructions": "Be brief.",
        "max_output_tokens": 50, "user": "u1"})
    for name, value in attempt.echo.items():
        assert final[name] == value and getattr(opening.response, name) == value
