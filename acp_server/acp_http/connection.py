"""Per-connection state of the ``/acp`` transport: the connection stream, one
``SessionChannel`` per session the connection uses, pending agent-to-client requests.

    conn = AcpConnection("c-1", bridge)
    conn.push(encode_result(1, {"sessions": []}))      # connection stream, buffered
    channel = conn.channel(session_id)                  # subscribes to the session bus
    channel.track_prompt(ticket, rpc_id=3)              # reply {stopReason} on the stream
    async for frame in conn.frames: ...                 # what a GET / WebSocket writes
    conn.close()                                        # detach, cancel own prompts

Contracts:

* Every buffer is bounded. Frames wait in a ``FrameBuffer`` of ``CONNECTION_BUFFER``
  / ``SESSION_BUFFER`` frames (direct replies get headroom; past it they are dropped
  and counted in ``frames.dropped``). Bus events wait in the bridge's bus subscription, which is
  bounded and evicts a reader that falls too far behind: the channel then
  resubscribes from the last event it delivered, replaying from the session ring.
* Bus events reach a session stream only while ``pump()`` runs (a GET or WebSocket
  reader is attached); until then they stay queued in the subscription. A
  ``session/prompt`` response is emitted by the pump when it meets the prompt's
  ``turn_complete`` / ``turn_error`` event, so it always follows the turn's
  ``session/update`` notifications on the wire.
* A ``permission_request`` becomes a ``session/request_permission`` request only
  while it is pending (a replayed, resolved one is a ``_qwen/notify``).
* Bus events are delivered at most once per channel per bus epoch (``delivered_id``);
  ``rewind`` (a GET with ``Last-Event-ID``) is the only way to see them again.
* ``flush_through(event_id)`` returns once the reader has written every frame of the
  bus events up to ``event_id`` (at once without a reader, at most after
  ``FLUSH_TIMEOUT_S``): ``session/load`` answers only after its history is written.
* ``close()`` is synchronous and idempotent: this connection's queued and running
  prompts are cancelled (which cancels their permission requests), the other
  permission requests it was sent are cancelled when ``cancel_permissions``, every
  subscription is closed and every stream ends after its buffered frames. Prompts
  sent with a client prompt id (``detached``) belong to their session, not to the
  connection: a close leaves them running (a client re-attaches them by that id).
* A ``resumable`` connection (asked for at ``initialize``) gets the bus event id and
  epoch of every event frame in ``params._meta`` (``frames.with_event_meta``).
* ``in_flight`` maps the request ids of the requests running now to their cancel
  scopes (``$/cancel_request``), bounded by the requests a client can have running.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

import anyio

from acp_server.acp_http import elicitation
from acp_server.acp_http import frames as fr
from acp_server.acp_http.buffer import FrameBuffer
from acp_server.acp_http.errors import (  # noqa: F401 - re-exported
    ChannelLimitError,
    ConnectionClosedError,
    RpcId,
    encode_bridge_error,
)
from acp_server.acp_http.frames import Frame
from acp_server.principals import LOCAL_CALLER, Caller
from bridge import Bridge, PromptTicket, Subscription
from bridge import events as ev
from bridge.errors import BridgeError, SessionNotFoundError
from bridge.events import Event
from bridge.jsonrpc import encode_result

log = logging.getLogger("acp_server.acp_http")

CONNECTION_BUFFER = 1024
SESSION_BUFFER = 512
# Bytes of replies and frames one connection may hold for a reader that has not
# taken them; past it a POST is answered 503 + Retry-After and a WebSocket closed
# (1013). One frame past the bound is kept, so the bound is this plus one reply.
REPLY_BUFFER_BYTES = 8 * 1024 * 1024
MAX_CHANNELS_PER_CONNECTION = 256
MAX_TRACKED_PROMPTS = 1024       # per channel; admission normally bounds it far lower
                                 # (not at all with --max-pending-prompts-per-session 0)
MAX_PENDING_REQUESTS = 1024      # agent-to-client requests awaiting this client's answer
FLUSH_TIMEOUT_S = 10.0           # a reader that takes longer does not hold a reply back



class SessionChannel:
    """One session's stream on one connection."""

    def __init__(self, conn: AcpConnection, session_id: str) -> None:
        self.conn = conn
        self.session_id = session_id
        self.frames = FrameBuffer(SESSION_BUFFER, REPLY_BUFFER_BYTES)
        self.subscription: Subscription | None = None
        self.epoch: str | None = None
        self.delivered_id = 0
        self.buffered_id = 0   # the last bus event whose frames are in ``frames`` (or gone)
        self.prompts: dict[str, tuple[RpcId, PromptTicket]] = {}
        self.detached: set[str] = set()   # prompt ids a close leaves running
        self.reader_attached = False
        self.retired = False
        self._changed = anyio.Event()

    # -- subscription ------------------------------------------------------------------
    def subscribe(self, last_event_id: int | None = None, epoch: str | None = None) -> bool:
        """(Re)subscribe to the session bus; ``False`` if the bridge has no such session.
        Raises ``SubscriberLimitExceededError`` at the bus's subscriber cap."""
        bridge = self.conn.bridge
        try:
            bus_epoch = bridge.get_session(self.session_id).bus.epoch
            subscription = bridge.subscribe(self.session_id, last_event_id=last_event_id,
                                            epoch=epoch)
        except SessionNotFoundError:
            return False
        if bus_epoch != self.epoch:
            self.epoch, self.delivered_id, self.buffered_id = bus_epoch, 0, 0
        old, self.subscription = self.subscription, subscription
        if old is not None:
            old.close()
        self._wake()
        return True

    def ensure_subscribed(self) -> bool:
        subscription = self.subscription
        if subscription is not None and not subscription.ended:
            return True
        if subscription is not None and subscription.evicted_reason is not None:
            return self.subscribe(last_event_id=self.delivered_id, epoch=self.epoch)
        return self.subscribe()

    def rewind(self, last_event_id: int, epoch: str | None) -> bool:
        """A reader asks for events after ``last_event_id``: drop buffered bus frames
        (they will be replayed, in order) and resubscribe with that cursor."""
        for frame in self.frames.take_all():
            if frame.event_id is None:
                self._push(frame)
        if epoch is None or epoch == self.epoch:
            self.delivered_id = min(self.delivered_id, last_event_id)
        else:
            self.delivered_id = 0     # a foreign epoch: the bus replays its whole ring
        return self.subscribe(last_event_id=last_event_id, epoch=epoch)

    # -- direct frames ---------------------------------------------------------------
    def push(self, payload: bytes) -> None:
        self._push(Frame(None, payload))

    def _push(self, frame: Frame) -> None:
        if not self.frames.push(frame) and not self.frames.closed:
            log.warning("acp connection %s session %s: stream buffer full, frame dropped",
                        self.conn.id, self.session_id)

    def track_prompt(self, ticket: PromptTicket, rpc_id: RpcId, *, detached: bool = False) -> None:
        self.prompts[ticket.prompt_id] = (rpc_id, ticket)
        if detached:
            self.detached.add(ticket.prompt_id)

    # -- the pump (runs while a reader is attached) -----------------------------------
    async def pump(self) -> None:
        """Move bus events, translated, into this stream until ``retire()``."""
        try:
            while not self.retired:
                subscription = self.subscription
                if subscription is None:
                    await self._wait_changed()
                    continue
                async for event in subscription:
                    for frame in self._translate(event):
                        await self.frames.put(frame)
                    if event.id is not None and event.id > self.buffered_id:
                        self.buffered_id = event.id
                        self.frames.notify()
                    if self.subscription is not subscription:
                        break
                if self.subscription is subscription:   # it ended by itself
                    self.subscription = None
                    if subscription.evicted_reason is not None:
                        self._resubscribe_after_eviction()
        except anyio.ClosedResourceError:
            return

    async def flush_through(self, event_id: int) -> None:
        """Wait until the reader has written the frames of the bus events up to
        ``event_id`` (see the module contracts)."""
        with anyio.move_on_after(FLUSH_TIMEOUT_S):
            while self.reader_attached and not self.retired and self.buffered_id < event_id:
                await self.frames.changed()
            mark = self.frames.appended
            while self.reader_attached and not self.retired and self.frames.written < mark:
                await self.frames.changed()

    def drain_now(self) -> None:
        """Translate what the subscription holds right now into the stream buffer
        (before the channel is retired, so nothing already published is lost)."""
        subscription = self.subscription
        while subscription is not None:
            event = subscription.receive_nowait()
            if event is None:
                return
            for frame in self._translate(event):
                self._push(frame)
            if event.id is not None and event.id > self.buffered_id:
                self.buffered_id = event.id

    def _resubscribe_after_eviction(self) -> None:
        try:
            self.subscribe(last_event_id=self.delivered_id, epoch=self.epoch)
        except BridgeError as exc:
            log.debug("acp session %s: resubscribe failed: %s", self.session_id, exc)

    async def _wait_changed(self) -> None:
        await self._changed.wait()
        self._changed = anyio.Event()

    def _wake(self) -> None:
        self._changed.set()

    def _translate(self, event: Event) -> list[Frame]:
        if event.id is not None:
            if event.id <= self.delivered_id:
                return []
            self.delivered_id = event.id
        kind = event.type
        if kind == ev.CLIENT_EVICTED:
            return []    # not the client's concern: the pump resubscribes and replays
        if kind == ev.SESSION_UPDATE:
            return [self._annotated(fr.update_frame(event))]
        if kind == ev.PERMISSION_REQUEST:
            found = fr.permission_frame(event)
            # a replayed request that was resolved meanwhile is history, not a question
            if found is not None and self.conn.bridge.permissions.is_pending(found[0]):
                self.conn.expect_answer(found[0], self.session_id)
                return [self._annotated(found[1])]
        elif kind == ev.PERMISSION_RESOLVED:
            self.conn.pending_requests.pop(getattr(event.data, "requestId", ""), None)
        elif kind in elicitation.KINDS:
            return [self._annotated(f) for f in elicitation.elicitation_frames(self.conn, self,
                                                                               event)]
        frames = [self._annotated(fr.notify_frame(event))]
        if kind in (ev.TURN_COMPLETE, ev.TURN_ERROR) and event.prompt_id in self.prompts:
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
        assert outcome is not None, "a turn's terminal event follows its ticket's settlement"
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

    def retire(self) -> None:
        """End this stream: no more frames; the reader ends after the buffered ones."""
        if self.retired:
            return
        self.retired = True
        if self.subscription is not None:
            self.subscription.close()
            self.subscription = None
        self.frames.close()
        self._wake()


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
        self.frames = FrameBuffer(CONNECTION_BUFFER, REPLY_BUFFER_BYTES)
        self.channels: dict[str, SessionChannel] = {}
        # agent-to-client request id -> session id, oldest first (bounded).
        self.pending_requests: OrderedDict[str, str] = OrderedDict()
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
        """``REPLY_BUFFER_BYTES`` or more wait in this connection's buffers."""
        total = self.frames.nbytes + sum(c.frames.nbytes for c in self.channels.values())
        return total >= REPLY_BUFFER_BYTES

    # -- the connection stream ---------------------------------------------------------
    def push(self, payload: bytes) -> None:
        if not self.frames.push(Frame(None, payload)) and not self.frames.closed:
            log.warning("acp connection %s: stream buffer full, frame dropped", self.id)

    # -- session channels ------------------------------------------------------------
    def channel(self, session_id: str) -> SessionChannel:
        """This connection's channel for ``session_id``, created (and subscribed when
        the bridge knows the session) on first use. Raises ``ChannelLimitError``, or
        ``ConnectionClosedError`` once closed (a late reply must not subscribe)."""
        if self.closed:
            raise ConnectionClosedError(self.id)
        channel = self.channels.get(session_id)
        if channel is None:
            if len(self.channels) >= MAX_CHANNELS_PER_CONNECTION:
                raise ChannelLimitError(MAX_CHANNELS_PER_CONNECTION)
            channel = self.channels[session_id] = SessionChannel(self, session_id)
            if self.on_channel is not None:
                self.on_channel(channel)
        channel.ensure_subscribed()
        return channel

    def drop_channel(self, session_id: str) -> None:
        channel = self.channels.pop(session_id, None)
        if channel is not None:
            channel.retire()

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
    def close(self, *, cancel_permissions: Callable[[str], bool] = lambda _sid: True) -> None:
        """Detach every session. ``cancel_permissions(session_id)`` says whether the
        permission requests this connection was sent on that session are cancelled
        (not when another connection still serves the session)."""
        if self.closed:
            return
        self.closed = True
        for channel in self.channels.values():
            channel.cancel_prompts("connection_closed")
        for request_id, session_id in list(self.pending_requests.items()):
            if cancel_permissions(session_id):
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
