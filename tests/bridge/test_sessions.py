"""Sessions: create, attach, load, resume, limits, clients, permissions, the reaper."""

from __future__ import annotations

import uuid

import anyio
import pytest

from bridge.errors import (
    InvalidClientIdError,
    InvalidPermissionOptionError,
    PermissionNotFoundError,
    SessionClosedError,
    SessionIdNotHonoredError,
    SessionLimitExceededError,
    SessionNotFoundError,
    WorkspaceMismatchError,
)
from tests.bridge.helpers import drain, envelope, open_bridge, text, wait_until

pytestmark = pytest.mark.anyio


async def test_attach_reuses_default_session_with_new_client_ids(tmp_path):
    async with open_bridge(tmp_path) as (bridge, agent):
        first, second = await bridge.attach_session(), await bridge.attach_session(cwd=str(tmp_path))
        assert first.session_id == second.session_id
        assert (first.attached, second.attached) == (False, True)
        assert first.client_id != second.client_id and first.client_id.startswith("client_")
        bridge.check_client(first.session_id, first.client_id)
        with pytest.raises(InvalidClientIdError):
            bridge.check_client(first.session_id, "client_unknown")
        thread = await bridge.create_session()
        assert thread.session_id != first.session_id


async def test_concurrent_attach_spawns_once(tmp_path):
    async with open_bridge(tmp_path) as (bridge, agent):
        infos = []

        async def attach() -> None:
            infos.append(await bridge.attach_session())

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(attach)
        assert len({i.session_id for i in infos}) == 1
        assert sum(1 for m, _ in agent.calls if m == "session/new") == 1


async def test_workspace_mismatch(tmp_path):
    async with open_bridge(tmp_path) as (bridge, agent):
        with pytest.raises(WorkspaceMismatchError) as info:
            await bridge.create_session(cwd="/somewhere/else")
        assert info.value.bound_workspace == bridge.workspace_cwd


async def test_session_limit_counts_live_and_in_flight(tmp_path):
    async with open_bridge(tmp_path, max_sessions=2) as (bridge, agent):
        await bridge.create_session()
        await bridge.create_session()
        with pytest.raises(SessionLimitExceededError) as info:
            await bridge.create_session()
        assert info.value.limit == 2
        # attaching an existing default session is free; spawning it is not
        with pytest.raises(SessionLimitExceededError):
            await bridge.attach_session()
        await bridge.close_session(bridge.sessions()[0].session_id)
        await bridge.attach_session()
        assert len(bridge.sessions()) == 2


async def test_requested_session_id(tmp_path):
    async with open_bridge(tmp_path) as (bridge, agent):
        wanted = str(uuid.uuid4())
        info = await bridge.create_session(session_id=wanted)
        assert info.session_id == wanted and not info.attached
        again = await bridge.create_session(session_id=wanted)
        assert again.attached


async def test_requested_session_id_not_honoured(tmp_path):
    async with open_bridge(tmp_path) as (bridge, agent):
        async def ignore_meta(method, params, original=agent.request):
            if method == "session/new":
                params = {k: v for k, v in params.items() if k != "_meta"}
            return await original(method, params)
        agent.request = ignore_meta
        with pytest.raises(SessionIdNotHonoredError):
            await bridge.create_session(session_id=str(uuid.uuid4()))
        assert bridge.sessions() == []


async def test_close_then_not_found_then_load(tmp_path):
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        await bridge.close_session(sid)
        with pytest.raises(SessionNotFoundError):
            bridge.send_prompt(sid, text("ok"))
        with pytest.raises(SessionNotFoundError):
            await bridge.close_session(sid)
        loaded = await bridge.load_session(sid)
        assert loaded.session_id == sid and not loaded.attached
        assert ("session/load", {"cwd": bridge.workspace_cwd, "mcpServers": [], "sessionId": sid}) in agent.calls
        assert (await bridge.load_session(sid)).attached
        assert (await bridge.resume_session(sid)).attached


async def test_first_responder_permission(tmp_path):
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        sub = bridge.subscribe(sid)
        ticket = bridge.send_prompt(sid, text("perm"))
        await wait_until(lambda: bridge.permissions.pending_count == 1)
        request = envelope([f for f in drain(sub) if f.type == "permission_request"][0])
        request_id = request.data["requestId"]
        assert request.data["sessionId"] == sid and request.promptId == ticket.prompt_id
        assert [o["optionId"] for o in request.data["options"]] == ["yes", "no"]
        # an option it did not offer, or not a string at all (a dict raised TypeError)
        for wrong in ("maybe", {"x": 1}, [1], None, 1):
            with pytest.raises(InvalidPermissionOptionError):
                bridge.respond_to_permission(request_id,
                                             {"outcome": "selected", "optionId": wrong})
        with pytest.raises(PermissionNotFoundError):   # a vote through another session
            bridge.permissions.vote(request_id, {"outcome": "cancelled"}, session_id="nope")
        bridge.respond_to_permission(request_id, {"outcome": "selected", "optionId": "yes"},
                                     session_id=sid, voter_client_id="client_a")
        with pytest.raises(PermissionNotFoundError):
            bridge.respond_to_permission(request_id, {"outcome": "selected", "optionId": "no"})
        assert (await ticket).stop_reason == "yes"
        resolved = [f for f in drain(sub) if f.type == "permission_resolved"]
        assert len(resolved) == 1
        assert envelope(resolved[0]).data == {"requestId": request_id, "sessionId": sid,
                                               "outcome": {"outcome": "selected", "optionId": "yes"},
                                               "voterClientId": "client_a"}


async def test_permission_timeout_and_cancel(tmp_path):
    async with open_bridge(tmp_path, permission_response_timeout_ms=50) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        sub = bridge.subscribe(sid)
        assert (await bridge.send_prompt(sid, text("perm"))).stop_reason == "cancelled"
        resolved = [f for f in drain(sub) if f.type == "permission_resolved"]
        assert [e.data.reason for e in resolved] == ["timeout"]
        sub.close()
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        ticket = bridge.send_prompt(sid, text("perm"))
        await wait_until(lambda: bridge.permissions.pending_count == 1)
        await bridge.cancel_session(sid)
        assert bridge.permissions.pending_count == 0
        assert (await ticket).stop_reason == "cancelled"


async def test_idle_reaper_spares_busy_and_watched_sessions(tmp_path):
    async with open_bridge(tmp_path, session_idle_timeout_ms=1, session_reap_interval_ms=0) as (bridge, agent):
        idle = (await bridge.create_session()).session_id
        watched = (await bridge.create_session()).session_id
        busy = (await bridge.create_session()).session_id
        sub = bridge.subscribe(watched)
        ticket = bridge.send_prompt(busy, text("hold b"))
        await anyio.sleep(0.01)
        assert await bridge.reap_idle_sessions() == [idle]
        assert {s.session_id for s in bridge.sessions()} == {watched, busy}
        sub.close()
        agent.release("b")
        await ticket


async def test_reaper_task_runs(tmp_path):
    async with open_bridge(tmp_path, session_idle_timeout_ms=20, session_reap_interval_ms=10) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        await wait_until(lambda: not bridge.sessions(), timeout=30)
        with pytest.raises(SessionNotFoundError):
            bridge.get_session(sid)


async def test_stats(tmp_path):
    async with open_bridge(tmp_path, max_pending_prompts_per_session=0) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        tickets = [bridge.send_prompt(sid, text(f"hold s{i}")) for i in range(7)]
        await wait_until(lambda: bridge.get_session(sid).active is not None)
        stats = bridge.stats()
        assert (stats.pending_prompts, stats.queued_prompts, stats.active_prompts) == (7, 6, 1)
        for i in range(7):
            agent.release(f"s{i}")
        for t in tickets:
            await t
        assert bridge.stats().prompt_queue_wait.count == 7


async def test_one_cancel_resolves_each_permission_once(tmp_path):
    """A cancel (of the session, or of the prompt's ticket) cancels the session's
    permission requests once, before ``prompt_cancelled``."""
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        for cancel in ("session", "ticket"):
            sub = bridge.subscribe(sid)
            ticket = bridge.send_prompt(sid, text("perm"))
            await wait_until(lambda: bridge.permissions.pending_count == 1)
            if cancel == "session":
                assert await bridge.cancel_session(sid)
            else:
                ticket.cancel("client_cancel")
            assert bridge.permissions.pending_count == 0
            assert (await ticket).stop_reason == "cancelled"
            kinds = [(f.type, envelope(f).data.get("reason")) for f in drain(sub)
                     if f.type in ("permission_resolved", "prompt_cancelled")]
            permission_reason = "prompt_cancelled" if cancel == "session" else "cancelled"
            assert kinds == [("permission_resolved", permission_reason),
                             ("prompt_cancelled", "client_cancel")], kinds
            sub.close()


async def test_a_session_closed_before_its_worker_ran_runs_nothing(tmp_path):
    """``Session.start`` hands the worker to the bridge's task group and returns: a close
    that comes before the worker first ran ends it there, its prompt never sent."""
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        session = bridge.get_session(sid)
        ticket = bridge.send_prompt(sid, text("hold never"))
        await bridge.close_session(sid)
        with pytest.raises(SessionClosedError):
            await ticket
        await wait_until(lambda: session._scope.cancelled_caught or not session._work_added.waiting)
        assert "hold never" not in agent.prompts()
        assert session._side_scopes == set()


async def test_stop_ends_a_running_turn_and_its_deadline_timer(tmp_path):
    """A worker running a turn is cancelled by ``stop``, and the turn's deadline timer
    (a side task in the bridge's task group) with it: nothing of the session is left
    running, and the deadline never fires."""
    async with open_bridge(tmp_path, prompt_deadline_ms=60_000) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        session = bridge.get_session(sid)
        ticket = bridge.send_prompt(sid, text("stubborn k"))
        await wait_until(lambda: "stubborn k" in agent.prompts())
        # the deadline timer: started beside the worker (trio may run it after the turn
        # reached the agent: its scheduler's order among ready tasks is not fixed)
        await wait_until(lambda: len(session._side_scopes) == 1)
        await bridge.close_session(sid)
        with pytest.raises(SessionClosedError):
            await ticket
        await wait_until(lambda: session._scope.cancelled_caught and not session._side_scopes)


async def test_an_idle_session_stops_without_a_cancellation(tmp_path):
    """An idle worker is woken and returns: its scope is never cancelled."""
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        session = bridge.get_session(sid)
        await bridge.send_prompt(sid, text("hi"))
        await wait_until(lambda: session._work_added.waiting)   # idle, waiting for work
        await bridge.close_session(sid)
        await wait_until(lambda: not session._work_added.waiting)
        assert not session._scope.cancel_called


async def test_two_loads_of_one_session_while_its_agent_starts_make_one_session(tmp_path):
    """Two ``session/load`` of the same id before the agent ever started: the second
    waits for the first's agent start (``AgentPool.ensure``), then finds the session
    loaded by the first and attaches to it. (It used to load it again: a second
    ``Session`` replaced the first in the registry, the first left running unowned,
    its slot of the session cap never given back.)"""
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = str(uuid.uuid4())
        loaded = []

        async def load() -> None:
            loaded.append(await bridge.load_session(sid))

        async with anyio.create_task_group() as tg:
            tg.start_soon(load)
            tg.start_soon(load)
        assert sorted(info.attached for info in loaded) == [False, True]
        assert sum(m == "session/load" for m, _ in agent.calls) == 1
        assert [s.session_id for s in bridge.sessions()] == [sid]
        assert bridge.capacity.taken == 1


async def test_a_prompt_sent_while_its_session_loads_fails_when_the_load_fails(tmp_path):
    """A session being loaded is registered before the agent answers ``session/load``
    (the load replays its history through it), so a prompt can be admitted meanwhile.
    When the load then fails, the session is dropped and that prompt fails with it
    (``SessionClosedError``): its caller was left waiting for ever."""
    from bridge.agents.base import RESOURCE_NOT_FOUND
    from bridge.errors import AgentError

    loading = anyio.Event()

    async with open_bridge(tmp_path) as (bridge, agent):
        answer = agent.request

        async def request(method: str, params: object) -> object:
            if method == "session/load":
                await loading.wait()
                raise AgentError(RESOURCE_NOT_FOUND, "Resource not found")
            return await answer(method, params)

        agent.request = request   # type: ignore[method-assign]
        sid = str(uuid.uuid4())
        async with anyio.create_task_group() as tg:
            async def load() -> None:
                with pytest.raises(SessionNotFoundError):
                    await bridge.load_session(sid)

            tg.start_soon(load)
            await wait_until(lambda: any(s.session_id == sid for s in bridge.sessions()))
            ticket = bridge.send_prompt(sid, text("hold k"))
            await wait_until(lambda: bridge.get_session(sid).pending_count == 1)
            loading.set()
        with anyio.fail_after(30), pytest.raises(SessionClosedError):
            await ticket
        assert bridge.sessions() == [] and bridge.capacity.taken == 0
        assert "hold k" not in agent.prompts()   # never sent for a session not loaded


async def test_a_prompt_sent_while_its_session_loads_reaches_the_agent_after_the_load(
        tmp_path):
    """A prompt admitted while the agent has not answered ``session/load`` yet waits for
    that answer: the agent gets ``session/prompt`` for a session it has loaded, never
    before; a second load attaching meanwhile waits for it too. Then both go on."""
    loading = anyio.Event()
    order: list[str] = []

    async with open_bridge(tmp_path) as (bridge, agent):
        answer = agent.request

        async def request(method: str, params: object) -> object:
            if method == "session/load":
                await loading.wait()
                order.append("loaded")
                return {}
            if method == "session/prompt":
                order.append("prompt")
            return await answer(method, params)

        agent.request = request   # type: ignore[method-assign]
        sid = str(uuid.uuid4())
        attached: list[object] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(bridge.load_session, sid)
            await wait_until(lambda: any(s.session_id == sid for s in bridge.sessions()))

            async def attach() -> None:
                attached.append(await bridge.load_session(sid))

            tg.start_soon(attach)
            ticket = bridge.send_prompt(sid, text("after the load"))
            await wait_until(lambda: bridge.get_session(sid).pending_count == 1)
            assert order == [] and attached == []   # both wait for the agent's answer
            loading.set()
        with anyio.fail_after(30):
            result = await ticket
        assert result.stop_reason == "end_turn"
        assert order == ["loaded", "prompt"] and len(attached) == 1


async def test_a_load_the_agent_refuses_makes_its_caller_no_owner(tmp_path):
    """A ``session/load`` the agent refuses undoes the session; its caller must not be
    remembered as the maker of that id (it used to be: a later load by the session's
    real maker, once the agent knew the id, then saw a session of someone else's)."""
    from bridge.agents.base import RESOURCE_NOT_FOUND
    from bridge.errors import AgentError

    async with open_bridge(tmp_path) as (bridge, agent):
        answer = agent.request
        refusing = True

        async def request(method: str, params: object) -> object:
            if method == "session/load" and refusing:
                raise AgentError(RESOURCE_NOT_FOUND, "Resource not found")
            return await answer(method, params)

        agent.request = request   # type: ignore[method-assign]
        sid = str(uuid.uuid4())
        with pytest.raises(SessionNotFoundError):
            await bridge.load_session(sid, owner="mallory")
        assert bridge.session_owner(sid) is None
        refusing = False
        loaded = await bridge.load_session(sid, owner="alice")
        assert not loaded.attached and bridge.session_owner(sid) == "alice"
