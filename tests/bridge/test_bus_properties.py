"""Property: a held bus (a durable journal's: events reach readers as commits release
them) gives every reader its events in id order with no gap and no duplicate, under
any interleaving of publishes, releases, subscribes (live, from a cursor, from 0),
reads of any size, byte trims of the ring and a close. A reader the ring lapped is
told (``state_resync_required`` then the events from where it resumes, or
``client_evicted`` and nothing after); it never sees a silent gap."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bridge import events as ev
from bridge.bus import EventBus, Subscription

RING = 32


@dataclass
class Reader:
    subscription: Subscription
    cursor: int | None          # None: live from its subscribe
    live_from: int              # the bus's last id when it subscribed
    seen: list[int] = field(default_factory=list)
    next_expected: int | None = None
    ended: bool = False         # evicted or closed: nothing more may come


class HeldBus(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # A small ring and, for some runs, a byte bound that trims it sooner.
        self.bus = EventBus(ring_size=RING, max_queued=8, max_subscribers=8)
        self.bus.hold = True
        self.readers: list[Reader] = []

    @rule(n=st.integers(1, 12), weight=st.integers(0, 300))
    def publish(self, n: int, weight: int) -> None:
        for _ in range(n):
            self.bus.publish("x", {"pad": "p" * weight})

    @rule(k=st.integers(0, 40))
    def release(self, k: int) -> None:
        self.bus.release(min(self.bus.last_event_id, self.bus.released_id + k))

    @rule(limit=st.sampled_from([600, 2_000, 64 * 1024 * 1024]))
    def bound_ring_bytes(self, limit: int) -> None:
        self.bus.ring_bytes = limit

    @precondition(lambda self: len(self.readers) < 6 and not self.bus.closed)
    @rule(cursor=st.one_of(st.none(), st.just(0), st.integers(0, 80)))
    def subscribe(self, cursor: int | None) -> None:
        if cursor is not None:
            cursor = min(cursor, self.bus.last_event_id)
        subscription = self.bus.subscribe(last_event_id=cursor)
        reader = Reader(subscription, cursor, self.bus.last_event_id)
        reader.next_expected = cursor + 1 if cursor is not None else self.bus.last_event_id + 1
        self.readers.append(reader)

    @precondition(lambda self: bool(self.readers))
    @rule(i=st.integers(0, 7), nbytes=st.integers(1, 4_000),
          how=st.sampled_from(["take", "get"]))
    def read(self, i: int, nbytes: int, how: str) -> None:
        reader = self.readers[i % len(self.readers)]
        subscription = reader.subscription
        if how == "take":
            frames = subscription.take(nbytes)
        else:
            frame = subscription.get_nowait()
            frames = [frame] if frame is not None else []
        for frame in frames:
            assert not reader.ended, "a frame after the stream ended"
            if frame.type == ev.STATE_RESYNC_REQUIRED:
                reader.next_expected = frame.data.earliest_available_id
            elif frame.type == ev.CLIENT_EVICTED:
                reader.ended = True
            elif frame.id is not None:
                assert frame.id == reader.next_expected, (reader.cursor, reader.seen, frame.id)
                reader.seen.append(frame.id)
                reader.next_expected = frame.id + 1

    @rule()
    def close(self) -> None:
        self.bus.close()

    @invariant()
    def nothing_unreleased_is_read(self) -> None:
        for reader in self.readers:
            assert not reader.seen or reader.seen[-1] <= self.bus.released_id

    def teardown(self) -> None:
        """Everything released reaches a reader still attached, once it reads on."""
        self.bus.release(self.bus.last_event_id)
        for reader in self.readers:
            if reader.ended or reader.subscription.evicted_reason is not None:
                continue
            while True:
                frames = reader.subscription.take(1 << 20)
                if not frames:
                    break
                for frame in frames:
                    if frame.type == ev.STATE_RESYNC_REQUIRED:
                        reader.next_expected = frame.data.earliest_available_id
                    elif frame.type == ev.CLIENT_EVICTED:
                        reader.ended = True
                    elif frame.id is not None:
                        assert frame.id == reader.next_expected
                        reader.next_expected = frame.id + 1
            if not reader.ended:
                assert reader.next_expected == self.bus.last_event_id + 1, (
                    reader.cursor, reader.live_from, reader.next_expected)


HeldBus.TestCase.settings = settings(max_examples=150, stateful_step_count=50, deadline=None,
                                     suppress_health_check=list(HealthCheck))
TestHeldBus = HeldBus.TestCase
