"""``DaemonClient`` against the real daemon on loopback: every release point of the
local reservation, local rejection without a request, the 503 mapping, capabilities
pass-through, the 202 cursor, and the plain session methods."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_server.client import (CreateSessionRequest, DaemonClient, DaemonConnectionError,
                               DaemonEvent, DaemonHttpError, DaemonPendingPromptLimitError,
                               DaemonTurnError, PromptAccepted, PromptRequest)
from bridge import BridgeOptions
from tests.sdk.harness import Daemon, Recorder, closed_port_url, daemon, wait_until

pytestmark = pytest.mark.anyio


def chunks(events: list[DaemonEvent]) -> str:
    return "".join(e.data["update"]["content"]["text"] for e in events
                   if e.type == "session_update"
                   and e.data["update"]["sessionUpdate"] == "agent_message_chunk")


async def test_turn_complete_releases(server: Daemon) -> None:
    async with DaemonClient(server.url) as client:
        sid = (await client.create_or_attach_session()).session_id
        seen: list[DaemonEvent] = []
        result = await client.prompt(sid, "/chunks 4 hello there", on_event=seen.append)
        assert result.stop_reason == "end_turn"
        assert chunks(seen) == "Echo: hello there"
        assert {e.prompt_id for e in seen} == {result.prompt_id}
        assert client.pending_prompt_count(sid) == 0
        result = await client.prompt(sid, PromptRequest.text("/max_tokens again"))
        assert result.stop_reason == "max_tokens"
        assert client.pending_prompt_count(sid) == 0


async def test_turn_error_releases(server: Daemon) -> None:
    async with DaemonClient(server.url) as client:
        sid = (await client.create_or_attach_session()).session_id
        with pytest.raises(DaemonTurnError) as info:
            await client.prompt(sid, "/fail")
        assert info.value.status == 500
        assert info.value.prompt_id is not None
        assert "failure" in info.value.message
        assert client.pending_prompt_count(sid) == 0


async def test_an_agent_that_dies_mid_turn_raises_its_turn_error(server: Daemon) -> None:
    # The session's stream ends with the session (session_died); the turn's own end,
    # turn_error agent_died, comes first, so the caller learns why its turn ended
    # (before: "Event stream ... ended without the turn's completion"). The agent asks a
    # permission first, so the prompt's stream is surely open when it dies.
    async with DaemonClient(server.url) as client:
        sid = (await client.create_or_attach_session()).session_id
        asked: list[str] = []
        failed: list[DaemonTurnError] = []

        def seen(event: DaemonEvent) -> None:
            if event.type == "permission_request":
                asked.append(event.data["requestId"])

        async def prompt() -> None:
            try:
                await client.prompt(sid, "/permission /crash mid-turn", on_event=seen)
            except DaemonTurnError as exc:
                failed.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(prompt)
            await wait_until(lambda: bool(asked))
            vote = {"outcome": {"outcome": "selected", "optionId": "allow_once"}}
            assert await client.respond_to_permission(asked[0], vote, session_id=sid)
        [error] = failed
        assert error.code == "agent_died"
        assert error.session_id == sid
        assert client.pending_prompt_count(sid) == 0


async def test_caller_cancellation_releases_and_cancels(tmp_path: Path) -> None:
    recorder = Recorder()
    async with daemon(tmp_path, wrap=recorder.wrap) as srv, DaemonClient(srv.url) as client:
        sid = (await client.create_or_attach_session()).session_id
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def slow() -> None:
                with scope:
                    await client.prompt(sid, "/sleep 60s slow")

            tg.start_soon(slow)
            # the caller cancels once the prompt runs and its 202 has reached the client
            # (the client then follows the event stream)
            await wait_until(lambda: srv.bridge.get_session(sid).active is not None
                             and recorder.count("GET", "/events") == 1)
            scope.cancel()
        assert scope.cancelled_caught
        assert client.pending_prompt_count(sid) == 0
        # one stop request: POST /cancel once the client saw the turn start, else the
        # DELETE of the pending prompt, which cancels a running one too (as qwen does)
        assert (recorder.count("POST", f"/session/{sid}/cancel")
                + recorder.count("DELETE", "/pending-prompts/")) == 1
        # the server really stopped it: the slot is free again (long before the turn's
        # 60 s; the bound only against a hang, not a timing claim)
        with anyio.fail_after(30):
            result = await client.prompt(sid, "next")
        assert result.stop_reason == "end_turn"


async def test_cancelling_a_queued_prompt_removes_it(tmp_path: Path) -> None:
    recorder = Recorder()
    async with daemon(tmp_path, wrap=recorder.wrap) as srv, DaemonClient(srv.url) as client:
        sid = (await client.create_or_attach_session()).session_id
        async with anyio.create_task_group() as tg:
            first, second = anyio.CancelScope(), anyio.CancelScope()

            async def prompt(scope: anyio.CancelScope, text: str) -> None:
                with scope:
                    await client.prompt(sid, text)

            tg.start_soon(prompt, first, "/sleep 30s first")
            await wait_until(lambda: srv.bridge.get_session(sid).active is not None)
            tg.start_soon(prompt, second, "second, queued")
            # both 202s reached the client: it follows one event stream per prompt
            await wait_until(lambda: recorder.count("GET", "/events") == 2)
            second.cancel()
            await wait_until(lambda: client.pending_prompt_count(sid) == 1)
            assert recorder.count("DELETE", "/pending-prompts/" ) == 1
            assert recorder.count("POST", "/cancel") == 0  # the running prompt is not ours
            first.cancel()
        assert client.pending_prompt_count(sid) == 0


async def test_pre_cancelled_reserves_nothing(tmp_path: Path) -> None:
    recorder = Recorder()
    async with daemon(tmp_path, wrap=recorder.wrap) as srv, \
            DaemonClient(srv.url, max_pending_prompts_per_session=1) as client:
        sid = (await client.create_or_attach_session()).session_id
        with anyio.CancelScope() as scope:
            scope.cancel()
            await client.prompt(sid, "never sent")
        assert client.pending_prompt_count(sid) == 0
        assert recorder.count("POST", "/prompt") == 0


async def test_local_rejection_sends_no_request(tmp_path: Path) -> None:
    recorder = Recorder()
    async with daemon(tmp_path, wrap=recorder.wrap) as srv, \
            DaemonClient(srv.url, max_pending_prompts_per_session=1) as client:
        sid = (await client.create_or_attach_session()).session_id
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.prompt, sid, "/sleep 60s held")   # cancelled below
            await wait_until(lambda: recorder.count("POST", "/prompt") == 1)
            assert client.pending_prompt_count(sid) == 1
            with pytest.raises(DaemonPendingPromptLimitError) as info:
                await client.prompt(sid, "one too many")
            assert sid in str(info.value)
            assert (info.value.limit, info.value.pending_count) == (1, 1)
            assert recorder.count("POST", "/prompt") == 1
            tg.cancel_scope.cancel()
        assert client.pending_prompt_count(sid) == 0


async def test_server_queue_full_maps_with_local_cap_disabled(tmp_path: Path) -> None:
    options = BridgeOptions(max_pending_prompts_per_session=2)
    async with daemon(tmp_path, options=options) as srv, \
            DaemonClient(srv.url, max_pending_prompts_per_session=0) as client:
        sid = (await client.create_or_attach_session()).session_id
        for _ in range(2):
            accepted = await client.prompt_nonblocking(sid, "/sleep 60s held")   # closed below
            assert isinstance(accepted, PromptAccepted)
        assert client.pending_prompt_count(sid) == 0  # prompt_nonblocking reserves nothing
        with pytest.raises(DaemonPendingPromptLimitError) as info:
            await client.prompt(sid, "refused by the server")
        assert (info.value.session_id, info.value.limit, info.value.pending_count) == (sid, 2, 2)
        assert client.pending_prompt_count(sid) == 0
        with pytest.raises(DaemonPendingPromptLimitError):
            await client.prompt_nonblocking(sid, "refused again")
        await client.close_session(sid)


@pytest.mark.parametrize(("server_cap", "advertised"), [(2, 2), (0, None)])
async def test_capabilities_value_passes_straight_in(tmp_path: Path, server_cap: int,
                                                     advertised: int | None) -> None:
    options = BridgeOptions(max_pending_prompts_per_session=server_cap)
    async with daemon(tmp_path, options=options) as srv:
        async with DaemonClient(srv.url) as probe:
            caps = await probe.capabilities()
        limit = caps.limits.max_pending_prompts_per_session
        assert limit == advertised
        async with DaemonClient(srv.url, max_pending_prompts_per_session=limit) as client:
            assert client.max_pending_prompts_per_session == advertised
            sid = (await client.create_or_attach_session()).session_id
            async with anyio.create_task_group() as tg:
                for _ in range(3 if advertised is None else 2):
                    tg.start_soon(client.prompt, sid, "/sleep 60s held")   # cancelled below
                await wait_until(lambda: client.pending_prompt_count(sid) >= 2)
                if advertised is not None:
                    with pytest.raises(DaemonPendingPromptLimitError):
                        await client.prompt(sid, "locally refused")
                tg.cancel_scope.cancel()
            assert client.pending_prompt_count(sid) == 0


async def test_http_error_releases(server: Daemon) -> None:
    async with DaemonClient(server.url) as client:
        sid = (await client.create_or_attach_session()).session_id
        with pytest.raises(DaemonHttpError) as info:
            await client.prompt(sid, "hi", client_id="client_unknown")
        assert (info.value.status, info.value.code) == (400, "invalid_client_id")
        assert client.pending_prompt_count(sid) == 0
        with pytest.raises(DaemonHttpError) as info:
            await client.prompt("no-such-session", "hi")
        assert (info.value.status, info.value.code) == (404, "session_not_found")
        assert client.pending_prompt_count("no-such-session") == 0


async def test_request_failure_releases() -> None:
    async with DaemonClient(closed_port_url(), timeout=2) as client:
        with pytest.raises(DaemonConnectionError):
            await client.prompt("s-1", "hi")
        assert client.pending_prompt_count("s-1") == 0


async def test_turn_subscription_uses_the_202_cursor(tmp_path: Path) -> None:
    recorder = Recorder()
    async with daemon(tmp_path, wrap=recorder.wrap) as srv, DaemonClient(srv.url) as client:
        session = await client.create_or_attach_session()
        sid = session.session_id
        await client.prompt(sid, "warm up")  # so lastEventId is past 0
        recorder.requests.clear()
        await client.prompt(sid, "again")
        [events] = recorder.matching("GET", f"/session/{sid}/events")
        assert int(events.headers["last-event-id"]) > 0
        assert events.headers["x-qwen-event-epoch"] == session.event_epoch


async def test_close_session_mid_turn_releases(server: Daemon) -> None:
    async with DaemonClient(server.url) as client:
        sid = (await client.create_or_attach_session(
            CreateSessionRequest(session_scope="thread"))).session_id
        outcome: list[object] = []

        async def run() -> None:
            try:
                outcome.append(await client.prompt(sid, "/sleep 60s doomed"))
            except Exception as exc:  # the outcome is what is asserted on
                outcome.append(exc)

        with anyio.fail_after(30):   # the close ends the wait, not the 60 s turn
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await wait_until(lambda: client.pending_prompt_count(sid) == 1)
                await wait_until(lambda: server.bridge.get_session(sid).active
                                 is not None)   # admitted and running on the server
                await client.close_session(sid)
        assert client.pending_prompt_count(sid) == 0
        assert len(outcome) == 1


async def test_session_methods(server: Daemon) -> None:
    async with DaemonClient(server.url + "/") as client:
        assert (await client.health())["status"] == "ok"
        caps = await client.capabilities()
        assert "session_prompt" in caps.features
        created = await client.create_or_attach_session()
        assert not created.attached and created.client_id
        attached = await client.create_or_attach_session({})
        assert attached.attached and attached.session_id == created.session_id
        sid = created.session_id
        await client.prompt(sid, "remember me")
        branch = await client.branch_session(sid, name="fork")
        assert branch.forked_from is not None and branch.forked_from.session_id == sid
        resumed = await client.resume_session(sid)
        assert resumed.attached and resumed.last_event_id and resumed.last_event_id > 0
        assert await client.pending_prompts(sid) == []
        await client.cancel(sid)
        await client.close_session(sid)
        await client.close_session(sid)  # 404: still success
        loaded = await client.load_session(sid)
        assert loaded.session_id == sid
        assert (await client.session_status(sid))["sessionId"] == sid
        await client.close_session(branch.session_id)


async def test_permission_and_pending_prompts(server: Daemon) -> None:
    async with DaemonClient(server.url) as client:
        sid = (await client.create_or_attach_session()).session_id
        accepted = await client.prompt_nonblocking(sid, "/permission ask")
        queued = await client.prompt_nonblocking(sid, "queued")
        assert isinstance(accepted, PromptAccepted) and isinstance(queued, PromptAccepted)
        request_id = None
        async with contextlib.aclosing(client.subscribe_events(
                sid, last_event_id=accepted.last_event_id)) as events:
            async for event in events:
                if event.type == "permission_request":
                    request_id = event.data["requestId"]
                    break
        assert request_id is not None
        ids = [p["promptId"] for p in await client.pending_prompts(sid)]
        assert queued.prompt_id in ids
        assert await client.remove_pending_prompt(sid, queued.prompt_id)
        assert not await client.remove_pending_prompt(sid, queued.prompt_id)
        vote = {"outcome": {"outcome": "selected", "optionId": "allow_once"}}
        assert await client.respond_to_permission(request_id, vote, session_id=sid)
        assert not await client.respond_to_permission(request_id, vote)


async def test_list_sessions_walks_the_live_and_the_ended_ones(tmp_path: Path) -> None:
    """``list_sessions`` follows every page (3 a page here); ``ended=True`` lists the
    sessions the server keeps closed, which ``load_session`` brings back."""
    async with daemon(tmp_path) as server, DaemonClient(server.url) as client:
        made = [(await client.create_or_attach_session(
            CreateSessionRequest(session_scope="thread"))).session_id for _ in range(7)]
        for sid in made[:4]:
            await server.server.bridge.close_session(sid, reason="agent_exited")

        async def ended() -> list[str]:
            return [s["sessionId"] async for s in client.list_sessions(ended=True,
                                                                         page_size=3)]
        with anyio.fail_after(20):   # the closes are committed behind their answer
            while len(await ended()) < 4:
                await anyio.sleep(0.01)
        live = [s["sessionId"] async for s in client.list_sessions(page_size=3)]
        assert live == made[4:][::-1]
        assert await ended() == made[:4][::-1]
        assert (await client.load_session(made[0])).session_id == made[0]
        assert await ended() == made[1:4][::-1]


async def test_an_async_on_event_answers_the_turns_permission(server: Daemon) -> None:
    """A coroutine function as ``on_event`` is awaited: it can vote on the turn's
    ``permission_request`` (the turn waits for it), as docs/sdk-and-cli.md shows."""
    async with DaemonClient(server.url) as client:
        sid = (await client.create_or_attach_session()).session_id
        asked: list[dict[str, Any]] = []

        async def answer(event: DaemonEvent) -> None:
            if event.type == "permission_request":
                asked.append(event.data)
                options = event.data["options"]
                assert await client.respond_to_permission(event.data["requestId"], {
                    "outcome": {"outcome": "selected", "optionId": options[0]["optionId"]}},
                    session_id=sid)

        with anyio.fail_after(30):
            result = await client.prompt(sid, "/permission x", on_event=answer)
        assert result.stop_reason == "end_turn" and len(asked) == 1
