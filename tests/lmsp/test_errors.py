"""Every problem object of §9.3 that a request can provoke, with exact bodies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from acp_server.lmsp import LmspConfig
from tests.lmsp.server import LmspServer, envelope, problem_of, running_lmsp

pytestmark = pytest.mark.anyio
BASE = "https://lmsp.invalid/problems/"
TASK = '{"type": "response", "input": {"model": …, "input": …}}.'


def invalid(detail: str, param: str, errors: list[tuple[str, str]],
            instance: str = "/lmsp/v1/tasks") -> dict[str, Any]:
    return {"type": BASE + "invalid_request", "title": "Invalid request", "status": 400,
            "detail": detail, "instance": instance, "code": "invalid_request", "param": param,
            "errors": [{"pointer": p, "detail": d} for p, d in errors]}


async def _post(server: LmspServer, body: Any, **kwargs: Any) -> Any:
    response = await server.client.post("/lmsp/v1/tasks", json=body, **kwargs)
    assert response.headers["content-type"] == "application/problem+json", response.text
    return response


@pytest.mark.parametrize(("body", "param", "errors"), [
    ({"input": {"model": "reference", "input": "x"}}, "type",
     [("/type", "'type' is required: a task body is " + TASK)]),
    # the natural guess, a /responses body: the detail says what a task is
    ({"model": "reference", "input": "yo"}, "type",
     [("/type", "'type' is required: a task body is " + TASK[:-1] + " (this body looks "
                "like a response request: send it as the task's 'input')."),
      ("/input", "Must be a JSON object (the response request).")]),
    ({"type": "embedding", "input": {"model": "reference", "input": "x"}}, "type",
     [("/type", "Unknown task type; 'response' is the only type in 1.0.")]),
    ({"type": "response"}, "input",
     [("/input", "'input' is required: the response request to run, "
                 '{"model": …, "input": …}.')]),
    ({"type": "response", "input": "x"}, "input",
     [("/input", "Must be a JSON object (the response request).")]),
    ({"type": "response", "input": {"input": "x"}}, "input.model",
     [("/input/model", "'input.model' is required: the model to run (GET "
                       "/lmsp/v1/capabilities lists them).")]),
    ({"type": "response", "input": {"model": "reference"}}, "input.input",
     [("/input/input", "'input.input' is required: a string, or an array of input "
                       "items.")]),
    (envelope("x", on_restart="sometimes"), "on_restart",
     [("/on_restart", "Must be one of fail, retry, resume.")]),
    ({"type": "response", "input": {"model": "reference", "input": [
        {"type": "message", "role": "robot", "content": [{"type": "image", "url": "u"}]}]},
      "on_restart": 1}, "input.input[0].role",
     [("/input/input/0/role", "Must be one of user, assistant, system, developer."),
      ("/input/input/0/content/0/type", "Must be 'input_text'."),
      ("/on_restart", "Must be one of fail, retry, resume.")]),
    ({"type": "response", "input": {"model": "reference", "input": "x", "stream": "yes",
                                    "max_output_tokens": 0, "metadata": {"a": 1}}},
     "input.max_output_tokens",
     [("/input/max_output_tokens", "Must be a positive integer."),
      ("/input/metadata", "Must be an object of string values."),
      ("/input/stream", "Must be a boolean.")]),
])
async def test_malformed_fields_are_400_with_pointers(server: LmspServer, body: Any, param: str,
                                                      errors: list[tuple[str, str]]) -> None:
    response = await _post(server, body)
    assert response.status_code == 400
    assert problem_of(response) == invalid(errors[0][1], param, errors)


async def test_body_not_json_or_not_object(server: LmspServer) -> None:
    response = await server.client.post("/lmsp/v1/tasks", content=b"{nope")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid_request" and body["param"] == "body"
    assert body["errors"][0]["pointer"] == ""
    response = await _post(server, [1, 2])
    assert response.json()["detail"] == "The body must be a JSON object (a task envelope)."


@pytest.mark.parametrize("key", ["", "a" * 256, "has space", "caf\u00e9".encode("latin-1"),
                                 '"unterminated'])
async def test_bad_idempotency_key_is_400(server: LmspServer, key: str | bytes) -> None:
    response = await _post(server, envelope("x"), headers={"Idempotency-Key": key})
    assert response.status_code == 400
    assert problem_of(response) == {
        "type": BASE + "invalid_request", "title": "Invalid request", "status": 400,
        "detail": "Idempotency-Key must be 1-255 visible ASCII characters, bare or as a "
                  "quoted string.", "instance": "/lmsp/v1/tasks", "code": "invalid_request",
        "param": "Idempotency-Key", "errors": []}


async def test_resume_is_unsupported_capability(server: LmspServer) -> None:
    response = await _post(server, envelope("x", on_restart="resume"))
    assert response.status_code == 400
    assert problem_of(response) == {
        "type": BASE + "unsupported_capability", "title": "Unsupported capability",
        "status": 400, "detail": "on_restart 'resume' needs snapshots, which no configured "
        "agent supports.", "instance": "/lmsp/v1/tasks", "code": "unsupported_capability",
        "capability": "snapshots", "param": "on_restart"}


async def test_unknown_model_is_404(server: LmspServer) -> None:
    body = {"type": "response", "input": {"model": "qwen3:14b", "input": "x"}}
    response = await _post(server, body)
    assert response.status_code == 404
    assert problem_of(response) == {
        "type": BASE + "model_not_found", "title": "Model not found", "status": 404,
        "detail": "The model 'qwen3:14b' does not exist (available: reference).",
        "instance": "/lmsp/v1/tasks", "code": "model_not_found", "model": "qwen3:14b"}


def test_the_models_a_model_not_found_lists_are_bounded() -> None:
    """Every client sees which models there are (the CLI prints the detail), but a
    model server of hundreds does not make a detail of hundreds."""
    from acp_server.lmsp.models import SHOWN_MODELS, available

    assert available({}) == "none available"
    assert available(dict.fromkeys(["b", "a"])) == "available: a, b"   # type: ignore[arg-type]
    many = dict.fromkeys(f"m{i:03}" for i in range(SHOWN_MODELS + 5))
    assert available(many).endswith(", m019, and 5 more")   # type: ignore[arg-type]


async def test_oversized_body_is_413(server: LmspServer) -> None:
    response = await _post(server, envelope("x" * (1 << 20)))
    assert response.status_code == 413
    assert problem_of(response) == {
        "type": BASE + "payload_too_large", "title": "Payload too large", "status": 413,
        "detail": "The body exceeds 1048576 bytes.", "instance": "/lmsp/v1/tasks",
        "code": "payload_too_large", "limit": 1048576}

    async def chunks() -> Any:   # no Content-Length: counted while streaming
        for _ in range(20):
            yield b"x" * 65536

    response = await server.client.post("/lmsp/v1/tasks", content=chunks())
    assert response.status_code == 413 and response.json()["code"] == "payload_too_large"


async def test_wrong_method_is_a_problem(server: LmspServer) -> None:
    response = await server.client.delete("/lmsp/v1/tasks")
    assert response.status_code == 405
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == "method_not_allowed"


async def test_queue_full_is_503(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path, max_running_tasks=0,
                            config=LmspConfig(max_queued_tasks=2)) as srv:
        await srv.create("a")
        await srv.create("b")
        response = await _post(srv, envelope("c"))
        assert response.status_code == 503
        assert response.headers["retry-after"] == "5"
        assert problem_of(response) == {
            "type": BASE + "prompt_queue_full", "title": "Prompt queue full", "status": 503,
            "detail": "2 tasks are already queued.", "instance": "/lmsp/v1/tasks",
            "code": "prompt_queue_full", "limit": 2, "pendingCount": 2}


async def test_unauthorized_is_a_problem(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path, token="s3cret") as srv:
        ok = await srv.client.get("/lmsp/v1/capabilities")
        assert ok.status_code == 200
        for method, path in (("GET", "/lmsp/v1/capabilities"), ("POST", "/lmsp/v1/tasks")):
            response = await srv.client.request(method, path,
                                                headers={"Authorization": "Bearer wrong"})
            assert response.status_code == 401
            assert response.headers["content-type"] == "application/problem+json"
            assert problem_of(response) == {
                "type": BASE + "unauthorized", "title": "Unauthorized", "status": 401,
                "detail": "A valid bearer token is required.", "code": "unauthorized"}
        # the REST surface keeps its own shape
        rest = await srv.client.get("/session/x", headers={"Authorization": "Bearer wrong"})
        assert rest.status_code == 401 and rest.json() == {"error": "Unauthorized"}


async def test_an_unknown_id_is_echoed_cut(server: LmspServer) -> None:
    """A 100 KB ``previous_response_id`` (or path id) is not sent back whole."""
    huge = "resp_" + "a" * 100_000
    answer = await server.client.post("/lmsp/v1/responses", json={
        "model": "reference", "input": "x", "previous_response_id": huge})
    assert answer.status_code == 404 and answer.json()["code"] == "response_not_found"
    assert len(answer.content) < 2_000
    assert answer.json()["response_id"] == huge[:80] + "…"
    answer = await server.client.get("/lmsp/v1/tasks/task_" + "b" * 4000)
    assert answer.status_code == 404   # ``instance`` is the path (the request line's cap)
    assert answer.json()["task_id"] == ("task_" + "b" * 4000)[:80] + "…"
    assert len(answer.json()["detail"]) < 100
