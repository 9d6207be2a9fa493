"""Event bus: ids, epoch, replay, resync, slow subscribers, the subscriber cap."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest

from bridge import events as ev
from bridge import wire
from bridge.bus import EventBus
from bridge.errors import SubscriberLimitExceededError
from tests.bridge.helpers import drain, envelope

pytestmark = pytest.mark.anyio


def publish(bus: EventBus, n: int) -> None:
    for i in range(n):
        bus.publish("session_update", {"n": i})


async def test_ids_start_at_one_and_frames_are_exact():
    bus = EventBus()
    event = bus.publish("turn_complete", {"sessionId": "s", "stopReason": "end_turn"}, prompt_id="p")
    assert event.id == 1
    body = msgspec.json.decode(wire.envelope(event))
    assert event.size == len(wire.envelope(event))
    assert body["id"] == 1 and body["v"] == 1 and body["type"] == "turn_complete"
    assert body["promptId"] == "p" and isinstance(body["_meta"]["serverTimestamp"], int)


async def test_live_only_without_cursor():
    bus = EventBus()
    publish(bus, 3)
    sub = bus.subscribe()
    publish(bus, 2)
    assert [f.id for f in drain(sub)] == [4, 5]


async def test_replay_then_replay_complete_then_live():
    bus = EventBus()
    publish(bus, 5)
    sub = bus.subscribe(last_event_id=2, epoch=bus.epoch)
    publish(bus, 1)
    frames = drain(sub)
    assert [f.id for f in frames] == [3, 4, 5, None, 6]
    assert frames[3].type == "replay_complete"
    assert envelope(frames[3]).data == {"lastReplayedEventId": 5, "lastEventId": 5, "replayedCount": 3}


async def test_epoch_mismatch_requires_resync_and_replays_ring():
    bus = EventBus()
    publish(bus, 3)
    frames = drain(bus.subscribe(last_event_id=2, epoch="some-other-epoch"))
    assert frames[0].type == "state_resync_required"
    assert envelope(frames[0]).data == {"reason": "epoch_reset", "detail": "epoch_mismatch",
                                         "lastDeliveredId": 2, "earliestAvailableId": 1}
    assert [f.id for f in frames[1:]] == [1, 2, 3, None]


async def test_cursor_ahead_of_bus_is_epoch_reset():
    bus = EventBus()
    publish(bus, 2)
    frames = drain(bus.subscribe(last_event_id=99999))
    assert envelope(frames[0]).data["reason"] == "epoch_reset"
    assert [f.id for f in frames[1:-1]] == [1, 2]


async def test_ring_evicted():
    bus = EventBus(ring_size=3)
    publish(bus, 10)
    frames = drain(bus.subscribe(last_event_id=2))
    assert envelope(frames[0]).data == {"reason": "ring_evicted", "lastDeliveredId": 2,
                                         "earliestAvailableId": 8}
    assert [f.id for f in frames[1:]] == [8, 9, 10, None]
    # a cursor right before the ring's start is still honoured
    assert [f.id for f in drain(bus.subscribe(last_event_id=7))] == [8, 9, 10, None]


async def test_slow_subscriber_warned_once_then_evicted():
    bus = EventBus(max_queued=16)
    sub = bus.subscribe()
    publish(bus, 12)            # 75 % of 16
    publish(bus, 4)             # fills the queue
    bus.publish("session_update", {"n": "overflow"})
    frames = drain(sub)
    kinds = [f.type for f in frames]
    assert kinds.count("slow_client_warning") == 1
    assert kinds.index("slow_client_warning") == 12
    assert envelope(frames[12]).data["threshold"] == "frames"   # the frame bound at 75 %
    assert kinds[-1] == "client_evicted"
    evicted = envelope(frames[-1]).data
    assert evicted["reason"] == "queue_overflow" and evicted["droppedAfter"] == 16
    assert sub.ended and bus.subscriber_count == 0
    bus.publish("session_update", {})
    assert drain(sub) == []


async def test_byte_bound_evicts():
    bus = EventBus(max_queued=256, max_queued_bytes=4096)
    sub = bus.subscribe()
    for _ in range(10):
        bus.publish("session_update", {"blob": "x" * 1000})
    frames = drain(sub)
    assert envelope(frames[-1]).data["reason"] == "queue_bytes_overflow"


async def test_warning_names_the_byte_bound():
    """``threshold`` says which bound reached 75 %, as qwen serve's: ``bytes`` when
    only the byte bound did, ``frames_and_bytes`` when both did."""
    bus = EventBus(max_queued=256, max_queued_bytes=4096)
    sub = bus.subscribe()
    for _ in range(5):
        bus.publish("session_update", {"blob": "x" * 1000})
    warnings = [f for f in drain(sub) if f.type == "slow_client_warning"]
    assert [envelope(f).data["threshold"] for f in warnings] == ["bytes"]
    size = EventBus().publish("session_update", {"blob": "x" * 1000}).size
    # the 12th event: 75 % of 16 frames, and of the bytes (the 11 before it), at once
    bus = EventBus(max_queued=16, max_queued_bytes=14 * size)
    sub = bus.subscribe()
    for _ in range(12):
        bus.publish("session_update", {"blob": "x" * 1000})
    warnings = [f for f in drain(sub) if f.type == "slow_client_warning"]
    assert [envelope(f).data["threshold"] for f in warnings] == ["frames_and_bytes"]


async def test_warning_rearms_after_draining():
    bus = EventBus(max_queued=16)
    sub = bus.subscribe()
    publish(bus, 12)
    drain(sub)
    publish(bus, 12)
    assert [f.type for f in drain(sub)].count("slow_client_warning") == 1


async def test_subscriber_cap():
    bus = EventBus(max_subscribers=2)
    first = bus.subscribe()
    bus.subscribe()
    with pytest.raises(SubscriberLimitExceededError) as info:
        bus.subscribe()
    assert info.value.limit == 2
    first.close()
    bus.subscribe()


async def test_iteration_ends_when_bus_closes():
    bus = EventBus()
    sub = bus.subscribe()
    publish(bus, 2)
    bus.close()
    assert [f.id async for f in sub] == [1, 2]
    assert bus.publish("x", {}) is None


async def test_replay_budget_keeps_newest_events(monkeypatch):
    monkeypatch.setattr("bridge.bus.REPLAY_BUDGET_BYTES", 2000)
    bus = EventBus()
    for _ in range(10):
        bus.publish("session_update", {"blob": "y" * 400})
    frames = drain(bus.subscribe(last_event_id=0))
    assert envelope(frames[0]).data["reason"] == "replay_budget_exceeded"
    replayed = [f.id for f in frames if f.id is not None]
    assert replayed == list(range(11 - len(replayed), 11)) and 0 < len(replayed) < 10


# -- a held bus (a durable journal): readers fed from the ring ----------------------

def held_bus(**kwargs: object) -> EventBus:
    bus = EventBus(ring_size=64, max_queued=16, **kwargs)  # type: ignore[arg-type]
    bus.hold = True   # evict_at: its queue (16) plus a quarter ring (16)
    return bus


async def test_held_reader_warned_at_75_percent_then_evicted():
    bus = held_bus(flow_wait_s=0)
    sub = bus.subscribe()
    assert sub.evict_at() == 32
    publish(bus, 23)
    bus.release(23)
    assert sub.behind() == 23 and len(sub) == 8     # fed half its queue: no warning yet
    publish(bus, 1)
    bus.release(24)                                 # 75 % of 32
    publish(bus, 9)
    bus.release(33)
    await bus.wait_for_readers()                    # past evict_at, did not drain: evicted
    frames = drain(sub)
    kinds = [f.type for f in frames]
    assert kinds == ["session_update"] * 8 + ["slow_client_warning", "client_evicted"]
    assert envelope(frames[8]).data == {
        "queueSize": 24, "maxQueued": 32, "lastEventId": 8, "threshold": "frames",
        "queuedBytes": sum(e.size for e in bus.ring_events()[:24]),
        "maxQueuedBytes": bus.max_queued_bytes}
    assert envelope(frames[9]).data["reason"] == "queue_overflow"
    assert envelope(frames[9]).data["droppedAfter"] == 8
    assert sub.ended and bus.subscriber_count == 0


async def test_held_reader_lapped_by_the_ring_is_warned_first():
    bus = held_bus()
    sub = bus.subscribe()
    publish(bus, 8)
    bus.release(8)
    publish(bus, 70)          # the ring (64) passes the reader before any commit lands
    bus.release(78)
    kinds = [f.type for f in drain(sub)]
    assert kinds == ["session_update"] * 8 + ["slow_client_warning", "client_evicted"]


async def test_held_warning_rearms_after_draining():
    bus = held_bus()
    sub = bus.subscribe()
    publish(bus, 24)
    bus.release(24)
    frames = drain(sub)                              # read it all, fed from the ring
    assert [f.id for f in frames if f.id is not None] == list(range(1, 25))
    assert [f.type for f in frames].count("slow_client_warning") == 1
    publish(bus, 10)
    bus.release(34)                                  # had drained: re-armed, 10 < 24
    publish(bus, 14)
    bus.release(48)                                  # 24 behind again: warned again
    frames = drain(sub)
    assert [f.type for f in frames].count("slow_client_warning") == 1
    assert [f.id for f in frames if f.id is not None] == list(range(25, 49))


async def test_held_reader_that_keeps_up_is_never_warned():
    """A publisher that waits (the in-process agent) against a reader that reads and a
    journal that commits in its largest batches (a quarter ring): the reader gets
    every event, no warning, no eviction."""
    bus = held_bus(flow_wait_s=60)
    sub = bus.subscribe()
    total, got = 600, []
    done = anyio.Event()

    async def publisher() -> None:
        for i in range(total):
            bus.publish("session_update", {"n": i})
            await bus.wait_for_readers()
        done.set()

    async def journal() -> None:
        while bus.released_id < total:
            if done.is_set() or bus.last_event_id - bus.released_id >= 16:
                bus.release(bus.last_event_id)
            await anyio.lowlevel.checkpoint()

    async def reader() -> None:
        async for frame in sub:
            got.append(frame)
            if frame.id == total:
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(journal)
        tg.start_soon(publisher)
    assert [f.id for f in got] == list(range(1, total + 1))   # no control frame at all


async def test_a_reader_taking_one_event_per_wait_does_not_set_the_publishers_pace():
    """Flow control's hysteresis, unheld and held: a publisher waiting for a reader goes
    on once that reader drained to three eighths of its bound, not after one event.
    A reader that takes one event whenever the publisher waits (a client whose socket
    trickles) kept the publisher in lockstep with it, never ``stalled``: an agent held
    to a slow client's pace for as long as it trickled. (The publisher's wait is
    bounded, ``flow_wait_s``; here it is long, so what releases it is the reader.)"""
    for held in (False, True):
        bus = held_bus(flow_wait_s=60) if held else EventBus(max_queued=16, flow_wait_s=60)
        sub = bus.subscribe()

        async def publisher(bus: EventBus = bus, held: bool = held) -> None:
            for i in range(40):
                bus.publish("session_update", {"n": i})
                if held:
                    bus.release(bus.last_event_id)
                await bus.wait_for_readers()

        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher)
            await anyio.wait_all_tasks_blocked()
            waited_at = bus.last_event_id   # unheld: 8 queued (half of 16); held: lag 17
            assert waited_at == (17 if held else 8)
            sub.get_nowait()                # one event taken: the publisher still waits
            await anyio.wait_all_tasks_blocked()
            assert bus.last_event_id == waited_at, held
            taken = 1
            while bus.last_event_id == waited_at:
                sub.get_nowait()
                taken += 1
                await anyio.wait_all_tasks_blocked()
            # on at three eighths: held, a lag of 12 of ``evict_at`` 32; unheld, 6 of 16
            assert taken == (17 - 12 if held else 8 - 6), held
            assert not sub.stalled and not sub.closed
            tg.cancel_scope.cancel()


async def test_a_stalled_reader_is_waited_for_again_once_it_drained_to_three_eighths():
    """A reader the publisher gave up on (``stalled``, here at once: ``flow_wait_s=0``)
    stays stalled while it takes a few events, and is waited for again once it drained
    to three eighths of its bound (were it waited for as soon as it dipped below half,
    a trickling reader would cost the publisher ``flow_wait_s`` every few events)."""
    for held in (False, True):
        bus = held_bus(flow_wait_s=0) if held else EventBus(max_queued=16, flow_wait_s=0)
        sub = bus.subscribe()
        for i in range(17 if held else 8):   # half full: the publisher waits, in vain
            bus.publish("session_update", {"n": i})
            if held:
                bus.release(bus.last_event_id)
            await bus.wait_for_readers()
        assert sub.stalled, held
        low_mark = 12 if held else 6         # three eighths of 32 (held), of 16
        while (sub.lag() if held else sub.items) > low_mark:
            await bus.wait_for_readers()     # nor does the bus un-stall it meanwhile
            assert sub.stalled, held
            sub.get_nowait()
        assert not sub.stalled, held


async def test_a_stalled_held_reader_is_measured_by_what_was_committed():
    """A held reader stalled, then the journal stops committing while the publisher goes
    on: the reader takes every committed event and is waited for again, however many
    events wait for their commit (they are not the reader's to drain). Measured by
    every published event, it stayed stalled, and the next large commit evicted it
    with no wait at all."""
    bus = held_bus(flow_wait_s=0)
    sub = bus.subscribe()
    for i in range(17):                      # over half of ``evict_at`` 32, committed
        bus.publish("session_update", {"n": i})
        bus.release(bus.last_event_id)
        await bus.wait_for_readers()
    assert sub.stalled
    publish(bus, 14)                         # uncommitted: a lag of 31, 17 of them taken
    while sub.get_nowait() is not None:
        pass
    assert sub.behind() == 0 and sub.lag() == 14
    assert not sub.stalled and not sub.closed


async def test_held_reader_is_fed_in_order_from_either_end_of_a_wrapped_ring():
    """A held reader's top-up reads the ring from its nearer end: far behind (from the
    oldest) and close behind the newest (from the newest), across many wraps."""
    bus = held_bus()
    sub = bus.subscribe()
    publish(bus, 60)
    bus.release(60)                  # the reader at the ring's oldest event (warned)
    frames = drain(sub)
    for step in range(300):          # then close behind the newest, the ring wrapping
        publish(bus, 1)
        if step % 5 == 4:
            bus.release(bus.last_event_id)
        if step % 7 == 6:
            frames += drain(sub)
    bus.release(bus.last_event_id)
    frames += drain(sub)
    assert [f.id for f in frames if f.id is not None] == list(range(1, 361))
    assert not sub.closed


async def test_held_reader_past_its_cursor_gets_the_events_after_it():
    """A reader whose cursor is ahead of what is released skips the events up to it as
    they are released (each top-up window may hold only skipped ones), then gets the
    rest."""
    bus = held_bus()
    publish(bus, 40)
    bus.release(10)
    sub = bus.subscribe(last_event_id=35, epoch=bus.epoch)
    assert [f.type for f in drain(sub)] == ["replay_complete"]
    bus.release(40)
    assert [f.id for f in drain(sub)] == [36, 37, 38, 39, 40]


async def test_held_publisher_checks_a_new_reader_at_once():
    """The lag check is skipped while no reader can have reached half its ``evict_at``;
    a reader that subscribes meanwhile is checked from the next event: it is
    ``stalled`` as soon as it lags by more than half (the publisher does not wait
    here: ``flow_wait_s=0``), while the reader that keeps up never is."""
    bus = held_bus(flow_wait_s=0)
    fast = bus.subscribe()

    async def step() -> None:
        publish(bus, 1)
        bus.release(bus.last_event_id)
        drain(fast)
        await bus.wait_for_readers()

    for _ in range(3):
        await step()
    slow = bus.subscribe()           # live from event 4 on; never reads
    for n in range(1, 40):
        await step()
        assert slow.closed or slow.stalled == (slow.behind() * 2 > slow.evict_at()), n
        assert not fast.stalled
    assert slow.evicted_reason == "queue_overflow"


async def test_take_gives_what_get_nowait_gives_one_by_one():
    """``take`` (an SSE write's batch) gives the frames ``get_nowait`` gives one by one,
    in order, control frames and a held reader's top-ups included, each batch at
    least one frame and at most its byte budget plus one frame."""
    def run(read: str) -> list[tuple[int | None, str]]:
        bus = held_bus()
        sub = bus.subscribe()
        frames: list[Any] = []
        for step in range(200):
            publish(bus, 1)
            if step % 9 == 8:
                bus.release(bus.last_event_id)
            if step % 13 == 12:
                if read == "one":
                    frames += drain(sub)
                else:
                    while batch := sub.take(500):
                        assert sum(f.size for f in batch[:-1]) < 500
                        frames += batch
        return [(f.id, f.type) for f in frames]

    one = run("one")
    assert run("batch") == one
    ids = [i for i, _ in one if i is not None]
    assert ids == list(range(1, 190))   # released through 189 at the last read


async def test_take_counts_replayed_frames_towards_its_budget():
    bus = EventBus(ring_size=64)
    publish(bus, 30)
    sub = bus.subscribe(last_event_id=0, epoch=bus.epoch)   # 30 replayed (uncounted)
    size = bus.ring_events()[0].size
    first = sub.take(size * 10)
    assert [f.id for f in first] == list(range(1, 11))
    rest = sub.take(1 << 20)
    assert [f.id for f in rest] == [*range(11, 31), None]   # then replay_complete
    assert sub.take(1 << 20) == [] and sub.taken == 31


async def test_the_ring_is_bounded_in_bytes_oldest_first() -> None:
    """Large events (an agent's line may be 64 MiB) are kept up to ``ring_bytes``: the
    oldest go first, the newest always stays, and a cursor before what went is told."""
    bus = EventBus(ring_size=1000, ring_bytes=64 * 1024)
    big = "x" * 10_000
    for _ in range(20):
        bus.publish("agent_message_chunk", {"text": big})
    assert bus.ring_size_bytes <= 64 * 1024
    kept = bus.ring_events()
    assert len(kept) == 6 and kept[-1].id == 20 and bus.earliest_available_id == 15
    assert bus.ring_size_bytes == sum(event.size for event in kept)
    frames = drain(bus.subscribe(last_event_id=2))
    assert envelope(frames[0]).data["reason"] == "ring_evicted"
    assert [f.id for f in frames[1:-1]] == list(range(15, 21))
    bus.publish("agent_message_chunk", {"text": "x" * 200_000})   # alone over the bound
    assert [e.id for e in bus.ring_events()] == [21]


async def test_a_terminal_is_in_the_history_once_its_events_are_committed() -> None:
    """``load``'s history (``bridge.history``) on a held bus: a prompt's terminal is
    listed once none of its events is held, as its events are replayed: a load
    answered before a crash lists nothing the journal may not have (seen in CI: a
    test killed the server on a terminal whose turn was not committed yet)."""
    import collections
    import types

    from bridge.history import session_history
    from bridge.status import PromptTerminal

    bus = held_bus()
    bus.publish("session_update", {"n": 0}, prompt_id="p0")
    fresh = types.SimpleNamespace(bus=bus, active=None, prompt_terminals=collections.deque())
    nothing = session_history(fresh)  # type: ignore[arg-type]
    # nothing committed yet: a subscriber from its cursor gets event 1 once it is
    assert nothing.compacted_replay == [] and nothing.last_event_id == 0
    bus.release(1)
    done = PromptTerminal(prompt_id="p0", terminal="completed", at=1, stop_reason="end_turn")
    bus.publish("session_update", {"n": 1}, prompt_id="p1")
    bus.publish(ev.TURN_COMPLETE, {"stopReason": "end_turn"}, prompt_id="p1")
    ended = PromptTerminal(prompt_id="p1", terminal="completed", at=2, stop_reason="end_turn")
    session = types.SimpleNamespace(bus=bus, active=None,
                                    prompt_terminals=collections.deque([done, ended]))
    assert bus.held_prompt_ids() == {"p1"}
    history = session_history(session)  # type: ignore[arg-type]
    assert history.prompt_terminals == [done]
    assert [e.id for e in history.compacted_replay] == [1] and history.last_event_id == 1
    bus.release(2)   # its turn's last event not yet
    assert session_history(session).prompt_terminals == [done]  # type: ignore[arg-type]
    bus.release(3)
    assert bus.held_prompt_ids() == set()
    history = session_history(session)  # type: ignore[arg-type]
    assert history.prompt_terminals == [done, ended]
    assert [e.id for e in history.compacted_replay] == [1, 2, 3]


async def test_a_held_ring_keeps_what_readers_were_not_released() -> None:
    bus = EventBus(ring_size=1000, ring_bytes=32 * 1024)
    bus.hold = True
    for _ in range(10):
        bus.publish("agent_message_chunk", {"text": "y" * 10_000})
    assert len(bus._ring) == 10   # none committed yet: none dropped
    bus.release(10)
    assert bus.ring_size_bytes <= 32 * 1024 and bus.ring_events()[-1].id == 10


@pytest.mark.parametrize("batches", [[5], [2, 2, 2], [1, 6]])
async def test_a_followed_or_restored_ring_counts_its_bytes_as_it_goes(
        batches: list[int]) -> None:
    """``follow`` and ``restore`` count what enters and what the count drops (a batch
    longer than the ring included), the same sum as the ring's events."""
    from bridge.events import Event

    next_id = 1
    for method in ("follow", "restore"):
        bus = EventBus(ring_size=3, ring_bytes=1 << 20)
        for size in batches:
            events = []
            for _ in range(size):
                event = Event(next_id, "agent_message_chunk", {"text": "x"})
                event.size = 100 * next_id
                events.append(event)
                next_id += 1
            if method == "follow":
                bus.follow(events)
            else:
                bus.restore(events, events[-1].id)
            assert bus.ring_size_bytes == sum(e.size for e in bus._ring)
            assert len(bus._ring) <= 3


def test_a_resync_on_a_held_bus_names_the_next_event_released() -> None:
    """A reader from a cursor the ring no longer holds, on a held bus whose released
    events were all trimmed (a byte bound): nothing to replay, and the resync's
    ``earliest_available_id`` is the next event it will get (the first held one, once
    released), not one past the last published (found by the held-bus property test)."""
    bus = EventBus(ring_size=64, max_queued=8, max_subscribers=8)
    bus.hold = True
    bus.ring_bytes = 600
    for _ in range(30):
        bus.publish("x", {"pad": ""})
    bus.release(30)
    for _ in range(2):
        bus.publish("x", {"pad": "p" * 200})   # held: the released ones are trimmed
    assert bus.ring_events() == []   # every released event trimmed
    reader = bus.subscribe(last_event_id=0)
    frames = reader.take(1 << 20)
    assert frames[0].type == ev.STATE_RESYNC_REQUIRED
    assert frames[0].data.earliest_available_id == 31
    bus.release(32)
    assert [frame.id for frame in reader.take(1 << 20) if frame.id is not None] == [31, 32]


async def test_a_held_publisher_over_a_stalled_journal_still_gives_the_loop_turns():
    """The journal stops committing (a store outage: ``_journal_stalled`` after one
    ``flow_wait_s``): a publisher that never suspends otherwise (the in-process agent)
    must still let the event loop run within a journal window of events, or nothing
    else runs until its turn ends (a ``session/cancel``, the commit that would end the
    stall, every other request)."""
    bus = held_bus(flow_wait_s=0)   # a journal window of 16 events
    while not bus._journal_stalled:
        bus.publish("session_update", {})
        await bus.wait_for_readers()
    seen: list[int] = []
    start = bus.last_event_id
    async with anyio.create_task_group() as tg:
        tg.start_soon(_note, seen, bus)
        for _ in range(1000):
            bus.publish("session_update", {})
            await bus.wait_for_readers()
            if seen:
                break
        # within two windows: trio runs a batch of ready tasks in either order (its
        # scheduler reverses half the batches at random), so the first turn the
        # publisher gives may go to the publisher again
        assert seen and seen[0] - start <= 2 * 16, (start, bus.last_event_id)


async def test_a_held_publisher_on_a_large_ring_waits_for_the_journal_within_its_cap():
    """A ring of up to 1,000,000 events (``event_ring_size``): the journal window is
    ``JOURNAL_WINDOW_MAX``, not a quarter of it, so a publisher that never suspends
    otherwise gives the loop a turn (waiting for the commit) within that many events,
    not 250,000."""
    bus = EventBus(ring_size=1_000_000, flow_wait_s=30)
    bus.hold = True
    seen: list[int] = []

    async def journal() -> None:   # commits what it finds once it runs
        seen.append(bus.last_event_id)
        bus.release(bus.last_event_id)

    async with anyio.create_task_group() as tg:
        tg.start_soon(journal)
        for _ in range(6000):
            bus.publish("session_update", {})
            await bus.wait_for_readers()
            if seen:
                break
        assert seen and seen[0] <= 2000, bus.last_event_id   # the default ring's quarter


async def test_a_publisher_on_a_bus_not_held_gives_the_loop_turns():
    """The in-memory journal: a publisher that never suspends otherwise (the in-process
    agent's ``/chunks 100000``) and has no slow reader to wait for still lets the event
    loop run every 2,000 events (a ``session/cancel``, every other request)."""
    bus = EventBus(ring_size=8000)
    sub = bus.subscribe()   # a reader that keeps up: nothing to wait for
    seen: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_note, seen, bus)
        for _ in range(10_000):
            bus.publish("session_update", {})
            while sub.get_nowait() is not None:
                pass
            await bus.wait_for_readers()
            if seen:
                break
        # within two turns: trio runs a ready batch in either order
        assert seen and seen[0] <= 2 * 2000, bus.last_event_id


async def _note(seen: list[int], bus: EventBus) -> None:
    seen.append(bus.last_event_id)
