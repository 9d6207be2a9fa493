"""``subscribe_events`` against the real daemon: automatic resume after the server
drops the stream mid-turn, eviction, and ``state_resync_required`` surfaced."""

from __future__ import annotations

import contextlib
from pathlib import Path

import anyio
import pytest

from acp_server.client import DaemonClient, DaemonEvent, PromptAccepted, StreamCursor
from bridge import BridgeOptions
from tests.sdk.harness import Daemon, DropEvents, Recorder, daemon, wait_until

pytestmark = pytest.mark.anyio


async def collect_turn(client: DaemonClient, sid: str, accepted: PromptAccepted,
                       cursor: StreamCursor | None = None) -> list[DaemonEvent]:
    got: list[DaemonEvent] = []
    stream = client.subscribe_events(sid, last_event_id=accepted.last_event_id,
                                     epoch=accepted.event_epoch, cursor=cursor)
    async with contextlib.aclosing(stream) as events:
        async for event in events:
            got.append(event)
            if event.type == "turn_complete" and event.prompt_id == accepted.prompt_id:
                break
    return got


async def test_resumes_after_the_server_drops_the_stream(tmp_path: Path) -> None:
    drop, recorder = DropEvents(after=3, times=2), Recorder()
    async with daemon(tmp_path, wrap=lambda app: recorder.wrap(drop.wrap(app))) as srv, \
            DaemonClient(srv.url) as client:
        sid = (await client.create_or_attach_session()).session_id
        accepted = await client.prompt_nonblocking(sid, "/sleep 200ms /chunks 12 a long reply")
        assert isinstance(accepted, PromptAccepted)
        got = await collect_turn(client, sid, accepted)
    assert drop.dropped == 2
    ids = [e.id for e in got if e.id is not None]
    assert ids == list(range(ids[0], ids[0] + len(ids)))  # nothing lost, nothing twice
    assert ids[0] == (accepted.last_event_id or 0) + 1
    assert got[-1].type == "turn_complete"
    subscriptions = recorder.matching("GET", "/events")
    assert len(subscriptions) == 3
    resumed = subscriptions[1].headers
    assert resumed["last-event-id"] == str(ids[2])
    assert resumed["x-qwen-event-epoch"] == accepted.event_epoch


async def test_prompt_survives_a_dropped_stream(tmp_path: Path) -> None:
    drop = DropEvents(after=2, times=1)
    async with daemon(tmp_path, wrap=drop.wrap) as srv, DaemonClient(srv.url) as client:
        sid = (await client.create_or_attach_session()).session_id
        text: list[str] = []
        result = await client.prompt(sid, "/sleep 100ms /chunks 6 resumed reply", on_event=lambda e:
                                     text.append(e.data["update"]["content"]["text"])
                                     if e.type == "session_update"
                                     and e.data["update"]["sessionUpdate"] == "agent_message_chunk"
                                     else None)
        assert result.stop_reason == "end_turn"
        assert "".join(text) == "Echo: resumed reply"
        assert drop.dropped == 1
        assert client.pending_prompt_count(sid) == 0


async def test_resumes_after_eviction(tmp_path: Path) -> None:
    """A live subscriber that stalls is evicted (``client_evicted``, the server ends the
    stream); the iterator reconnects from its cursor and still sees the whole turn."""
    # A stall far longer than the bus's flow-control wait: the reader is evicted.
    options = BridgeOptions(subscriber_max_queued=16, subscriber_flow_wait_ms=20)
    # The in-memory journal: its bus pushes every event at publish, so a stalled
    # reader's queue overflows at once. (A journaled bus feeds readers from its ring as
    # they read: a stalled reader costs no memory and is evicted only when a publisher
    # waits for it in vain, or when the ring passes it; tests/hostile/test_bursts.py.)
    async with daemon(tmp_path, options=options, session_journal="memory") as srv, \
            DaemonClient(srv.url) as client:
        sid = (await client.create_or_attach_session()).session_id
        bus = srv.bridge.get_session(sid).bus
        got: list[DaemonEvent] = []

        async def consume() -> None:
            async with contextlib.aclosing(client.subscribe_events(sid, last_event_id=0)) as events:
                async for event in events:
                    got.append(event)
                    if len(got) == 1:   # before the 5 MB echo: the socket fills up
                        # stall until the server's queue overflowed and it let the
                        # reader go (a condition, not a 0.5 s sleep a loaded machine
                        # may spend before the agent wrote anything)
                        await wait_until(lambda: bus.subscriber_count == 0, timeout=30)
                    if event.type == "turn_complete":
                        return

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            # the prompt once the reader is attached (it must see the turn live)
            await wait_until(lambda: bus.subscriber_count == 1, timeout=30)
            # 5 MB: more than the socket buffers take while the reader stalls (a
            # reader that keeps up is not evicted: the bus flow-controls the agent).
            await client.prompt_nonblocking(sid, "/chunks 100 " + "x" * 100 * 50_000)
    kinds = [e.type for e in got]
    assert "client_evicted" in kinds and kinds[-1] == "turn_complete"
    ids = [e.id for e in got if e.id is not None]
    assert ids == list(range(1, len(ids) + 1))
    assert kinds.count("session_update") == 101  # the echo and 100 chunks


async def test_state_resync_required_is_surfaced(server: Daemon) -> None:
    async with DaemonClient(server.url) as client:
        sid = (await client.create_or_attach_session()).session_id
        await client.prompt(sid, "fill the ring")
        cursor = StreamCursor(last_event_id=2, epoch="not-the-epoch")
        async with contextlib.aclosing(client.subscribe_events(sid, cursor=cursor)) as events:
            first = await events.__anext__()
        assert first.type == "state_resync_required" and first.id is None
        assert first.data["reason"] == "epoch_reset"
        assert cursor.epoch != "not-the-epoch"  # taken from the response


async def test_ends_after_session_closed(server: Daemon) -> None:
    async with DaemonClient(server.url) as client:
        sid = (await client.create_or_attach_session()).session_id
        await client.prompt(sid, "hi")
        kinds: list[str] = []
        async with contextlib.aclosing(client.subscribe_events(sid, last_event_id=0)) as events:
            async for event in events:
                kinds.append(event.type)
                if event.type == "replay_complete":
                    await client.close_session(sid)
        assert kinds[-1] == "session_closed"
