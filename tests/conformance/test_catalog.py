"""The catalogue of checks, the reports and the runner's independence from the server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from acp_server.conformance import CHECKS, SUITES, Options, Report, Result
from acp_server.conformance.context import Context

CATALOGUE_PAGE = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"


def test_every_check_has_a_stable_id_a_suite_a_level_and_a_reference():
    for check_id, check in CHECKS.items():
        assert re.fullmatch(r"[a-z-]+(\.[a-z0-9-]+)+", check_id), check_id
        assert check.suite in SUITES and check.level in ("MUST", "SHOULD")
        assert check.reference and "\n" not in check.reference and "|" not in check.reference
    assert {check.suite for check in CHECKS.values()} == set(SUITES)


def test_the_conformance_page_lists_every_check_with_its_level_and_reference():
    text = CATALOGUE_PAGE.read_text()
    for check in CHECKS.values():
        assert f"| `{check.id}` | {check.level} | {check.reference} |" in text, check.id


def test_only_a_failed_must_check_fails_the_run():
    must, should = "backpressure.refusal.retry-after", "acp-http.status.409"
    assert CHECKS[must].level == "MUST" and CHECKS[should].level == "SHOULD"
    passing = Report("http://x", "2026-12-01T00:00:00Z",
                     [Result(must, "pass"), Result(should, "fail", "saw 200")])
    assert passing.exit_status() == 0
    assert passing.summary() == {"pass": 1, "fail": 1, "skip": 0, "must_failed": 0}
    failing = Report("http://x", "2026-12-01T00:00:00Z",
                     [Result(must, "fail", "saw no Retry-After"), Result(should, "skip", "n/a")])
    assert failing.exit_status() == 1
    document = json.loads(failing.json_bytes())
    assert document["checks"][0] == {"id": must, "suite": "backpressure", "level": "MUST",
                                     "outcome": "fail", "detail": "saw no Retry-After",
                                     "reference": CHECKS[must].reference}
    suites = ET.fromstring(failing.junit_bytes()).findall("testsuite")
    assert [(s.get("name"), s.get("failures"), s.get("skipped")) for s in suites] == [
        ("backpressure", "1", "0"), ("acp-http", "0", "1")]


def test_the_hold_and_fail_prompts_default_only_on_our_reference_agent():
    ours = Context(None, Options())  # type: ignore[arg-type]
    ours.capabilities = {"agents": {"default": "reference", "available": ["reference"]}}
    assert ours.hold_prompt is not None and ours.hold_prompt.startswith("/sleep 5s")
    assert ours.fail_prompt is not None and ours.fail_prompt.startswith("/fail")
    foreign = Context(None, Options())  # type: ignore[arg-type]
    foreign.capabilities = {"limits": {"maxPendingPromptsPerSession": 5}}
    assert foreign.hold_prompt is None and foreign.fail_prompt is None
    given = Context(None, Options(hold_prompt="SLOW"))  # type: ignore[arg-type]
    assert given.hold_prompt == "SLOW"


def test_the_runner_imports_nothing_of_the_server():
    code = ("import sys, acp_server.conformance.cli; print('\\n'.join(m for m in sys.modules "
            "if m.startswith(('acp_server', 'bridge'))))")
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                            text=True, timeout=60).stdout.split()
    # acp_server.bearer: the token check the SDK shares, importing nothing of ours
    assert [m for m in loaded if not m.startswith((
        "acp_server.conformance", "acp_server.client", "acp_server.bearer"))] == ["acp_server"]
