"""Each deliberately broken server breaks one rule: the runner fails exactly that check
and passes the rest of its suite."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from acp_server.conformance import CHECKS, run_conformance
from tests.conformance.broken import BROKEN, Asgi, matches
from tests.conformance.conftest import KNOWN_FAILING
from tests.conformance.server import FAST, running_target

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("name", list(BROKEN))
async def test_a_broken_rule_fails_exactly_its_check(tmp_path, name):
    broken = BROKEN[name]
    target = dict(broken.target)
    if "wrap_factory" in target:          # a middleware with state of its own
        target["wrap"] = target.pop("wrap_factory")()
    async with running_target(tmp_path, **target) as url:
        report = await run_conformance(url, options=FAST, suites=[broken.suite])
    outcomes = {r.id: r.outcome for r in report.results}
    assert outcomes.pop(broken.fails) == "fail"
    failing = next(r for r in report.results if r.id == broken.fails)
    assert failing.detail        # what was sent and what was seen
    rest = {check_id: (outcome, next(r.detail for r in report.results if r.id == check_id))
            for check_id, outcome in outcomes.items()
            if outcome != "pass" and check_id not in KNOWN_FAILING}
    assert rest == {}
    assert report.exit_status() == (1 if CHECKS[broken.fails].level == "MUST" else 0)


def _slow_agent_once() -> Callable[[Asgi], Asgi]:
    """The first ``POST /session`` refused as ``qwen serve`` does when its agent starts
    too slowly (503, ``init_timeout``, ``retryable: true``); the rest reach the server."""
    def wrap(app: Asgi) -> Asgi:
        refused = False

        async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
            nonlocal refused
            if refused or not matches(scope, "POST", re.compile("/session")):
                return await app(scope, receive, send)
            refused = True
            body = json.dumps({"error": "agent did not initialize", "errorKind":
                               "init_timeout", "retryable": True}).encode()
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
        return asgi
    return wrap


async def test_a_session_refused_as_retryable_is_asked_again(tmp_path):
    """A refusal the server marks retryable is no check's failure: the runner asks for
    the session again (it failed ``backpressure.admission.exact-limit`` under load)."""
    async with running_target(tmp_path, wrap=_slow_agent_once()) as url:
        report = await run_conformance(url, options=FAST, suites=["backpressure"])
    assert {r.id: (r.outcome, r.detail) for r in report.results
            if r.outcome != "pass" and r.id not in KNOWN_FAILING} == {}
