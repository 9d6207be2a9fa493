"""OpenAI Responses background mode on /lmsp/v1, through the official ``openai`` SDK.

Every test runs on both stores (``server`` fixture) and both async backends: create
with ``background=True`` and poll ``retrieve``; ``cancel`` (queued, running, twice, a
finished one); ``delete``; ``store=False``; unknown ids; ``previous_response_id``
through the kept ACP session and through the history given to a fresh one.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest
from openai import AsyncOpenAI

from acp_server.lmsp import LmspConfig
from tests.lmsp.server import LmspServer, running_lmsp

pytestmark = pytest.mark.anyio
FINAL = {"completed", "incomplete", "failed", "cancelled"}


def sdk(srv: LmspServer) -> AsyncOpenAI:
    """The official client pointed at this server (no retries: every answer counts)."""
    return AsyncOpenAI(base_url=f"{srv.base_url}/lmsp/v1", api_key="unused", max_retries=0)


@contextlib.asynccontextmanager
async def client_of(srv: LmspServer) -> AsyncIterator[AsyncOpenAI]:
    client = sdk(srv)
    try:
        yield client
    finally:
        await client.close()


async def poll(client: AsyncOpenAI, response_id: str, statuses: set[str] = FINAL,
               timeout: float = 15) -> Any:
    """``retrieve`` until the status is one of ``statuses`` (the guide's polling loop)."""
    with anyio.fail_after(timeout):
        while True:
            response = await client.responses.retrieve(response_id)
            if response.status in statuses:
                return response
            await anyio.sleep(0.02)


async def running(srv: LmspServer, response_id: str) -> None:
    """Until the response's task is ``running`` (the agent has the prompt)."""
    with anyio.fail_after(10):
        while (await srv.service.get_response(response_id)).status != "running":
            await anyio.sleep(0.01)


async def test_background_create_then_poll_to_completed(server: LmspServer) -> None:
    async with client_of(server) as client:
        created = await client.responses.create(model="reference", input="/sleep 100ms otters",
                                                background=True, metadata={"k": "v"})
        assert created.status in ("queued", "in_progress")
        assert created.background is True and created.output == []
        assert created.id.startswith("resp_") and created.metadata == {"k": "v"}
        done = await poll(client, created.id)
        assert done.status == "completed" and done.id == created.id
        assert done.output_text == "Echo: otters"
        assert done.background is True
        assert done.usage is not None and done.usage.output_tokens == 3
        again = await client.responses.retrieve(created.id)
        assert again.model_dump() == done.model_dump()


async def test_foreground_and_task_responses_are_retrievable(server: LmspServer) -> None:
    async with client_of(server) as client:
        foreground = await client.responses.create(model="reference", input="plain")
        assert foreground.status == "completed" and foreground.background is False
        stored = await client.responses.retrieve(foreground.id)
        assert stored.output_text == "Echo: plain" and stored.model_dump() == \
            foreground.model_dump()
        task = await server.create("via a task")
        await server.wait(task["id"])
        from_task = await client.responses.retrieve(task["response_id"])
        assert from_task.output_text == "Echo: via a task"


async def test_cancel_a_running_response_twice(server: LmspServer) -> None:
    async with client_of(server) as client:
        created = await client.responses.create(model="reference", input="/sleep 30s long",
                                                background=True)
        await running(server, created.id)
        first = await client.responses.cancel(created.id)
        assert first.status == "cancelled" and first.id == created.id
        second = await client.responses.cancel(created.id)   # idempotent, no error
        assert second.status == "cancelled"
        assert second.model_dump() == first.model_dump()
        assert (await client.responses.retrieve(created.id)).status == "cancelled"
        task = await server.service.get_response(created.id)
        assert task.status == "cancelled"


async def test_cancel_a_queued_response_at_once(tmp_path: Path, store_name: str) -> None:
    async with running_lmsp(tmp_path, max_running_tasks=0) as srv, client_of(srv) as client:
        created = await client.responses.create(model="reference", input="never runs",
                                                background=True)
        assert created.status == "queued"
        cancelled = await client.responses.cancel(created.id)
        assert cancelled.status == "cancelled" and cancelled.output == []


async def test_cancel_a_finished_response_is_refused(server: LmspServer) -> None:
    async with client_of(server) as client:
        done = await client.responses.create(model="reference", input="quick")
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.cancel(done.id)
        assert caught.value.code == "response_not_cancelable"
        assert caught.value.response.headers["x-should-retry"] == "false"
        failed = await client.responses.create(model="reference", input="/fail x",
                                               background=True)
        assert (await poll(client, failed.id)).status == "failed"
        with pytest.raises(openai.BadRequestError):
            await client.responses.cancel(failed.id)


async def test_delete(server: LmspServer) -> None:
    async with client_of(server) as client:
        done = await client.responses.create(model="reference", input="to delete",
                                             background=True)
        await poll(client, done.id)
        raw = await client.responses.with_raw_response.delete(done.id)
        assert raw.http_response.status_code == 200
        assert raw.http_response.json() == {"id": done.id, "object": "response.deleted",
                                            "deleted": True}
        with pytest.raises(openai.NotFoundError) as caught:
            await client.responses.retrieve(done.id)
        assert caught.value.code == "response_not_found"
        with pytest.raises(openai.NotFoundError):
            await client.responses.delete(done.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.cancel(done.id)


async def test_delete_of_an_unfinished_response_is_a_conflict(server: LmspServer) -> None:
    async with client_of(server) as client:
        created = await client.responses.create(model="reference", input="/sleep 30s x",
                                                background=True)
        with pytest.raises(openai.ConflictError) as caught:
            await client.responses.delete(created.id)
        assert caught.value.code == "response_in_progress"
        await client.responses.cancel(created.id)
        await client.responses.delete(created.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(created.id)


async def test_store_false(server: LmspServer) -> None:
    async with client_of(server) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model="reference", input="x", background=True,
                                          store=False)
        assert caught.value.code == "invalid_request"
        assert caught.value.param == "store"
        unstored = await client.responses.create(model="reference", input="gone", store=False)
        assert unstored.output_text == "Echo: gone"
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(unstored.id)


async def test_unknown_ids(server: LmspServer) -> None:
    async with client_of(server) as client:
        for call in (client.responses.retrieve, client.responses.cancel,
                     client.responses.delete):
            with pytest.raises(openai.NotFoundError) as caught:
                await call("resp_nope")
            assert caught.value.code == "response_not_found"
            assert caught.value.response.headers["content-type"] == "application/problem+json"
        with pytest.raises(openai.NotFoundError) as caught:
            await client.responses.create(model="reference", input="x",
                                          previous_response_id="resp_nope")
        assert caught.value.code == "response_not_found"
        assert caught.value.param == "previous_response_id"


async def test_sdk_errors_say_why(server: LmspServer) -> None:
    """The SDK puts only an error's ``message`` member in its exception text: without
    one every failure read "Error code: 404", whatever the server explained."""
    async with client_of(server) as client:
        with pytest.raises(openai.NotFoundError) as caught:
            await client.responses.retrieve("resp_nope")
        assert str(caught.value) == "Error code: 404 - No response 'resp_nope'."
        with pytest.raises(openai.NotFoundError) as caught:
            await client.responses.create(model="nope", input="x")
        assert "reference" in str(caught.value)          # the models there are
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model="reference", input="x", background=True,
                                          store=False)
        assert str(caught.value).startswith("Error code: 400 - ")
        assert caught.value.param == "store"
    answer = await server.client.get("/lmsp/v1/responses/resp_nope")
    body = answer.json()
    assert body["message"] == body["detail"]


async def test_instructions_and_max_output_tokens_are_echoed(server: LmspServer) -> None:
    """As OpenAI's response object repeats them (the SDK's ``Response`` has both): they
    read ``None`` whatever was asked, on the answer, on retrieve and in the events."""
    async with client_of(server) as client:
        done = await client.responses.create(model="reference", input="hi",
                                             instructions="be brief", max_output_tokens=50)
        assert (done.instructions, done.max_output_tokens) == ("be brief", 50)
        again = await client.responses.retrieve(done.id)
        assert (again.instructions, again.max_output_tokens) == ("be brief", 50)
        async for event in await client.responses.retrieve(done.id, stream=True):
            if event.type in ("response.created", "response.completed"):
                assert event.response.instructions == "be brief"
        plain = await client.responses.create(model="reference", input="hi")
        assert (plain.instructions, plain.max_output_tokens) == (None, None)


async def test_bad_stream_flag_is_a_problem(server: LmspServer) -> None:
    done = await server.client.post("/lmsp/v1/responses",
                                    json={"model": "reference", "input": "x"})
    answer = await server.client.get(f"/lmsp/v1/responses/{done.json()['id']}",
                                     params={"stream": "maybe"})
    assert answer.status_code == 400 and answer.json()["code"] == "invalid_request"
    for params in ({"stream": "true", "starting_after": "abc"},
                   {"stream": "true", "starting_after": "999"}):   # past the last event
        answer = await server.client.get(f"/lmsp/v1/responses/{done.json()['id']}",
                                         params=params)
        assert answer.status_code == 400 and answer.json()["param"] == "starting_after"
    answer = await server.client.post("/lmsp/v1/responses", json={
        "model": "reference", "input": "x", "background": "yes"})
    assert answer.status_code == 400 and answer.json()["param"] == "background"
    answer = await server.client.post("/lmsp/v1/responses", json={
        "model": "reference", "input": "x", "previous_response_id": 7})
    assert answer.status_code == 400 and answer.json()["param"] == "previous_response_id"


async def test_idempotent_background_create(server: LmspServer) -> None:
    async with client_of(server) as client:
        key = {"Idempotency-Key": "bg-1"}
        first = await client.responses.with_raw_response.create(
            model="reference", input="/sleep 200ms once", background=True, extra_headers=key)
        again = await client.responses.with_raw_response.create(
            model="reference", input="/sleep 200ms once", background=True, extra_headers=key)
        assert again.headers["idempotent-replayed"] == "true"
        assert again.parse().id == first.parse().id


# -- previous_response_id ------------------------------------------------------------------
async def _conversation(srv: LmspServer, client: AsyncOpenAI) -> list[Any]:
    first = await client.responses.create(model="reference", input="My name is Ada.")
    second = await client.responses.create(model="reference", input="/history Who am I?",
                                           previous_response_id=first.id, background=True)
    second = await poll(client, second.id)
    third = await client.responses.create(model="reference", input="/history And now?",
                                          previous_response_id=second.id)
    return [first, second, third]


def _check_conversation(turns: list[Any]) -> None:
    first, second, third = turns
    assert first.output_text == "Echo: My name is Ada."
    assert second.previous_response_id == first.id
    assert second.output_text.splitlines() == [
        "History:", "user: My name is Ada.", "assistant: Echo: My name is Ada.",
        "Echo: Who am I?"]
    assert third.output_text.splitlines() == [
        "History:", "user: My name is Ada.", "assistant: Echo: My name is Ada.",
        "user: /history Who am I?", *("assistant: " + second.output_text).splitlines(),
        "Echo: And now?"]


async def test_previous_response_id_reuses_the_live_session(server: LmspServer) -> None:
    bridge = server.service.models["reference"][0]
    async with client_of(server) as client:
        turns = await _conversation(server, client)
    _check_conversation(turns)
    # one ACP session carried the whole conversation and is kept for the next turn
    assert len(server.service.runner.sessions) == 1 and len(bridge.sessions()) == 1


async def test_previous_response_id_gives_a_fresh_session_the_history(
        tmp_path: Path, store_name: str) -> None:
    config = LmspConfig(live_sessions=0)   # nothing kept: every turn gets the history
    async with running_lmsp(tmp_path, config=config) as srv, client_of(srv) as client:
        turns = await _conversation(srv, client)
        bridge = srv.service.models["reference"][0]
        assert len(bridge.sessions()) == 0
    _check_conversation(turns)


async def test_history_survives_a_restart_on_the_same_store(tmp_path: Path,
                                                            store_name: str) -> None:
    async with running_lmsp(tmp_path) as srv, client_of(srv) as client:
        first = await client.responses.create(model="reference", input="Remember 42.")
    async with running_lmsp(tmp_path) as srv, client_of(srv) as client:
        second = await client.responses.create(model="reference", input="/history ?",
                                               previous_response_id=first.id)
    assert second.output_text.splitlines() == [
        "History:", "user: Remember 42.", "assistant: Echo: Remember 42.", "Echo: ?"]


async def test_previous_response_still_running_is_a_conflict(server: LmspServer) -> None:
    async with client_of(server) as client:
        slow = await client.responses.create(model="reference", input="/sleep 30s slow",
                                             background=True)
        with pytest.raises(openai.ConflictError) as caught:
            await client.responses.create(model="reference", input="next",
                                          previous_response_id=slow.id)
        assert caught.value.code == "response_in_progress"
        await client.responses.cancel(slow.id)
        after = await client.responses.create(model="reference", input="/history next",
                                              previous_response_id=slow.id)
        # a cancelled turn is history too: its input, and no output
        assert after.output_text.splitlines() == [
            "History:", "user: /sleep 30s slow", "Echo: next"]


# -- streams -------------------------------------------------------------------------------
async def read_stream(stream: Any, limit: int | None = None) -> list[Any]:
    """Events of an SDK stream until it ends (or ``limit`` of them, then drop it)."""
    events: list[Any] = []
    with anyio.fail_after(15):
        async for event in stream:
            events.append(event)
            if limit is not None and len(events) >= limit:
                break
    await stream.close()
    return events


async def test_background_stream_dropped_then_resumed(server: LmspServer) -> None:
    async with client_of(server) as client:
        stream = await client.responses.create(
            model="reference", input="/sleep 300ms /chunks 12 " + "word " * 24,
            background=True, stream=True)
        head = await read_stream(stream, limit=2)   # created, in_progress: then the client drops
        assert [e.type for e in head] == ["response.created", "response.in_progress"]
        response_id = head[0].response.id
        assert head[0].response.background is True
        tail = await read_stream(await client.responses.retrieve(
            response_id, stream=True, starting_after=head[-1].sequence_number))
        events = head + tail
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[-1].type == "response.completed"
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert len(deltas) == 12
        done = await client.responses.retrieve(response_id)
        assert done.status == "completed" and "".join(deltas) == done.output_text
        # any cursor resumes right after it; the whole log from the start without one
        middle = await read_stream(await client.responses.retrieve(
            response_id, stream=True, starting_after=5))
        assert [e.sequence_number for e in middle] == list(range(6, len(events)))
        whole = await read_stream(await client.responses.retrieve(response_id, stream=True))
        assert [e.model_dump() for e in whole] == [e.model_dump() for e in events]
        # at the end: 204, an empty stream
        after = await read_stream(await client.responses.retrieve(
            response_id, stream=True, starting_after=events[-1].sequence_number))
        assert after == []


async def test_stream_of_a_cancelled_response(server: LmspServer) -> None:
    async with client_of(server) as client:
        created = await client.responses.create(model="reference", input="/sleep 30s x",
                                                background=True)
        await running(server, created.id)
        await client.responses.cancel(created.id)
        events = await read_stream(await client.responses.retrieve(created.id, stream=True))
        assert [e.type for e in events] == ["response.created", "response.in_progress",
                                            "response.cancelled"]
        # not in the SDK's event union (an LMSP extension): it gets the plain payload
        assert events[-1].response["status"] == "cancelled"


async def test_foreground_stream_dropped_is_cancelled(server: LmspServer) -> None:
    async with client_of(server) as client:
        stream = await client.responses.create(model="reference", input="/sleep 30s x",
                                               stream=True)
        head = await read_stream(stream, limit=2)
        cancelled = await poll(client, head[0].response.id)
        assert cancelled.status == "cancelled"


async def test_expired_event_history_is_410(tmp_path: Path, store_name: str) -> None:
    config = LmspConfig(event_retention_s=0)   # events expire as soon as the task ends
    async with running_lmsp(tmp_path, config=config) as srv, client_of(srv) as client:
        done = await client.responses.create(model="reference", input="old")
        assert (await client.responses.retrieve(done.id)).output_text == "Echo: old"
        with pytest.raises(openai.APIStatusError) as caught:
            await client.responses.retrieve(done.id, stream=True, starting_after=0)
        assert caught.value.status_code == 410
        assert caught.value.code == "event_history_expired"


async def test_expired_response_is_404(tmp_path: Path, store_name: str) -> None:
    config = LmspConfig(task_retention_s=0)   # records expire as soon as the task ends
    async with running_lmsp(tmp_path, config=config) as srv, client_of(srv) as client:
        created = await client.responses.create(model="reference", input="brief",
                                                background=True)
        with anyio.fail_after(10), pytest.raises(openai.NotFoundError) as caught:
            while True:   # retrievable while unfinished, gone once it has ended
                response = await client.responses.retrieve(created.id)
                assert response.status in ("queued", "in_progress")
                await anyio.sleep(0.01)
        assert caught.value.code == "response_not_found"
        assert (await srv.service.store.get_by_response(created.id)) is not None  # not purged
        with pytest.raises(openai.NotFoundError):
            await client.responses.create(model="reference", input="x",
                                          previous_response_id=created.id)
