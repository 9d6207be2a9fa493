"""The runner against a server under test that sends what no server should: an event
stream whose line never ends, an answer that never ends. Each check that meets it fails
naming the cap, the run finishes and reports; the runner holds no more than its caps
(``acp_server.conformance.context.MAX_ANSWER_BYTES``, ``MAX_EVENT_BYTES``). It used to
read on for as long as the server sent (httpx's lines and bodies are unbounded)."""

from __future__ import annotations

import contextlib
import gzip
import re
import tracemalloc
from typing import Any

import anyio
import pytest

from acp_server.conformance import run_conformance
from acp_server.conformance.context import MAX_ANSWER_BYTES, MAX_EVENT_BYTES, Context
from acp_server.conformance.runner import discover
from tests.conformance.broken import Asgi, matches, rewrite
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


# -- a proxy that compresses, JSON nested deeper than a decoder recurses ----------------------
BOMB = gzip.compress(b'{"sessionId": "' + b" " * (256 * 1024 * 1024), 9)   # -> 256 MiB
# What the runner may hold at once: a few sessions are created at once, each answer up to
# the cap (about 56 MiB is held today; inflating whole raw chunks held about 400 MiB).
HELD = 8 * MAX_ANSWER_BYTES
DEEP = b"[" * 100_000 + b"]" * 100_000


def _bomb(path: str, status: int, headers: list[tuple[bytes, bytes]], body: bytes
          ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    headers = [(k, v) for k, v in headers if k.lower() != b"content-type"]
    return 200, headers + [(b"content-type", b"application/json"),
                           (b"content-encoding", b"gzip")], BOMB


def _deep(path: str, status: int, headers: list[tuple[bytes, bytes]], body: bytes
          ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    return 200, headers, b'{"sessionId": "s", "x": ' + DEEP + b"}"


async def test_a_compressed_bomb_is_inflated_within_the_runners_cap(tmp_path: Any) -> None:
    """A proxy compressing the answer of POST /session into a gzip bomb: the checks that
    create a session fail naming the cap, the runner holding at most its cap and a step
    (it used to inflate a whole raw chunk, ~64 MiB, before counting)."""
    tracemalloc.start()
    try:
        async with running_target(tmp_path, wrap=rewrite("POST", "/session", edit=_bomb)) as url:
            tracemalloc.reset_peak()
            with anyio.fail_after(120):   # a bound against a hang, not a timing assertion
                report = await run_conformance(url, options=FAST, suites=["backpressure"])
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < HELD, f"the runner held {peak} bytes at once"
    failed = [r for r in report.results if r.outcome == "fail"]
    assert any("answered more than 16 MiB" in r.detail for r in failed), \
        [(r.id, r.detail) for r in report.results]


async def test_deeply_nested_json_fails_checks_not_the_runner(tmp_path: Any) -> None:
    async with running_target(tmp_path, wrap=rewrite("POST", "/session", edit=_deep)) as url:
        with anyio.fail_after(120):
            report = await run_conformance(url, options=FAST, suites=["backpressure"])
    failed = [r for r in report.results if r.outcome == "fail"]
    assert failed and report.exit_status() == 1
    assert all("Traceback" not in r.detail for r in failed)


async def test_deeply_nested_capabilities_are_no_capabilities(tmp_path: Any) -> None:
    """What the runner discovers: /capabilities it cannot decode advertises nothing."""
    wrap = rewrite("GET", "/capabilities", edit=lambda p, s, h, b: (200, h, DEEP))
    async with running_target(tmp_path, wrap=wrap) as url:
        async with Context.open(url, FAST) as ctx:
            found = await discover(ctx)
    assert ctx.capabilities is None and "backpressure" not in found
