"""``--model-server``'s models listed again while the bridge runs
(``bridge.agents.catalog``, ``Bridge.add_agents`` / ``resolve_agent``), against the fake
OpenAI-compatible server on a loopback port, on an injected monotonic clock: a model
listed later is offered once the interval passed (never sooner), one listing serves
every caller, a failed listing changes nothing and is logged once, ``0`` lists only at
start, a model that leaves the listing keeps working, a configured agent's name stays
its own."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from bridge import Bridge, BridgeOptions
from bridge.agents.catalog import LOG_EVERY_S, MAX_OFFERED, ModelCatalog
from bridge.agents.model import ModelAgentFactory
from bridge.agents.reference import ReferenceAgentFactory
from bridge.errors import AgentNotFoundError
from tests.bridge.fake_model_server import FakeModelState, build_fake_model_app
from tests.bridge.helpers import text, wait_until
from tests.harness import serving

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def model_bridge(tmp_path: Path, url: str, clock: Clock, *, interval_s: float = 30,
                       max_sessions: int = 32
                       ) -> AsyncIterator[tuple[Bridge, ModelCatalog]]:
    """A bridge composed as ``acp_server.server`` composes it: the reference agent, a
    ``fake-small`` agent of its own (a configured name), the models listed."""
    configured = {"fake-small": ReferenceAgentFactory()}
    catalog = ModelCatalog(url, taken={"reference", *configured}, interval_s=interval_s,
                           clock=clock)
    models = await catalog.start()
    bridge = Bridge(ReferenceAgentFactory(), workspace_cwd=str(tmp_path),
                    options=BridgeOptions(max_sessions=max_sessions),
                    agents={**configured, **{m: ModelAgentFactory(url, model=m) for m in models}})
    bridge.agent_finder = catalog
    catalog.on_models = lambda new: bridge.add_agents(
        {m: ModelAgentFactory(url, model=m) for m in new})
    async with bridge, catalog:
        yield bridge, catalog


@contextlib.asynccontextmanager
async def fake_models() -> AsyncIterator[tuple[FakeModelState, str]]:
    state = FakeModelState()
    state.models = ["fake-small", "fake-large"]   # fake-small: a configured agent's name
    async with serving(build_fake_model_app(state)) as base:
        yield state, base + "/v1"


async def test_a_model_listed_later_is_offered_once_the_interval_passed(tmp_path: Path) -> None:
    clock = Clock()
    async with fake_models() as (state, url), \
            model_bridge(tmp_path, url, clock, max_sessions=8) as (bridge, catalog):
        assert bridge.agents.names == ["reference", "fake-small", "fake-large"]
        state.models.append("fake-new")
        clock.now += 29.9
        with pytest.raises(AgentNotFoundError):   # named within the interval: not listed
            await bridge.create_session(agent="fake-new")
        assert state.models_asked == 1
        clock.now += 0.1
        info = await bridge.create_session(agent="fake-new")   # named: listed again
        assert state.models_asked == 2 and catalog.listings == 2
        result = await bridge.send_prompt(info.session_id, text("hello"))
        assert result.stop_reason == "end_turn"
        assert state.requests[-1]["model"] == "fake-new"
        assert [a.name for a in bridge.list_agents()] == [
            "reference", "fake-small", "fake-large", "fake-new"]
        # its share of the cap: 4 agents now, a reserve of 8 // 8 each
        assert bridge.capacity.reserve == 1 and bridge.capacity.held("fake-new") == 1
        assert bridge.capacity.share("fake-new") == 8 - 3
        # known now: no listing for it, whatever the clock says
        clock.now += 30
        await bridge.create_session(agent="fake-new")
        assert state.models_asked == 2


async def test_one_listing_serves_every_caller(tmp_path: Path) -> None:
    clock = Clock()
    async with fake_models() as (state, url), \
            model_bridge(tmp_path, url, clock) as (bridge, catalog):
        state.models.append("fake-new")
        state.models_gate = anyio.Event()
        clock.now += 30
        made: list[str] = []

        async def create() -> None:
            made.append((await bridge.create_session(agent="fake-new")).session_id)

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(create)
            async with anyio.create_task_group() as leaver:   # a caller that gives up
                leaver.start_soon(bridge.refresh_agents)
                await wait_until(lambda: state.models_asked == 2)
                leaver.cancel_scope.cancel()
            await bridge.refresh_agents(wait_s=0)   # a listing read: waits at most wait_s
            assert "fake-new" not in bridge.agents and made == []
            state.models_gate.set()
        assert state.models_asked == 2 and len(made) == 3 and catalog.listings == 2


async def test_a_failed_listing_changes_nothing_and_is_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    caplog.set_level(logging.DEBUG, logger="acp_server")
    async with fake_models() as (state, url), \
            model_bridge(tmp_path, url, clock) as (bridge, catalog):
        state.models.append("fake-new")
        state.models_status = 503

        def errors() -> list[str]:
            return [r.getMessage() for r in caplog.records
                    if r.levelno >= logging.ERROR and "cannot list the models" in r.getMessage()]

        for _ in range(2):
            clock.now += 30
            with pytest.raises(AgentNotFoundError):
                await bridge.create_session(agent="fake-new")
        assert state.models_asked == 3
        assert len(errors()) == 1 and "answered 503" in errors()[0], errors()
        assert bridge.agents.names == ["reference", "fake-small", "fake-large"]
        clock.now += LOG_EVERY_S
        await bridge.refresh_agents()
        assert len(errors()) == 2   # the same cause, logged again after LOG_EVERY_S
        state.models_status = 200
        clock.now += 30
        await bridge.create_session(agent="fake-new")
        assert state.models_asked == 5


async def test_zero_lists_only_at_start(tmp_path: Path) -> None:
    clock = Clock()
    async with fake_models() as (state, url), \
            model_bridge(tmp_path, url, clock, interval_s=0) as (bridge, _catalog):
        state.models.append("fake-new")
        clock.now += 10_000
        with pytest.raises(AgentNotFoundError):
            await bridge.create_session(agent="fake-new")
        await bridge.refresh_agents()
        assert state.models_asked == 1 and "fake-new" not in bridge.agents


async def test_a_model_that_leaves_the_listing_keeps_working(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    caplog.set_level(logging.WARNING, logger="acp_server")
    async with fake_models() as (state, url), \
            model_bridge(tmp_path, url, clock) as (bridge, _catalog):
        sid = (await bridge.create_session(agent="fake-large")).session_id
        state.models = ["fake-small", "fake-other"]   # fake-large is gone from the listing
        clock.now += 30
        await bridge.refresh_agents()
        assert state.models_asked == 2 and "fake-other" in bridge.agents
        result = await bridge.send_prompt(sid, text("still there?"))
        assert result.stop_reason == "end_turn" and state.requests[-1]["model"] == "fake-large"
        again = await bridge.create_session(agent="fake-large")   # still offered
        assert again.session_id != sid
        assert "fake-large" in [a.name for a in bridge.list_agents()]
        # the configured agent named fake-small keeps its name: never the model's
        reply = await bridge.send_prompt(
            (await bridge.create_session(agent="fake-small")).session_id, text("hi"))
        assert reply.response is not None and all(
            r["model"] != "fake-small" for r in state.requests)
        clashes = [r for r in caplog.records if "not offering fake-small" in r.getMessage()]
        assert len(clashes) == 1   # logged once, not at every listing


async def test_a_model_the_bridge_could_not_take_is_handed_over_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``on_models`` raised (a bug, logged): the model is not counted as offered, so the
    next listing hands it over again, and a session can name it then (before, it was
    never offered until a restart)."""
    clock = Clock()
    caplog.set_level(logging.ERROR, logger="acp_server")
    async with fake_models() as (state, url), \
            model_bridge(tmp_path, url, clock) as (bridge, catalog):
        take = catalog.on_models
        assert take is not None
        handed: list[list[str]] = []

        def broken_once(new: list[str]) -> object:
            handed.append(new)
            if len(handed) == 1:
                raise RuntimeError("a bug in the bridge")
            return take(new)

        catalog.on_models = broken_once
        state.models.append("fake-new")
        clock.now += 30
        with pytest.raises(AgentNotFoundError):
            await bridge.create_session(agent="fake-new")
        assert "fake-new" not in catalog.offered
        assert any("could not offer fake-new" in r.getMessage() for r in caplog.records)
        clock.now += 30
        info = await bridge.create_session(agent="fake-new")
        assert handed == [["fake-new"], ["fake-new"]] and "fake-new" in catalog.offered
        assert info.agent == "fake-new"


async def test_the_models_offered_in_all_are_bounded(tmp_path: Path, caplog) -> None:
    """Listings only add, so a model server whose listing changes every time (an
    untrusted upstream, a proxy listing what it routes to) grew the agents without end,
    1000 at a time. At most ``MAX_OFFERED`` are offered in all; the rest is logged."""
    clock = Clock()
    async with fake_models() as (state, url), \
            model_bridge(tmp_path, url, clock) as (bridge, catalog):
        for listing in range(3):
            state.models = [f"m{listing}-{n}" for n in range(600)]
            clock.now += 30
            with caplog.at_level(logging.WARNING, logger="acp_server"):
                await bridge.refresh_agents()
        assert state.models_asked == 4
        assert len(catalog.offered) == MAX_OFFERED
        assert len(bridge.agents.names) == MAX_OFFERED + 2   # reference, fake-small
        assert list(catalog.offered)[-1] == f"m1-{MAX_OFFERED - 600 - 1 - 1}"
        full = [r.getMessage() for r in caplog.records if "offers" in r.getMessage()
                and "already" in r.getMessage()]
        assert len(full) == 1, full   # logged once
