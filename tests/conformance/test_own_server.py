"""The runner against our own server (REST, /acp, LMSP on the reference agent): every
check passes, under asyncio and trio."""

from __future__ import annotations

import dataclasses

import pytest

from acp_server.conformance import CHECKS, SUITES, run_conformance
from acp_server.conformance.runner import TargetUnreachable
from tests.conformance.conftest import KNOWN_FAILING
from tests.conformance.server import FAST, running_target

pytestmark = pytest.mark.anyio


async def test_every_check_passes_against_our_server(tmp_path):
    async with running_target(tmp_path) as url:
        report = await run_conformance(url, options=FAST)
    assert [r.id for r in report.results] == list(CHECKS)       # all suites advertised
    assert {r.suite for r in report.results} == set(SUITES)
    failed = {r.id: r.detail for r in report.results
              if r.outcome != "pass" and r.id not in KNOWN_FAILING}
    assert failed == {}


async def test_session_load_streams_the_history_before_its_answer(tmp_path):
    async with running_target(tmp_path) as url:
        report = await run_conformance(url, options=FAST, suites=["acp-http"])
    result = next(r for r in report.results if r.id == "acp-http.load.history-first")
    assert result.outcome == "pass", result.detail


async def test_a_disabled_cap_skips_the_filling_checks(tmp_path):
    async with running_target(tmp_path, limit=0) as url:
        report = await run_conformance(url, options=FAST, suites=["backpressure"])
    outcomes = {r.id: r.outcome for r in report.results}
    assert outcomes.pop("backpressure.capabilities.limit") == "pass"     # null is valid
    assert outcomes.pop("backpressure.failure.no-poison") == "pass"      # needs no cap
    assert set(outcomes.values()) == {"skip"}
    assert all("disabled" in r.detail for r in report.results if r.outcome == "skip")
    assert report.exit_status() == 0


async def test_the_token_is_sent_on_every_request_and_the_websocket(tmp_path):
    async with running_target(tmp_path, token="s3cret") as url:
        report = await run_conformance(url, options=dataclasses.replace(FAST, token="s3cret"))
        with pytest.raises(TargetUnreachable, match=r"refused the credentials \(401\)"):
            await run_conformance(url, options=FAST, suites=["acp-http"])   # no token
    assert {r.id for r in report.results if r.outcome != "pass"} <= set(KNOWN_FAILING)
    assert len(report.results) == len(CHECKS)
