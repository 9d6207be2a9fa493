"""The runner against a server under test that sends what no server should: an event
stream whose line never ends, an answer that never ends. Each check that meets it fails
naming the cap, the run finishes and reports; the runner holds no more than its caps
(``acp_server.conformance.context.MAX_ANSWER_BYTES``, ``MAX_EVENT_BYTES``). It used to
read on for as long as the server sent (httpx's lines and bodies are unbounded)."""

from __future__ import annotations

import contextlib
import re
from typing import Any

import anyio
import pytest

from acp_server.conformance import run_conformance
from acp_server.conformance.context import MAX_ANSWER_BYTES, MAX_EVENT_BYTES
from tests.conformance.broken import Asgi, matches
from tests.conformance.server import FAST, running_target

pytestmark = pytest.mark.anyio

CHUNK = b"x" * 65536
# What one endless answer sends at most: 4x the runner's larger cap. Past it the server
# stops, so a runner whose cap broke fails the test clearly instead of reading until
# CI's timeout.
BUDGET = 4 * max(MAX_ANSWER_BYTES, MAX_EVENT_BYTES)


class Endless:
    """A middleware: requests ``method`` + ``path`` (a regex) are answered 200 with
    ``head`` and then bytes without a line end, until the client goes or ``BUDGET``
    bytes were sent (``over_budget``: the runner did not stop at its cap)."""

    def __init__(self, method: str, path: str, head: bytes, content_type: bytes) -> None:
        self.method, self.pattern = method, re.compile(path)
        self.head, self.content_type = head, content_type
        self.over_budget = False

    def wrap(self, app: Asgi) -> Asgi:
        async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if not matches(scope, self.method, self.pattern):
                return await app(scope, receive, send)
            async with anyio.create_task_group() as tg:
                async def until_gone() -> None:   # a send after it may not fail (uvicorn)
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(until_gone)
                with contextlib.suppress(Exception):   # the client went away: the point
                    await self._send(send)
                tg.cancel_scope.cancel()
        return asgi

    async def _send(self, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", self.content_type)]})
        await send({"type": "http.response.body", "body": self.head, "more_body": True})
        sent = len(self.head)
        while sent < BUDGET:
            await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
            sent += len(CHUNK)
            await anyio.sleep(0)
        self.over_budget = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})


@pytest.mark.parametrize(("method", "path", "head", "kind", "said"), [
    ("GET", r"/session/[^/]+/events", b"data: ", b"text/event-stream", "line over"),
    ("POST", r"/session", b'{"sessionId": "', b"application/json", "answered more than"),
])
async def test_a_server_that_never_stops_sending_fails_checks_not_the_runner(
        tmp_path: Any, method: str, path: str, head: bytes, kind: bytes, said: str) -> None:
    endless = Endless(method, path, head, kind)
    async with running_target(tmp_path, wrap=endless.wrap) as url:
        with anyio.fail_after(120):   # a bound against a hang, not a timing assertion
            report = await run_conformance(url, options=FAST, suites=["backpressure"])
    assert not endless.over_budget, (
        f"the server sent its whole budget ({BUDGET} bytes) and stopped: the runner did "
        f"not stop reading at its cap")
    failed = [r for r in report.results if r.outcome == "fail"]
    assert failed, [(r.id, r.outcome) for r in report.results]
    assert any(said in (r.detail or "") for r in failed), [(r.id, r.detail) for r in failed]
    assert report.exit_status() == 1
