"""``DaemonSessionClient``: factories and their cursors, the local cap on the
long-lived subscription path, slot release by the terminal event, cancellation."""

from __future__ import annotations

import contextlib
from pathlib import Path

import anyio
import pytest

from acp_server.client import (CreateSessionRequest, DaemonClient, DaemonEvent,
                               DaemonPendingPromptLimitError, DaemonSessionClient,
                               DaemonStreamEndedError, DaemonTurnError)
from tests.sdk.harness import Daemon, Recorder, daemon, wait_until

pytestmark = pytest.mark.anyio


async def pump(session: DaemonSessionClient, seen: list[DaemonEvent],
               opened: anyio.Event) -> None:
    async with contextlib.aclosing(session.events()) as events:
        opened.set()
        async for event in events:
            seen.append(event)


async def test_factories_keep_positions_and_cursors(server: Daemon) -> None:
    async with DaemonClient(server.url) as client:
        fresh = await DaemonSessionClient.create_or_attach(
            client, CreateSessionRequest(session_scope="thread"), None)
        assert fresh.cursor.last_event_id == 0 and fresh.cursor.epoch
        attached = await DaemonSessionClient.create_or_attach(client)
        again = await DaemonSessionClient.create_or_attach(client, {}, None)
        assert again.session_id == attached.session_id and again.cursor.last_event_id is None
        await fresh.prompt("hi")  # no subscription: delegates to client.prompt
        resumed = await DaemonSessionClient.resume(client, fresh.session_id, None, None)
        assert resumed.cursor.last_event_id and resumed.cursor.last_event_id > 0
        loaded = await DaemonSessionClient.load(client, fresh.session_id)
        assert loaded.session_id == fresh.session_id
        override = DaemonSessionClient(client, fresh.session, max_pending_prompts_per_session=None)
        assert override.max_pending_prompts_per_session is None
        assert resumed.max_pending_prompts_per_session == 5
        with pytest.raises(ValueError):
            DaemonSessionClient(client, fresh.session, max_pending_prompts_per_session=1.5)
        await fresh.close()


async def test_cap_on_the_subscription_path(tmp_path: Path) -> None:
    recorder = Recorder()
    async with daemon(tmp_path, wrap=recorder.wrap) as srv, DaemonClient(srv.url) as client:
        info = await client.create_or_attach_session()
        session = DaemonSessionClient(client, info, last_event_id=0,
                                      max_pending_prompts_per_session=1)
        seen: list[DaemonEvent] = []
        results: list[str] = []
        opened = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(pump, session, seen, opened)
            await opened.wait()

            async def first() -> None:
                # held at its permission ask until the test answers (a 300 ms sleep
                # could end before the local refusal below on a loaded machine)
                results.append((await session.prompt("/permission first")).stop_reason)

            tg.start_soon(first)
            await wait_until(lambda: recorder.count("POST", "/prompt") == 1)
            assert session.pending_prompt_count == 1
            with pytest.raises(DaemonPendingPromptLimitError) as info_:
                await session.prompt("second")
            assert info_.value.session_id == session.session_id
            assert recorder.count("POST", "/prompt") == 1  # refused locally
            await wait_until(lambda: any(e.type == "permission_request" for e in seen))
            [ask] = [e for e in seen if e.type == "permission_request"]
            assert await session.respond_to_permission(ask.data["requestId"], {
                "outcome": {"outcome": "selected", "optionId": "allow_once"}})
            await wait_until(lambda: results == ["end_turn"])
            assert session.pending_prompt_count == 0  # released by turn_complete
            with pytest.raises(DaemonTurnError):
                await session.prompt("/fail")
            assert session.pending_prompt_count == 0  # released by turn_error
            tg.cancel_scope.cancel()
        assert recorder.count("GET", "/events") == 1  # one long-lived subscription
        assert any(e.type == "turn_complete" for e in seen)


async def test_subscription_cancellation_and_stream_end(tmp_path: Path) -> None:
    recorder = Recorder()
    async with daemon(tmp_path, wrap=recorder.wrap) as srv, DaemonClient(srv.url) as client:
        session = await DaemonSessionClient.create_or_attach(client)
        seen: list[DaemonEvent] = []
        opened = anyio.Event()
        outcome: list[BaseException] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(pump, session, seen, opened)
            await opened.wait()
            caller = anyio.CancelScope()

            async def cancelled_by_the_caller() -> None:
                with caller:
                    await session.prompt("/sleep 60s cancelled by the caller")

            tg.start_soon(cancelled_by_the_caller)
            # the caller cancels once the client knows the prompt runs (its 202 and the
            # turn's start read from the stream): a running prompt is stopped by cancel
            await wait_until(lambda: any(w.watch.running for w in session._waiters.values()))
            caller.cancel()
            await wait_until(lambda: session.pending_prompt_count == 0)
            assert recorder.count("POST", "/cancel") == 1  # it was running: cancel sent
            await wait_until(lambda: any(e.type == "turn_complete"
                                         and e.data["stopReason"] == "cancelled" for e in seen))

            tg.cancel_scope.cancel()

        # the subscription ends while a prompt waits: it fails and its slot is released
        outer_seen: list[DaemonEvent] = []
        async with anyio.create_task_group() as tg:
            pump_scope = anyio.CancelScope()
            opened = anyio.Event()

            async def pumped() -> None:
                with pump_scope:
                    await pump(session, outer_seen, opened)

            tg.start_soon(pumped)
            await opened.wait()

            async def doomed() -> None:
                try:
                    await session.prompt("/sleep 60s doomed")   # cancelled below
                except DaemonStreamEndedError as exc:
                    outcome.append(exc)

            tg.start_soon(doomed)
            await wait_until(lambda: session.pending_prompt_count == 1)
            await wait_until(lambda: srv.bridge.get_session(session.session_id).active
                             is not None)   # admitted and running on the server
            pump_scope.cancel()
            await wait_until(lambda: len(outcome) == 1)
            assert session.pending_prompt_count == 0
        await session.cancel()
        await session.close()
