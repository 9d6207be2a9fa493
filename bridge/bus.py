"""A session's event bus: ids from 1, an epoch per bus, a bounded ring, replay, and
bounded subscriber queues.

    bus = EventBus(ring_size=8000, max_subscribers=64)
    bus.publish(TURN_COMPLETE, TurnComplete(session_id=sid, stop_reason="end_turn",
                                            prompt_id=pid), prompt_id=pid)

    subscription = bus.subscribe(last_event_id=12, epoch=bus.epoch)
    async for event in subscription:   # replayed events, replay_complete, then live
        send(wire.envelope(event))

Contracts:

* ``publish`` and ``subscribe`` are synchronous: no event is published between a
  subscriber's replay snapshot and its first live event, so nothing is missed or
  doubled.
* Without a cursor a subscriber gets live events only. With one it gets every ring
  event after the cursor, then ``replay_complete``. When the cursor cannot be
  honoured it first gets ``state_resync_required`` (``epoch_reset`` for a foreign
  epoch or a cursor ahead of the bus, ``ring_evicted`` when events after the cursor
  are gone, ``replay_budget_exceeded`` when the replay is over its byte budget) and
  then whatever the ring still holds.
* Each event is encoded once, at ``publish`` (``bridge.wire.envelope``, kept on the
  event); its length is the event's ``size``, what the bounds below count.
* The ring keeps at most ``ring_size`` events and, of those readers were released,
  at most ``ring_bytes`` of them (the newest always stays): a reader behind what it
  dropped is lapped, as by the count.
* A subscriber's queue is a ``bridge.fifo.BoundedFifo``: it holds at most
  ``max_queued`` frames, and at most ``max_queued_bytes`` bytes besides its newest
  frame (so one frame larger than the byte bound reaches a
  reader that reads). At 75 % of either bound the subscriber gets one
  ``slow_client_warning`` (re-armed below 37.5 %); past a bound it gets
  ``client_evicted`` and its stream ends. A slow reader never blocks ``publish``.
* Flow control: a publisher that can wait (the in-process agent's updates, the
  prompt echo) awaits ``wait_for_readers()`` between events. It waits while a reader
  holds half of either bound or more, until that reader drains to three eighths (an
  eighth of its bound taken, not one frame), but at most ``FLOW_WAIT_S`` in all: a
  reader that has not drained by then is ``stalled`` and not waited for again until it
  drained to three eighths (it is warned and evicted as above; ``Subscription`` clears
  ``stalled`` as its reader takes events). So a reader that keeps up is never evicted
  by a burst, and readers that stopped, or trickle at less than an eighth of their
  bound per ``FLOW_WAIT_S``, cost a publisher ``FLOW_WAIT_S`` once, however many they
  are. (A reader just above that rate still sets the publisher's pace: a per-reader
  budget of waiting would end that too; not built.)
* Held (``hold``, a durable session journal, ``bridge.journal``): ``publish`` gives the
  event its id, puts it in the ring and hands it to ``sink`` (the journal), but readers
  get it only after ``release(id)`` (its commit landed), in order; replay and
  ``ring_events`` show released events only. Readers are then fed from the ring as they
  read (``Subscription._top_up``, up to half their bounds), so a commit of thousands of
  events never floods one. A reader's backlog is what it has not taken (``behind``);
  it is evicted (``queue_overflow``) past ``evict_at`` (its ``max_queued`` plus a
  quarter ring, at most the ring) or when the ring passes it. As in the push mode, it
  gets one ``slow_client_warning`` when a release brings its backlog to 75 % of
  ``evict_at`` (``queueSize`` its backlog, ``maxQueued`` ``evict_at``, ``queuedBytes``
  the backlog's bytes), re-armed once it had drained below 37.5 %, and always one
  before ``client_evicted``. A publisher that can wait keeps at most a quarter ring
  (``JOURNAL_WINDOW_MAX`` at most: the journal window) uncommitted and waits
  (``flow_wait_s`` at most) while a reader lags by half of ``evict_at`` or more,
  counting events not yet committed (``lag``), so a reader that keeps up is never warned
  however large a commit; one that has not drained by then is ``stalled`` as above and
  evicted once past ``evict_at``. A publisher that never suspends otherwise (the
  in-process agent) thus runs to one of those bounds, then the journal commits what it
  published while it waits: production and commit alternate, in commits of up to a
  journal window; while the journal is stalled (not waited for again) it still gives the
  loop a turn every window of events. (Giving the loop a turn every 128 uncommitted
  events, so the writer committed while the publisher went on, cost more than it
  overlapped: the two contend for the GIL. Measured in docs/benchmark-log.md,
  2026-12-07, "held events".) Not held, a publisher that waited for no reader gives the
  loop a turn every ``JOURNAL_WINDOW_MAX`` events.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel

from bridge import events as ev
from bridge import wire
from bridge.errors import SubscriberLimitExceededError
from bridge.events import Event
from bridge.fifo import BoundedFifo
from bridge.ids import uuid4_str
from bridge.subscription import Subscription
from bridge.wakeup import Wakeup

__all__ = ["EventBus", "Subscription", "REPLAY_BUDGET_BYTES", "DEFAULT_RING_BYTES",
           "FLOW_WAIT_S", "JOURNAL_WINDOW_MAX"]

REPLAY_BUDGET_BYTES = 8 * 1024 * 1024
DEFAULT_RING_BYTES = 64 * 1024 * 1024   # a session's ring, in its events' envelopes
FLOW_WAIT_S = 0.5
# The most events a held publisher leaves uncommitted before it waits for the journal
# (the default ring's quarter): a ring of up to 1,000,000 events (``event_ring_size``)
# would otherwise let an in-process agent run 250,000 events without a loop turn. On a
# bus that does not hold, a publisher that waited for no reader gives the loop a turn
# as often (else an in-process agent's turn of 100,000 chunks kept it whole).
JOURNAL_WINDOW_MAX = 2000


class EventBus:
    def __init__(self, *, ring_size: int = 8000, max_subscribers: int = 64,
                 max_queued: int = 256, max_queued_bytes: int = 2 * 1024 * 1024,
                 ring_bytes: int = DEFAULT_RING_BYTES,
                 flow_wait_s: float = FLOW_WAIT_S, session_id: str = "",
                 on_evict: Callable[[], None] | None = None,
                 epoch: str | None = None) -> None:
        """``epoch``: the epoch to continue (a restored session's); a fresh one by
        default."""
        self.flow_wait_s = flow_wait_s
        self.epoch = epoch or uuid4_str()
        self.on_evict = on_evict   # called once per evicted subscriber
        self.session_id = session_id
        self._ring: deque[Event] = deque(maxlen=ring_size)
        # The ring is bounded in bytes too (its events' envelopes): past ``ring_bytes``
        # its oldest events readers were released are dropped, as the count drops them.
        self.ring_bytes = ring_bytes
        self._ring_size_bytes = 0
        # uncommitted events (see hold): a quarter ring, at most JOURNAL_WINDOW_MAX
        self._journal_window = max(1, min(ring_size // 4, JOURNAL_WINDOW_MAX))
        self._last_id = 0
        # Held (a durable journal, see ``hold``): events are in the ring at once but
        # reach readers when ``release`` says they are committed. ``_released_id`` is
        # the last event readers may see; ``sink`` gets each event to journal.
        self.hold = False
        self.sink: Callable[[Event, bytes], None] | None = None   # (event, its envelope)
        self._released_id = 0
        self._close_when_released = False
        self._released: anyio.Event | None = None   # a publisher waits for a commit
        self._journal_stalled = False
        self._lag_check_at = 0   # a held publisher checks its readers' lag from this id
        self._subscribers: list[Subscription] = []
        self.max_subscribers = max_subscribers
        self.max_queued = max_queued
        self.max_queued_bytes = max_queued_bytes
        self.closed = False

    @property
    def last_event_id(self) -> int:
        return self._last_id

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    @property
    def released_id(self) -> int:
        """The last event readers may see (``last_event_id`` unless held)."""
        return self._released_id

    def restore(self, events: list[Event], last_event_id: int) -> None:
        """Continue a journaled bus: its newest events (in id order) and its last id."""
        self._last_id = self._released_id = last_event_id
        self._extend(events)

    def follow(self, events: list[Event]) -> None:
        """A replica of a bus another process publishes (``acp_server.fleet``): its
        committed events, with their ids, in order after ``last_event_id``, reach
        readers as ``release`` gives them (a held bus: the same flow control)."""
        if events:
            self._extend(events)
            self._last_id = events[-1].id  # type: ignore[assignment]
            self.release(self._last_id)

    def _trim_bytes(self) -> None:
        """The oldest released events out while the ring is over ``ring_bytes`` (the
        newest event always stays; one not yet released is never dropped)."""
        ring = self._ring
        while self._ring_size_bytes > self.ring_bytes and len(ring) > 1 \
                and ring[0].id <= self._released_id:  # type: ignore[operator]
            self._ring_size_bytes -= ring.popleft().size

    def _extend(self, events: list[Event]) -> None:
        """``events`` into the ring, its bytes counted by what enters and what the
        count drops (not the whole ring again)."""
        ring = self._ring
        dropped = len(ring) + len(events) - (ring.maxlen or 0)
        if dropped > 0:   # the oldest go: first the ring's, then the new events' own
            old = min(dropped, len(ring))
            self._ring_size_bytes -= sum(e.size for e in itertools.islice(ring, old))
            events = events[dropped - old:]
        ring.extend(events)
        self._ring_size_bytes += sum(event.size for event in events)
        self._trim_bytes()

    @property
    def ring_size_bytes(self) -> int:
        """What the ring's events weigh (their envelopes' bytes)."""
        return self._ring_size_bytes

    @property
    def earliest_available_id(self) -> int:
        return self._ring[0].id if self._ring else self._last_id + 1  # type: ignore[return-value]

    def ring_events(self, *, held: bool = False) -> list[Event]:
        """The events the ring still holds that readers may see, oldest first (``held``:
        those not committed yet too, every event published)."""
        if held or self._released_id == self._last_id:
            return list(self._ring)
        return [event for event in self._ring if event.id <= self._released_id]  # type: ignore[operator]

    def held_prompt_ids(self) -> set[str | None]:
        """The prompts of the ring's events readers may not see yet (held: not yet
        committed), newest first scanned; empty when nothing is held."""
        released = self._released_id
        if released == self._last_id:
            return set()
        held: set[str | None] = set()
        for event in reversed(self._ring):
            if event.id <= released:  # type: ignore[operator]
                break
            held.add(event.prompt_id)
        return held

    def publish(self, type_: str, data: Any, *, prompt_id: str | None = None,
                originator_client_id: str | None = None) -> Event | None:
        """Store and fan out one event. After ``close()`` it is dropped (``None``)."""
        if self.closed:
            return None
        self._last_id += 1
        event = Event(self._last_id, type_, data, prompt_id, originator_client_id)
        envelope = event.encode_first(wire.encode_envelope)   # once, for every door
        event.size = size = len(envelope)
        ring = self._ring
        if len(ring) == ring.maxlen:
            size -= ring[0].size
        ring.append(event)
        self._ring_size_bytes += size
        if self._ring_size_bytes > self.ring_bytes:
            self._trim_bytes()
        if self.sink is not None:
            self.sink(event, envelope)
        if not self.hold:
            self._released_id = self._last_id
            if self._subscribers:   # (a copy: a push may evict, so unsubscribe)
                for subscriber in tuple(self._subscribers):
                    subscriber._push(event)
        return event

    def release(self, through: int) -> None:
        """Held events up to id ``through`` are committed: readers get them, in order,
        each fed from the ring as it reads (``Subscription._top_up``)."""
        if through <= self._released_id:
            return
        previous, self._released_id = self._released_id, min(through, self._last_id)
        if self._ring_size_bytes > self.ring_bytes:
            self._trim_bytes()
        earliest = self.earliest_available_id
        for subscriber in tuple(self._subscribers):
            if not subscriber._entries or not subscriber.half_full():
                subscriber._top_up()
            elif subscriber.next_id < earliest:   # the ring lapped a reader that stopped
                subscriber._evict("queue_overflow")
            if not subscriber.closed:
                subscriber._check_backlog(self._released_id - previous)
        if not self.hold:   # it stops holding: nobody may lag behind direct pushes
            for subscriber in tuple(self._subscribers):
                subscriber._flush_lag()
        if self._close_when_released and self._released_id >= self._last_id:
            self._end_subscriptions()
        if self._released is not None:
            self._released.set()
            self._released = None

    async def wait_released(self, event_id: int) -> None:
        """Until readers may see event ``event_id``: on a held bus, until the journal
        committed it (through any outage: held events are retried until they commit),
        or the bus stops holding (``abandon``, a clean stop); at once otherwise."""
        while self.hold and self._released_id < event_id:
            if self._released is None:
                self._released = anyio.Event()
            await self._released.wait()

    async def wait_for_readers(self) -> None:
        """Flow control between events (see the module contracts): one wait of at
        most ``flow_wait_s`` (default ``FLOW_WAIT_S``) whatever the number of slow
        readers."""
        if self.hold:
            if self._last_id - self._released_id >= self._journal_window \
                    or self._journal_stalled:
                await self._wait_for_journal()
            # no reader can be half its ``evict_at`` behind before ``_lag_check_at``
            if (self._last_id >= self._lag_check_at or self._journal_stalled) \
                    and self._laggard():   # else no reader to wait for: no coroutine
                await self._wait_for_laggards()
            return
        deadline: float | None = None
        for subscriber in tuple(self._subscribers):
            if not subscriber.half_full() or subscriber.stalled:
                continue   # (``stalled`` until it drains: ``Subscription.get_nowait``)
            if deadline is None:
                deadline = anyio.current_time() + self.flow_wait_s
            await subscriber.wait_drained(deadline)
        if deadline is None and self._last_id % JOURNAL_WINDOW_MAX == 0:
            await anyio.lowlevel.checkpoint()   # a publisher that never waited: a turn

    async def _wait_for_journal(self) -> None:
        """Held events are released in commit-sized batches: a publisher that can
        wait keeps at most ``max_queued // 4`` of them uncommitted, so a release never
        floods a reader that keeps up. At most ``flow_wait_s`` per stall of the
        journal (a store that does not commit), as for a stalled reader."""
        window = self._journal_window
        if self._last_id - self._released_id < window:
            self._journal_stalled = False
            return
        if self._journal_stalled:   # not waited for again, but the loop gets a turn
            if (self._last_id - self._released_id) % window == 0:   # once a window
                await anyio.lowlevel.checkpoint()   # (a cancel, the commit ending it)
            return
        with anyio.move_on_after(self.flow_wait_s) as scope:
            while self.hold and self._last_id - self._released_id >= window:
                if self._released is None:
                    self._released = anyio.Event()
                await self._released.wait()
        if scope.cancelled_caught:
            self._journal_stalled = True

    def _laggard(self) -> bool:
        """Whether a reader lags by more than half its ``evict_at`` (what
        ``_wait_for_laggards`` waits for). A reader's ``lag`` grows by one per event
        published and by nothing else, so while none does, the next check is due only
        once the closest of them could
        (``_lag_check_at``; a new subscriber or a stalled journal: at once)."""
        found = False
        journal_stalled = self._journal_stalled
        last = self._last_id
        headroom = self._ring.maxlen or 1
        for subscriber in self._subscribers:
            lag = subscriber.behind() if journal_stalled \
                else last - subscriber.next_id + 1 + subscriber.items   # lag(), inlined
            half = subscriber._evict_at // 2   # lag * 2 <= evict_at
            if lag <= half:
                if half - lag < headroom:
                    headroom = half - lag
            else:
                found = True
        self._lag_check_at = 0 if found or journal_stalled else last + 1 + headroom
        return found

    async def _wait_for_laggards(self) -> None:
        """Flow control on a held bus, as ``wait_for_readers`` does for queues: a reader's
        queue is what it has not taken of the ring, its ``lag`` (published events, so
        that a commit landing at once does not push a reader that keeps up past the
        warning), and its bound is ``evict_at``. A publisher waits while a reader lags
        by half of it or more, until it drains to three eighths, at most ``flow_wait_s`` in
        all; a reader whose committed backlog (``behind``) is still over three eighths
        then is ``stalled``, not waited for again until it drains to them, and evicted
        (``queue_overflow``) once ``behind`` passes ``evict_at``. While the journal is
        stalled only the committed backlog counts."""
        deadline: float | None = None
        for subscriber in tuple(self._subscribers):
            limit = subscriber.evict_at()
            lag = subscriber.behind if self._journal_stalled else subscriber.lag
            if lag() * 2 <= limit:
                continue
            if not subscriber.stalled:
                if deadline is None:
                    deadline = anyio.current_time() + self.flow_wait_s
                low = subscriber._low
                assert low is not None
                with anyio.move_on_at(deadline):   # to three eighths: hysteresis
                    while not subscriber.closed and lag() * 8 > limit * 3:
                        await low.wait()
                    continue
                # the journal's delay is not the reader's
                subscriber.stalled = subscriber.behind() * 8 > limit * 3
            if not subscriber.closed and subscriber.behind() > limit:
                subscriber._evict("queue_overflow")

    def subscribe(self, *, last_event_id: int | None = None, epoch: str | None = None,
                  max_queued: int | None = None, wakeup: Wakeup | None = None) -> Subscription:
        if len(self._subscribers) >= self.max_subscribers:
            raise SubscriberLimitExceededError(self.session_id, self.max_subscribers)
        subscription = Subscription(self, max_queued or self.max_queued, self.max_queued_bytes,
                                    wakeup)
        if last_event_id is not None:
            frames = self._replay_frames(last_event_id, epoch)
            for frame in frames:
                subscription.put_uncounted(frame)
            # what this reader has covered: held events after it come live
            if frames[0].type == ev.STATE_RESYNC_REQUIRED:
                subscription.skip_through = self._released_id
            else:
                subscription.skip_through = max(min(last_event_id, self._last_id),
                                                self._released_id)
        else:
            subscription.skip_through = self._last_id   # live: from now on
        if self.closed and not self._close_when_released:
            BoundedFifo.close(subscription)
        else:
            self._subscribers.append(subscription)
            self._lag_check_at = 0   # its lag is checked at the next event
        return subscription

    def close(self) -> None:
        """End every subscription (after they drain what is queued)."""
        self.closed = True
        if self._released_id < self._last_id:   # held events still to reach readers
            self._close_when_released = True
            return
        self._end_subscriptions()

    def abandon(self) -> None:
        """Another process runs this session now (``Bridge.sessions_moved``): the events
        not yet released are dropped (the journal refused them; the new owner numbers
        its own from the journal), nothing more is published or journaled, and every
        subscription ends after what it was released, with no further event."""
        self.sink = None
        while self._ring and self._ring[-1].id > self._released_id:  # type: ignore[operator]
            self._ring_size_bytes -= self._ring.pop().size
        self._last_id = self._released_id
        self.closed = True
        self._end_subscriptions()
        self.hold = False
        if self._released is not None:
            self._released.set()
            self._released = None

    def _end_subscriptions(self) -> None:
        self._close_when_released = False
        if self.hold:
            for subscriber in self._subscribers:
                subscriber._flush_lag()
        subscribers, self._subscribers = self._subscribers, []
        for subscriber in subscribers:
            BoundedFifo.close(subscriber)

    def _detach(self, subscription: Subscription) -> None:
        try:
            self._subscribers.remove(subscription)
        except ValueError:
            pass

    def _replay_frames(self, cursor: int, epoch: str | None) -> list[Event]:
        earliest = self.earliest_available_id
        frames: list[Event] = []
        resync: tuple[str, str | None] | None = None
        visible = self._ring if self._released_id == self._last_id else self.ring_events()
        if epoch is not None and epoch != self.epoch:
            resync = ("epoch_reset", "epoch_mismatch")
            replay = list(visible)
        elif cursor > self._last_id:
            resync = ("epoch_reset", None)
            replay = list(visible)
        elif cursor + 1 < earliest:
            resync = ("ring_evicted", None)
            replay = list(visible)
        else:
            replay = list(itertools.islice(visible, cursor + 1 - earliest, None))
        total = sum(event.size for event in replay)
        if total > REPLAY_BUDGET_BYTES:   # keep the newest events that fit the budget
            start = 0
            while start < len(replay) and total > REPLAY_BUDGET_BYTES:
                total -= replay[start].size
                start += 1
            replay = replay[start:]
            resync = ("replay_budget_exceeded", None)
        if resync is not None:
            frames.append(Event(None, ev.STATE_RESYNC_REQUIRED, ev.StateResyncRequired(
                reason=resync[0], detail=resync[1], last_delivered_id=cursor,
                # nothing to replay: the next event it gets is the next one released
                # (a held bus's events not released yet come to it live)
                earliest_available_id=replay[0].id if replay else self._released_id + 1)))  # type: ignore[arg-type]
        frames.extend(replay)
        last_replayed = replay[-1].id if replay else min(cursor, self._last_id)
        frames.append(Event(None, ev.REPLAY_COMPLETE, ev.ReplayComplete(
            last_replayed_event_id=last_replayed, last_event_id=last_replayed,  # type: ignore[arg-type]
            replayed_count=len(replay))))
        return frames
