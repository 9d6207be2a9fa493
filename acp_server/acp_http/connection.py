"""Per-connection state of the ``/acp`` transport: the connection stream, one
``SessionChannel`` per session the connection uses, pending agent-to-client requests,
the sessions the connection made.

    conn = AcpConnection("c-1", bridge)
    conn.push(encode_result(1, {"sessions": []}))      # connection stream, buffered
    channel = conn.channel(session_id)                  # subscribes to the session bus
    channel.track_prompt(ticket, rpc_id=3)              # reply {stopReason} on the stream
    while await channel.wait_ready():                   # what a GET / WebSocket writes
        frame = channel.pop()
    conn.close()                                        # detach, cancel, close its sessions

Contracts:

* Every buffer is bounded, and there is one queue per stream. Bus events wait in the
  bridge's bus subscription (a ``bridge.fifo.BoundedFifo``: bounded, evicting a
  reader that falls too far behind; the channel then resubscribes from the last
  event it delivered, replaying from the session ring) and are translated into
  JSON-RPC frames as the reader takes them: no pump task, no second queue. Direct
  replies wait in a ``BoundedFifo`` of ``SESSION_BUFFER`` / ``CONNECTION_BUFFER``
  frames and ``REPLY_BUFFER_BYTES`` (past it a reply is dropped and logged; the HTTP
  door refuses new requests before that, ``AcpConnection.replies_full``).
* A reader takes frames in the order they arrived: the rest of the frames of the
  event it is taking, then a direct reply once every bus event queued before it was
  taken, else the next bus event. A ``session/prompt`` response is made when its
  turn's ``turn_complete`` / ``turn_error`` event is taken, so it always follows the
  turn's ``session/update`` notifications.
* A ``permission_request`` becomes a ``session/request_permission`` request only
  while it is pending (a replayed, resolved one is a ``_qwen/notify``). One this
  connection was sent and did not answer is withdrawn when it is resolved otherwise:
  ``$/cancel_request {requestId}`` follows the ``permission_resolved`` notification
  (an elicitation's likewise). The client's late answer is ignored.
* Bus events are delivered at most once per channel per bus epoch (``delivered_id``);
  ``rewind`` (a GET with ``Last-Event-ID``) is the only way to see them again.
* ``flush_through(event_id)`` returns once the reader has written every frame of the
  bus events up to ``event_id`` (at once without a reader, at most after
  ``FLUSH_TIMEOUT_S``): ``session/load`` answers only after its history is written.
  Without a session reader on Streamable HTTP it moves the history to the connection
  stream instead (``take_now``), ahead of the answer.
* ``close()`` is synchronous and idempotent: this connection's running requests
  (``in_flight``) are cancelled, so a spawn in flight gives its session slot back; its
  queued and running prompts are cancelled (which cancels their permission requests),
  the other permission requests it was sent are cancelled, and the sessions it made
  (``owned``: ``session/new``, a cold ``session/load`` or ``session/resume``) are
  closed, except where ``served_elsewhere`` (another live connection serves the
  session; for a lost resumable connection the registry lets them linger instead).
  Every subscription is closed and every stream ends after its buffered frames.
  Prompts sent with a client prompt id (``detached``) belong to their session, not
  to the connection: a close leaves them running (a client re-attaches them by that
  id).
* A ``resumable`` connection (asked for at ``initialize``) gets the bus event id and
  epoch of every event frame in ``params._meta`` (``frames.with_event_meta``).
* At most ``MAX_CHANNELS_PER_CONNECTION`` channels. A request that makes or restores
  a session holds one (``channel_room``) before the bridge makes it: past the cap it
  is refused with no session made. At the cap, the channels of sessions the bridge
  no longer holds, with no reader and no reply or prompt of this connection pending
  (``SessionChannel.releasable``), are dropped first.
* ``in_flight`` maps the request ids of the requests running now to their cancel
  scopes (``$/cancel_request``, and ``close()``), bounded by the requests a client can
  have running.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator

import anyio

from acp_server.acp_http import elicitation
from acp_server.acp_http import frames as fr
from acp_server.acp_http.errors import (  # noqa: F401 - re-exported
    ChannelLimitError,
    ConnectionClosedError,
    RpcId,
    encode_bridge_error,
)
from acp_server.acp_http.frames import Frame
from acp_server.principals import LOCAL_CALLER, Caller
from bridge import Bridge, PromptTicket, Subscription, Wakeup
from bridge import events as ev
from bridge.errors import BridgeError, SessionNotFoundError
from bridge.events import Event
from bridge.fifo import BoundedFifo
from bridge.jsonrpc import encode_result

log = logging.getLogger("acp_server.acp_http")

CONNECTION_BUFFER = 2048         # direct replies waiting on the connection stream
SESSION_BUFFER = 1024            # ... on one session stream
# Bytes of replies one connection may hold for a reader that has not taken them;
# past it a POST is answered 503 + Retry-After and a WebSocket closed (1013). One
# frame past the bound is kept, so the bound is this plus one reply.
REPLY_BUFFER_BYTES = 8 * 1024 * 1024
MAX_CHANNELS_PER_CONNECTION = 256
MAX_TRACKED_PROMPTS = 1024       # per channel; admission normally bounds it far lower
                                 # (not at all with --max-pending-prompts-per-session 0)
MAX_PENDING_REQUESTS = 1024      # agent-to-client requests awaiting this client's answer
FLUSH_TIMEOUT_S = 10.0           # a reader that takes longer does not hold a reply back


def _put_reply(fifo: BoundedFifo[Frame], frame: Frame, where: str) -> bool:
    if fifo.put_nowait(frame, len(frame.payload)):
        return True
    if not fifo.closed:
        log.warning("acp %s: stream buffer full, frame dropped", where)
    return False


class SessionChannel:
    """One session's stream on one connection."""

    def __init__(self, conn: AcpConnection, session_id: str) -> None:
        self.conn = conn
        self.session_id = session_id
        self.ready = Wakeup()   # a reply or an event arrived, a (re)subscription, the end
        self.replies: BoundedFifo[Frame] = BoundedFifo(SESSION_BUFFER, REPLY_BUFFER_BYTES,
                                                       wakeup=self.ready)
        # Beside each reply: the subscription and how many of its frames were put when
        # the reply came (the reply goes after them).
        self._reply_marks: deque[tuple[Subscription | None, int]] = deque()
        self.subscription: Subscription | None = None
        self.epoch: str | None = None
        self.delivered_id = 0   # the last bus event translated
        self.written_id = 0     # the last bus event whose frames the reader wrote
        self._taking: deque[Frame] = deque()   # the rest of the frames of the taken event
        self._taking_id = 0
        self._taken_id = 0
        self._written = Wakeup()
        self.prompts: dict[str, tuple[RpcId, PromptTicket]] = {}
        self.detached: set[str] = set()   # prompt ids a close leaves running
        self.reader_attached = False
        self.retired = False
        self.first_id = 0   # the first bus event of this channel's epoch it may carry

    # -- subscription ------------------------------------------------------------------
    def subscribe(self, last_event_id: int | None = None, epoch: str | None = None) -> bool:
        """(Re)subscribe to the session bus; ``False`` if the bridge has no such session.
        Raises ``SubscriberLimitExceededError`` at the bus's subscriber cap. Another
        principal's session is no session (``Caller.sees_session``)."""
        if not self.conn.caller.sees_session(self.session_id):
            return False
        try:
            subscription = self.conn.bridge.subscribe(
                self.session_id, last_event_id=last_event_id, epoch=epoch, wakeup=self.ready)
        except SessionNotFoundError:
            return False
        if subscription.epoch != self.epoch:
            self.epoch = subscription.epoch
            self.delivered_id = self.written_id = self._taken_id = self._taking_id = 0
            # live from now on: it never carries an event before (a replay may)
            self.first_id = subscription.next_id if last_event_id is None else 0
        elif last_event_id is not None:
            self.first_id = 0   # a replay in this epoch: it may carry any of them
        old, self.subscription = self.subscription, subscription
        if old is not None:
            old.close()
        self.ready.set()
        return True

    def ensure_subscribed(self) -> bool:
        subscription = self.subscription
        if subscription is not None and not subscription.ended:
            return True
        if subscription is not None and subscription.evicted_reason is not None:
            return self.subscribe(last_event_id=self.delivered_id, epoch=self.epoch)
        return self.subscribe()

    def rewind(self, last_event_id: int, epoch: str | None) -> bool:
        """A reader asks for events after ``last_event_id``: drop the frames of the
        event being taken (they will be replayed, in order) and resubscribe with that
        cursor."""
        self._taking = deque(f for f in self._taking if f.event_id is None)
        self._taking_id = self._taken_id   # what was dropped is not taken
        if epoch is None or epoch == self.epoch:
            self.delivered_id = min(self.delivered_id, last_event_id)
        else:
            self.delivered_id = 0     # a foreign epoch: the bus replays its whole ring
        return self.subscribe(last_event_id=last_event_id, epoch=epoch)

    # -- direct frames ---------------------------------------------------------------
    def push(self, payload: bytes) -> None:
        subscription = self.subscription
        if _put_reply(self.replies, Frame(None, payload),
                      f"connection {self.conn.id} session {self.session_id}"):
            mark = subscription.taken + len(subscription) if subscription is not None else 0
            self._reply_marks.append((subscription, mark))

    def track_prompt(self, ticket: PromptTicket, rpc_id: RpcId, *, detached: bool = False) -> None:
        self.prompts[ticket.prompt_id] = (rpc_id, ticket)
        if detached:
            self.detached.add(ticket.prompt_id)

    # -- the reader ----------------------------------------------------------------------
    async def wait_ready(self) -> bool:
        """``True`` when a frame is ready, ``False`` once retired and drained. Consumes
        nothing (a heartbeat timeout may cancel it)."""
        while True:
            if self._taking or len(self.replies):
                return True
            subscription = self.subscription
            if subscription is not None:
                if subscription.ready:
                    return True
                if subscription.ended:
                    self._subscription_ended(subscription)
                    continue
            if self.retired:
                return False
            await self.ready.wait()

    def pop(self) -> Frame | None:
        """The next frame (see the module contracts), or ``None``."""
        while True:
            if self._taking:
                frame = self._taking.popleft()
                if not self._taking:
                    self._taken_id = max(self._taken_id, self._taking_id)
                return frame
            subscription = self.subscription
            if self._reply_marks:
                marked, mark = self._reply_marks[0]
                if marked is not subscription or subscription is None \
                        or subscription.taken >= mark:   # every event queued before it taken
                    self._reply_marks.popleft()
                    return self.replies.get_nowait()
            event = subscription.receive_nowait() if subscription is not None else None
            if event is None:
                return None
            frames = self._translate(event)
            if frames:
                self._taking.extend(frames)
                if event.id is not None:
                    self._taking_id = event.id
            elif event.id is not None:
                self._taken_id = max(self._taken_id, event.id)

    def sent(self, count: int) -> None:
        """The reader wrote every frame it popped."""
        self.written_id = self._taken_id
        self._written.set()

    def detach_reader(self) -> None:
        self.reader_attached = False
        self._written.set()

    async def flush_through(self, event_id: int) -> None:
        """Wait until the reader has written the frames of the bus events up to
        ``event_id`` (see the module contracts)."""
        if event_id < self.first_id:   # published before this channel followed the bus
            return
        with anyio.move_on_after(FLUSH_TIMEOUT_S):
            while self.reader_attached and not self.retired and self.written_id < event_id:
                await self._written.wait()

    def drain_now(self) -> None:
        """Translate what the subscription holds right now, ahead of any reply pushed
        after this (``session/close``: the turn's last events and prompt replies come
        first)."""
        subscription = self.subscription
        while subscription is not None:
            event = subscription.receive_nowait()
            if event is None:
                return
            self._taking.extend(self._translate(event))
            if event.id is not None:
                self._taking_id = max(self._taking_id, event.id)
                if not self._taking:
                    self._taken_id = max(self._taken_id, event.id)

    def take_now(self) -> list[Frame]:
        """Every frame ready right now (the rest of the event being taken, then what
        the subscription holds, translated), taken by a reader elsewhere: they count
        as written (``session/load`` on a connection stream, ``dispatch``)."""
        self.drain_now()
        frames = list(self._taking)
        self._taking.clear()
        self._taken_id = self.written_id = max(self._taken_id, self._taking_id)
        self._written.set()
        return frames

    def _subscription_ended(self, subscription: Subscription) -> None:
        """The subscription ended by itself: evicted (resubscribe from what was
        delivered, the ring replays the rest) or its session closed."""
        if self.subscription is not subscription:
            return
        self.subscription = None
        if subscription.evicted_reason is not None and not self.retired:
            try:
                self.subscribe(last_event_id=self.delivered_id, epoch=self.epoch)
            except BridgeError as exc:
                log.debug("acp session %s: resubscribe failed: %s", self.session_id, exc)

    def _translate(self, event: Event) -> list[Frame]:
        if event.id is not None:
            if event.id <= self.delivered_id:
                return []
            self.delivered_id = event.id
        kind = event.type
        if kind == ev.CLIENT_EVICTED:
            return []    # not the client's concern: the channel resubscribes and replays
        if kind == ev.SESSION_UPDATE:
            return [self._annotated(fr.update_frame(event))]
        if kind == ev.PERMISSION_REQUEST:
            found = fr.permission_frame(event)
            # a replayed request that was resolved meanwhile is history, not a question
            if found is not None and self.conn.bridge.permission_pending(found[0]):
                self.conn.expect_answer(found[0], self.session_id)
                return [self._annotated(found[1])]
        elif kind in (ev.PERMISSION_RESOLVED, ev.ELICITATION_RESOLVED):
            request_id = event.data.request_id
            if self.conn.pending_requests.pop(request_id, None) is not None:
                # asked here, resolved otherwise: the client's question is withdrawn
                return [self._annotated(fr.notify_frame(event)), fr.withdrawn_frame(request_id)]
        elif kind in elicitation.KINDS:
            return [self._annotated(f) for f in elicitation.elicitation_frames(self.conn, self,
                                                                               event)]
        frames = [self._annotated(fr.notify_frame(event))]
        if kind in (ev.TURN_COMPLETE, ev.TURN_ERROR):
            tracked = self.prompts.get(event.prompt_id)  # type: ignore[arg-type]
            # a turn's terminal event follows its ticket's settlement: one not settled
            # is tracked under the id of an earlier prompt, refused at its admission,
            # whose end this is (the id was sent again: bridge.status.REFUSED_CODES)
            if tracked is not None and tracked[1].done:
                frames.append(self._prompt_response(event.prompt_id))  # type: ignore[arg-type]
        return frames

    def _annotated(self, frame: Frame) -> Frame:
        if self.conn.resumable and frame.event_id is not None and self.epoch is not None:
            return fr.with_event_meta(frame, self.session_id, self.epoch)
        return frame

    def _prompt_response(self, prompt_id: str) -> Frame:
        rpc_id, ticket = self.prompts.pop(prompt_id)
        self.detached.discard(prompt_id)
        outcome = ticket.outcome
        assert outcome is not None   # _translate: settled
        if isinstance(outcome, BaseException):
            return Frame(None, encode_bridge_error(rpc_id, outcome))
        return Frame(None, encode_result(rpc_id, outcome.response))

    # -- teardown ----------------------------------------------------------------------
    def cancel_prompts(self, reason: str) -> None:
        for prompt_id, (_rpc_id, ticket) in list(self.prompts.items()):
            if prompt_id not in self.detached:
                ticket.cancel(reason)

    def cancel_request(self, rpc_id: RpcId) -> bool:
        """``$/cancel_request`` for a ``session/prompt`` awaiting its turn's end: the
        prompt is cancelled (its answer follows, ``stopReason: "cancelled"``)."""
        for _prompt_id, (tracked_id, ticket) in list(self.prompts.items()):
            if tracked_id == rpc_id and type(tracked_id) is type(rpc_id):
                ticket.cancel("client_cancel")
                return True
        return False

    def releasable(self) -> bool:
        """No reader, no request of this connection waiting on it (a tracked prompt, a
        reply not taken), and a session the bridge does not hold: closed elsewhere, its
        agent dead, or never made (a stream opened for a ``session/load`` that failed).
        Only the events of that gone session may be left, which no reader asked for."""
        return not self.reader_attached and not self.prompts and not len(self.replies) \
            and not self.conn.bridge.has_session(self.session_id)

    def retire(self) -> None:
        """End this stream: no more frames; the reader ends after the buffered ones."""
        if self.retired:
            return
        self.retired = True
        if self.subscription is not None:
            self.subscription.close()
        self.replies.close()
        self.ready.set()
        self._written.set()


class AcpConnection:
    """One ACP client connection (many sessions)."""

    def __init__(self, connection_id: str, bridge: Bridge, *, websocket: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: monotonic seconds, for ``streams_gone_at`` (the registry's)."""
        self.id = connection_id
        self.bridge = bridge
        self._clock = clock
        self.websocket = websocket
        self.created_at = time.time()
        self._frames_taken = Wakeup()   # the stream's reader took it below half full
        self.frames: BoundedFifo[Frame] = BoundedFifo(CONNECTION_BUFFER, REPLY_BUFFER_BYTES,
                                                      low_water=self._frames_taken)
        self.channels: dict[str, SessionChannel] = {}
        # agent-to-client request id -> session id, oldest first (bounded).
        self.pending_requests: OrderedDict[str, str] = OrderedDict()
        self.owned: set[str] = set()   # sessions this connection made
        self.making = 0   # channels held for sessions being made (``channel_room``)
        self.reader_attached = False
        self.open_streams = 0
        self.streams_gone_at: float | None = clock()
        self.closed = False
        self.resumable = False
        self.elicitation = False   # the client offered clientCapabilities.elicitation
        self.in_flight: dict[tuple[type, RpcId], anyio.CancelScope] = {}
        # Set by a WebSocket while attached: called for every new channel.
        self.on_channel: Callable[[SessionChannel], None] | None = None
        # Who opened it (``initialize``): only the same principal may use it.
        self.caller: Caller = LOCAL_CALLER

    def replies_full(self) -> bool:
        """``REPLY_BUFFER_BYTES`` or more wait in this connection's buffers, or one of
        them is at its frame cap, counting the requests still running (a reply put
        there would be dropped)."""
        if len(self.frames) + len(self.in_flight) >= CONNECTION_BUFFER - 1 or any(
                len(c.replies) >= SESSION_BUFFER - 1 for c in self.channels.values()):
            return True
        total = self.frames.nbytes + sum(c.replies.nbytes for c in self.channels.values())
        return total >= REPLY_BUFFER_BYTES

    # -- the connection stream ---------------------------------------------------------
    def push(self, payload: bytes) -> None:
        _put_reply(self.frames, Frame(None, payload), f"connection {self.id}")

    async def push_paced(self, payload: bytes, timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
        """``push``, once the stream's buffer is below half full (its reader takes
        it): a long history never overflows it. ``False`` when the reader took
        nothing for ``timeout_s`` (nothing pushed)."""
        with anyio.move_on_after(timeout_s):
            while self.frames.half_full() and not self.frames.closed:
                await self._frames_taken.wait()
            self.push(payload)
            return True
        return False

    async def wait_ready(self) -> bool:
        return await self.frames.wait()

    def pop(self) -> Frame | None:
        return self.frames.get_nowait()

    def sent(self, count: int) -> None:
        """The reader wrote what it popped (nothing waits for it here)."""

    def detach_reader(self) -> None:
        self.reader_attached = False

    # -- sessions ------------------------------------------------------------------------
    def own(self, session_id: str) -> None:
        """This connection made ``session_id``: closed with the connection (see
        ``close``), at once when the connection closed while it was being made (a
        spawn need not yield, so it may finish in a request cancelled before it ran)."""
        if not self.closed:
            self.owned.add(session_id)
            return
        try:
            self.bridge.close_session_soon(session_id, reason="connection_closed",
                                           closed_by=self.id)
        except BridgeError:
            pass   # closed already
        raise ConnectionClosedError(self.id)

    # -- session channels ------------------------------------------------------------
    @contextlib.contextmanager
    def channel_room(self, session_id: str | None = None) -> Iterator[None]:
        """Hold a channel for the session a request is about to make or restore
        (``session_id``, when known and without a channel here): ``ChannelLimitError``
        now, before the session exists, when the channels and those held are at the
        cap. The caller opens the channel (``channel``) right after the block, with no
        wait between."""
        if session_id is not None and session_id in self.channels:
            yield
            return
        if not self._room_for_one():
            raise ChannelLimitError(MAX_CHANNELS_PER_CONNECTION)
        self.making += 1
        try:
            yield
        finally:
            self.making -= 1

    def channel(self, session_id: str) -> SessionChannel:
        """This connection's channel for ``session_id``, created (and subscribed when
        the bridge knows the session) on first use. Raises ``ChannelLimitError`` (its
        channels and those held by ``channel_room`` at the cap) or
        ``ConnectionClosedError`` once closed (a late reply must not subscribe).
        Another principal's session gets a channel as an unknown id does (existence
        does not leak), which is never subscribed (``SessionChannel.subscribe``)."""
        if self.closed:
            raise ConnectionClosedError(self.id)
        channel = self.channels.get(session_id)
        if channel is None:
            if not self._room_for_one():
                raise ChannelLimitError(MAX_CHANNELS_PER_CONNECTION)
            channel = self.channels[session_id] = SessionChannel(self, session_id)
            if self.on_channel is not None:
                self.on_channel(channel)
        channel.ensure_subscribed()
        return channel

    def _room_for_one(self) -> bool:
        """Room for one more channel; at the cap, the ``releasable`` channels are
        dropped first (a long-lived connection keeps no channel of every session that
        ended elsewhere, nor of every id a client opened a stream for)."""
        if len(self.channels) + self.making < MAX_CHANNELS_PER_CONNECTION:
            return True
        for session_id, channel in list(self.channels.items()):
            if channel.releasable():
                self.drop_channel(session_id)
        return len(self.channels) + self.making < MAX_CHANNELS_PER_CONNECTION

    def drop_channel(self, session_id: str) -> None:
        channel = self.channels.pop(session_id, None)
        if channel is not None:
            channel.retire()
        self.owned.discard(session_id)

    def expect_answer(self, request_id: str, session_id: str) -> None:
        self.pending_requests[request_id] = session_id
        self.pending_requests.move_to_end(request_id)
        while len(self.pending_requests) > MAX_PENDING_REQUESTS:
            self.pending_requests.popitem(last=False)

    # -- streams bookkeeping (for reaping) -------------------------------------------------
    def stream_opened(self) -> None:
        self.open_streams += 1
        self.streams_gone_at = None

    def stream_closed(self) -> None:
        self.open_streams = max(0, self.open_streams - 1)
        if self.open_streams == 0:
            self.streams_gone_at = self._clock()

    # -- teardown ------------------------------------------------------------------------
    def close(self, *, served_elsewhere: Callable[[str], bool] = lambda _sid: False) -> None:
        """Detach every session (see the module contracts). ``served_elsewhere(sid)``:
        another live connection serves that session, so its permission requests stay
        pending and, if this connection made it, it stays open."""
        if self.closed:
            return
        self.closed = True
        for scope in list(self.in_flight.values()):
            scope.cancel()
        for channel in self.channels.values():
            channel.cancel_prompts("connection_closed")
        for request_id, session_id in list(self.pending_requests.items()):
            if not served_elsewhere(session_id):
                try:
                    self.bridge.respond_to_permission(request_id, {"outcome": "cancelled"},
                                                      session_id=session_id)
                except BridgeError:
                    pass  # already resolved, or the session is gone
        self.pending_requests.clear()
        for channel in self.channels.values():
            channel.retire()
        self.channels.clear()
        self.frames.close()
        for session_id in sorted(self.owned):
            if served_elsewhere(session_id):
                continue
            try:
                self.bridge.close_session_soon(session_id, reason="connection_closed",
                                               closed_by=self.id)
            except BridgeError:
                pass   # closed already
        self.owned.clear()
