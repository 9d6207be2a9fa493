"""The runner against our own server (REST, /acp, LMSP on the reference agent): every
check passes, under asyncio and trio."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
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


class _SessionStreamsLate(httpx.AsyncBaseTransport):
    """The runner's transport, with every ``/acp`` session stream's bytes held back
    once ``session/load`` is posted until the connection stream has delivered its
    answer: the order in which a loaded machine may wake the runner's two readers."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.load_posted = False
        self.answered = anyio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and b'"session/load"' in request.content:
            self.load_posted = True
        response = await self.inner.handle_async_request(request)
        if request.method == "GET" and request.url.path == "/acp":
            session = "acp-session-id" in request.headers
            response.stream = _Held(self, response.stream, session)   # type: ignore[arg-type]
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Held(httpx.AsyncByteStream):
    def __init__(self, owner: _SessionStreamsLate, inner: Any, session: bool) -> None:
        self.owner, self.inner, self.session = owner, inner, session

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            if self.session and self.owner.load_posted:
                await self.owner.answered.wait()
            elif not self.session and self.owner.load_posted and b'"id":3,' in chunk:
                self.owner.answered.set()
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_the_history_read_after_the_answer_still_counts_as_first(tmp_path):
    """The session stream and the connection stream are two TCP connections: the
    runner read the answer first on a loaded machine, though the server wrote the
    history first (CI: "session/update before the answer: 0"). Here the runner's
    session stream is held until the answer is read; the check passes."""
    transport = _SessionStreamsLate()
    async with running_target(tmp_path) as url:
        report = await run_conformance(url, options=FAST, suites=["acp-http"],
                                       transport=transport)
    assert transport.answered.is_set()
    result = next(r for r in report.results if r.id == "acp-http.load.history-first")
    assert result.outcome == "pass", result.detail
