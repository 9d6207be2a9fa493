"""The runner against a server under test that sends what no server should: an event
stream whose line never ends, an answer that never ends. Each check that meets it fails
naming the cap, the run finishes and reports; the runner holds no more than its caps
(``acp_server.conformance.context.MAX_ANSWER_BYTES``, ``MAX_EVENT_BYTES``). It used to
read on for as long as the server sent (httpx's lines and bodies are unbounded)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from acp_server.conformance import run_conformance
from tests.conformance.broken import Asgi, matches
from tests.conformance.server import FAST, running_target

pytestmark = pytest.mark.anyio

CHUNK = b"x" * 65536


def endless(method: str, path: str, head: bytes, content_type: bytes
            ) -> Callable[[Asgi], Asgi]:
    """A middleware: requests ``method`` + ``path`` (a regex) are answered 200 with
    ``head`` and then bytes without end (no line end), until the client goes."""
    pattern = re.compile(path)

    def wrap(app: Asgi) -> Asgi:
        async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if not matches(scope, method, pattern):
                return await app(scope, receive, send)
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", content_type)]})
            try:
                await send({"type": "http.response.body", "body": head, "more_body": True})
                while True:
                    await send({"type": "http.response.body", "body": CHUNK,
                                "more_body": True})
                    await anyio.sleep(0)
            except Exception:   # noqa: BLE001 - the client went away: the point
                return
        return asgi
    return wrap


@pytest.mark.parametrize(("method", "path", "head", "kind", "said"), [
    ("GET", r"/session/[^/]+/events", b"data: ", b"text/event-stream", "line over"),
    ("POST", r"/session", b'{"sessionId": "', b"application/json", "answered more than"),
])
async def test_a_server_that_never_stops_sending_fails_checks_not_the_runner(
        tmp_path: Any, method: str, path: str, head: bytes, kind: bytes, said: str) -> None:
    async with running_target(tmp_path, wrap=endless(method, path, head, kind)) as url:
        with anyio.fail_after(120):   # a bound against a hang, not a timing assertion
            report = await run_conformance(url, options=FAST, suites=["backpressure"])
    failed = [r for r in report.results if r.outcome == "fail"]
    assert failed, [(r.id, r.outcome) for r in report.results]
    assert any(said in (r.detail or "") for r in failed), [(r.id, r.detail) for r in failed]
    assert report.exit_status() == 1
