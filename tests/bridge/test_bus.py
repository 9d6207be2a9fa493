"""Event bus: ids, epoch, replay, resync, slow subscribers, the subscriber cap."""

from __future__ import annotations

import msgspec
import pytest

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
