"""Background responses on two server instances sharing one PostgreSQL schema, through
the ``openai`` SDK: what A creates (and runs), B retrieves, cancels, continues and
deletes, and streams (resuming a stream dropped on A); B runs nothing (``--max-running-tasks 0``), so every run happens on A.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

from tests.lmsp import stores
from tests.lmsp.test_background import read_stream
from tests.lmsp.test_background_restart import Server, poll

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only; the servers are their own processes


@pytest.fixture
def shared(tmp_path: Path) -> list[str]:
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    return ["--store", stores.postgres_url_for(tmp_path, "shared")]


@pytest.fixture
async def pair(tmp_path: Path, shared: list[str]) -> AsyncIterator[tuple[Server, Server]]:
    a = Server(shared, tmp_path / "a", max_running=2)
    try:
        b = Server(shared, tmp_path / "b", max_running=0)
    except BaseException:
        await a.aclose()
        raise
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


async def test_created_on_a_retrieved_on_b(pair: tuple[Server, Server]) -> None:
    a, b = pair
    created = await a.client.responses.create(model="reference", input="/sleep 200ms hi",
                                              background=True)
    done = await poll(b.client, created.id)
    assert done.status == "completed" and done.output_text == "Echo: hi"
    assert (await a.client.responses.retrieve(created.id)).model_dump() == done.model_dump()


async def test_cancel_on_b_what_runs_on_a(pair: tuple[Server, Server]) -> None:
    a, b = pair
    created = await a.client.responses.create(model="reference", input="/sleep 30s long",
                                              background=True)
    await poll(b.client, created.id, {"in_progress"})
    cancelled = await b.client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"   # A stopped its agent; B saw it committed
    assert (await b.client.responses.cancel(created.id)).status == "cancelled"
    assert (await a.client.responses.retrieve(created.id)).status == "cancelled"


async def test_continue_on_b_and_delete_on_b(pair: tuple[Server, Server]) -> None:
    a, b = pair
    first = await a.client.responses.create(model="reference", input="I live on A.")
    second = await b.client.responses.create(model="reference", input="/history where?",
                                             previous_response_id=first.id)
    assert second.output_text.splitlines() == [
        "History:", "user: I live on A.", "assistant: Echo: I live on A.", "Echo: where?"]
    for response in (second, first):
        await b.client.responses.delete(response.id)
        for client in (a.client, b.client):
            with pytest.raises(openai.NotFoundError):
                await client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        await a.client.responses.create(model="reference", input="x",
                                        previous_response_id=first.id)


async def test_stream_on_a_dropped_resumed_on_b(pair: tuple[Server, Server]) -> None:
    a, b = pair
    stream = await a.client.responses.create(
        model="reference", input="/sleep 300ms /chunks 10 " + "word " * 20,
        background=True, stream=True)
    head = await read_stream(stream, limit=2)
    tail = await read_stream(await b.client.responses.retrieve(
        head[0].response.id, stream=True, starting_after=head[-1].sequence_number))
    events = head + tail
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    assert sum(e.type == "response.output_text.delta" for e in events) == 10
    whole = await read_stream(await b.client.responses.retrieve(head[0].response.id, stream=True))
    assert [e.model_dump() for e in whole] == [e.model_dump() for e in events]
