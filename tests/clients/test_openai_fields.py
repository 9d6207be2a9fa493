"""Every member of a response object and of its events, as the ``openai`` SDK's own
pydantic types read them: the raw JSON of each is validated strictly
(``Response.model_validate``, the ``ResponseStreamEvent`` union) and may carry no member
the SDK does not know (``store`` aside: OpenAI's responses carry it, the SDK's type
not). The request's parameters come back as applied; those the agents cannot honour
are refused, 400 ``unsupported_capability`` (``acp_server.lmsp.params``).

The sync ``OpenAI`` client runs in a worker thread, so the tests run under both anyio
backends; the server is the in-process one over loopback HTTP.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

openai = pytest.importorskip("openai")

from acp_server.lmsp import LmspConfig  # noqa: E402
from tests.agents.held import HeldAgent  # noqa: E402
from tests.clients.openai_strict import strict_event, strict_response  # noqa: E402
from tests.lmsp.server import FakeClock, LmspServer, running_lmsp  # noqa: E402

pytestmark = pytest.mark.anyio


def _client(server: LmspServer) -> Any:
    return openai.OpenAI(base_url=server.base_url + "/lmsp/v1", api_key="unused",
                         max_retries=0, timeout=20)


def _raw_create(server: LmspServer, **params: Any) -> dict[str, Any]:
    with _client(server) as client:
        raw = client.responses.with_raw_response.create(**params)
        return json.loads(raw.text)  # type: ignore[no-any-return]


def _raw_get(server: LmspServer, response_id: str) -> dict[str, Any]:
    with _client(server) as client:
        return json.loads(client.responses.with_raw_response.retrieve(response_id).text)  # type: ignore[no-any-return]


def _raw_events(server: LmspServer, response_id: str) -> list[dict[str, Any]]:
    """Every event of a finished response, replayed from 0, as the SDK's stream
    decoder reads them (``retrieve(stream=True)``), in raw JSON."""
    with _client(server) as client:
        stream = client.responses.with_streaming_response.retrieve(response_id, stream=True)
        with stream as answer:
            return [json.loads(line[6:]) for line in answer.iter_lines()
                    if line.startswith("data: ")]


@pytest.fixture
async def server(tmp_path: Path) -> Any:
    async with running_lmsp(tmp_path) as srv:
        yield srv


ECHOED = dict(instructions="be brief", max_output_tokens=50, metadata={"k": "v"},
              parallel_tool_calls=False, tool_choice="none", tools=[], truncation="auto",
              text={"format": {"type": "text"}, "verbosity": "low"}, user="u-1",
              safety_identifier="s-1", prompt_cache_key="c-1", store=True,
              service_tier="flex", temperature=None, top_logprobs=0)


async def test_a_response_echoes_its_parameters(server: LmspServer) -> None:
    raw = await anyio.to_thread.run_sync(lambda: _raw_create(
        server, model="reference", input="hello", **ECHOED))
    response = strict_response(raw)
    assert response.status == "completed" and response.output_text == "Echo: hello\nbe brief"
    assert (response.instructions, response.max_output_tokens, response.metadata) == \
        ("be brief", 50, {"k": "v"})
    assert (response.parallel_tool_calls, response.tool_choice, response.tools,
            response.truncation) == (False, "none", [], "auto")
    assert response.text is not None and response.text.verbosity == "low"
    assert response.text.format is not None and response.text.format.type == "text"
    assert (response.user, response.safety_identifier, response.prompt_cache_key) == \
        ("u-1", "s-1", "c-1")
    assert raw["store"] is True and response.service_tier == "default"   # the tier used
    assert (response.temperature, response.top_p, response.top_logprobs,
            response.max_tool_calls) == (None, None, 0, None)
    assert response.reasoning is not None and response.reasoning.effort is None
    assert response.background is False and response.previous_response_id is None
    assert response.completed_at is not None and response.completed_at >= response.created_at
    usage = response.usage
    assert usage is not None and usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens > 0
    again = await anyio.to_thread.run_sync(lambda: _raw_get(server, response.id))
    assert again == raw   # the stored object, byte for byte in JSON terms


async def test_defaults_are_echoed(server: LmspServer) -> None:
    raw = await anyio.to_thread.run_sync(lambda: _raw_create(
        server, model="reference", input="plain"))
    response = strict_response(raw)
    assert (response.parallel_tool_calls, response.tool_choice, response.tools,
            response.truncation, response.service_tier, raw["store"]) == \
        (True, "auto", [], "disabled", "default", True)
    assert response.user is None and response.metadata == {}
    unstored = await anyio.to_thread.run_sync(lambda: _raw_create(
        server, model="reference", input="not kept", store=False))
    assert strict_response(unstored).status == "completed" and unstored["store"] is False


REFUSED = [("max_tool_calls", 3, "max_tool_calls"), ("top_logprobs", 2, "top_logprobs"),
           ("tools", [{"type": "function", "name": "f", "parameters": {}, "strict": True}],
            "tools"),
           ("tool_choice", "required", "tool_choice"),
           ("text", {"format": {"type": "json_object"}}, "text.format"),
           ("reasoning", {"effort": "high"}, "reasoning.effort"),
           ("conversation", "conv_1", "conversation"), ("prompt", {"id": "pmpt_1"}, "prompt")]


async def test_parameters_that_cannot_be_honoured_are_refused(server: LmspServer) -> None:
    def run() -> list[Any]:
        errors = []
        with _client(server) as client:
            for name, value, _ in REFUSED:
                with pytest.raises(openai.BadRequestError) as caught:
                    client.responses.create(model="reference", input="x", **{name: value})
                errors.append(caught.value)
        return errors

    errors = await anyio.to_thread.run_sync(run)
    for error, (_, _, param) in zip(errors, REFUSED):
        assert error.code == "unsupported_capability" and error.param == param, error.body
        assert "is not supported" in error.message
    task = await server.client.post("/lmsp/v1/tasks", json={
        "type": "response", "input": {"model": "reference", "input": "x", "max_tool_calls": 1}})
    assert task.status_code == 400 and task.json()["param"] == "input.max_tool_calls"
    bad = await server.client.post("/lmsp/v1/responses", json={
        "model": "reference", "input": "x", "temperature": "hot", "truncation": "some",
        "top_p": 1.5})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_request"
    assert [e["pointer"] for e in bad.json()["errors"]] == \
        ["/truncation", "/temperature", "/top_p"]


async def test_sampling_is_accepted_and_said_not_applied(server: LmspServer) -> None:
    """Frameworks send a temperature whatever the model (LangChain, LlamaIndex): it is
    accepted, and the response says what was applied: nothing (``null``)."""
    def run() -> Any:
        with _client(server) as client:
            return client.responses.create(model="reference", input="x", temperature=0.1,
                                           top_p=0.9)

    response = await anyio.to_thread.run_sync(run)
    assert response.status == "completed"
    assert (response.temperature, response.top_p) == (None, None)


async def test_every_streamed_event_is_an_sdk_type(server: LmspServer) -> None:
    def run() -> list[Any]:
        with _client(server) as client:
            return list(client.responses.create(model="reference", stream=True,
                                                input="/chunks 3 all the events"))

    seen = await anyio.to_thread.run_sync(run)
    raws = await anyio.to_thread.run_sync(lambda: _raw_events(server, seen[0].response.id))
    assert [r["sequence_number"] for r in raws] == [e.sequence_number for e in seen] == \
        list(range(len(raws)))
    events = [strict_event(raw) for raw in raws]
    assert events[0].response.status == "queued" and events[0].response.completed_at is None
    assert events[1].response.status == "in_progress"
    assert events[1].response.completed_at is None
    final = events[-1].response
    assert events[-1].type == "response.completed" and final.completed_at is not None
    assert final.output_text == "Echo: all the events"


async def test_ends_other_than_completed(server: LmspServer) -> None:
    """``incomplete``, ``failed`` and ``cancelled``: ``completed_at`` null, and
    ``incomplete_details`` / ``error`` / ``usage`` as the SDK reads them."""
    def run() -> tuple[Any, ...]:
        with _client(server) as client:
            short = client.responses.create(model="reference", input="one two three four",
                                            max_output_tokens=2)
            failed = client.responses.create(model="reference", input="/fail x")
            slow = client.responses.create(model="reference", input="/sleep 60s x",
                                           background=True)
            client.responses.cancel(slow.id)
            return short.id, failed.id, slow.id

    ids = await anyio.to_thread.run_sync(run)
    ends = {}
    for response_id in ids:
        raws = await anyio.to_thread.run_sync(lambda: _raw_events(server, response_id))
        for raw in raws:
            strict_event(raw)
        raw_final = await anyio.to_thread.run_sync(lambda: _raw_get(server, response_id))
        assert raws[-1]["response"] == raw_final   # the terminal event's, as stored
        final = strict_response(raw_final)
        assert final.completed_at is None, final
        ends[final.status] = final
    assert set(ends) == {"incomplete", "failed", "cancelled"}
    incomplete = ends["incomplete"]
    assert incomplete.incomplete_details is not None
    assert incomplete.incomplete_details.reason == "max_output_tokens"
    assert incomplete.usage is not None and incomplete.usage.output_tokens == 2
    assert incomplete.error is None
    failed = ends["failed"]
    assert failed.error is not None and failed.error.code == "agent_error"
    assert failed.incomplete_details is None and failed.usage is not None
    cancelled = ends["cancelled"]
    assert cancelled.error is None and cancelled.incomplete_details is None


async def test_completed_at_is_stored_and_survives_a_restart(tmp_path: Path) -> None:
    """The turn is held in the agent while the clock moves (a ``/sleep 300ms`` turn
    raced the poll for ``running`` on a loaded machine: over before it was seen, the
    poll waited out its 10 s, or the clock moved after the end)."""
    clock = FakeClock()
    started = clock.now
    config = LmspConfig(clock=clock)
    agent = HeldAgent()
    async with running_lmsp(tmp_path, config=config, agent_factory=agent) as srv:
        raw = await anyio.to_thread.run_sync(lambda: _raw_create(
            srv, model="reference", input="later", background=True))
        assert raw["status"] == "queued" and strict_response(raw).completed_at is None
        turn = await agent.arrived(1)   # in the agent until released
        clock.advance(100)   # the turn ends after this: completed at t0 + 100
        turn.release()
        with anyio.fail_after(10):
            while (await srv.service.get_response(raw["id"])).status != "succeeded":
                await anyio.sleep(0.01)
        done = strict_response(await anyio.to_thread.run_sync(lambda: _raw_get(srv, raw["id"])))
    assert done.created_at == int(started) and done.completed_at == int(started + 100)
    async with running_lmsp(tmp_path, config=config) as srv:
        again = strict_response(await anyio.to_thread.run_sync(
            lambda: _raw_get(srv, raw["id"])))
    assert again.completed_at == int(started + 100)
