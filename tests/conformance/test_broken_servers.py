"""Each deliberately broken server breaks one rule: the runner fails exactly that check
and passes the rest of its suite."""

from __future__ import annotations

import pytest

from acp_server.conformance import CHECKS, run_conformance
from tests.conformance.broken import BROKEN
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
