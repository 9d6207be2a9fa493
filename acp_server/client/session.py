"""``DaemonSessionClient``: one session, one long-lived event subscription.

    session = await DaemonSessionClient.create_or_attach(client)
    async with anyio.create_task_group() as tg:
        async def watch() -> None:
            async with contextlib.aclosing(session.events()) as events:
                async for event in events:
                    ...                                 # every event of the session
        tg.start_soon(watch)
        result = await session.prompt("hello")           # settled by the stream above
        tg.cancel_scope.cancel()

Contracts:

* The factories keep the peer SDK's parameter positions: ``create_or_attach(client,
  req=None, client_id=None)``, ``load(client, session_id, req=None, client_id=None)``,
  ``resume(client, session_id, req=None, client_id=None)``. Constructing directly may
  override the local cap (``max_pending_prompts_per_session``; by default the client's).
* The first subscription starts at event 0 for a freshly created session (live-only
  for an attached one) and at the server's ``lastEventId`` after load/resume; later
  ones continue from the last event seen, with the same epoch.
* ``prompt`` without a running ``events()`` delegates to ``DaemonClient.prompt`` (with
  this session's cap). With one, it reserves a local slot, sends the prompt
  non-blocking, and waits for the subscription to deliver the matching
  ``turn_complete`` / ``turn_error``; that event releases the slot. Cancellation by
  the caller releases it and cancels the prompt on the server; the subscription ending
  fails every waiting prompt with ``DaemonStreamEndedError`` and releases its slot.
* Terminal events that arrive before their 202 is read are kept (at most
  ``MAX_EARLY_RESULTS``, oldest dropped) so the prompt still settles; so is the fact
  that a prompt started, so a cancel then targets it with ``cancel`` (a prompt not
  seen running is dropped from the queue by id first).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import anyio
import anyio.lowlevel

from acp_server.client.daemon import CANCEL_GRACE_S, DaemonClient, PromptInput, _TurnWatch
from acp_server.client.errors import DaemonError, DaemonStreamEndedError
from acp_server.client.events import StreamCursor, event_prompt_id, match_turn_event
from acp_server.client.reservations import Reservation, normalize_pending_prompt_limit
from acp_server.client.wire import (CreateSessionRequest, DaemonEvent, PromptAccepted,
                                    PromptResult, RestoreRequest, SessionInfo)

MAX_EARLY_RESULTS = 256
_INHERIT: Any = object()


class _Waiter:
    """One prompt waiting for its terminal event; ``settle`` runs once."""

    __slots__ = ("done", "error", "reservation", "result", "watch")

    def __init__(self, reservation: Reservation) -> None:
        self.reservation = reservation
        self.watch = _TurnWatch("")   # what the stream showed of this prompt (for cancel)
        self.done = anyio.Event()
        self.result: PromptResult | None = None
        self.error: BaseException | None = None

    def settle(self, result: PromptResult | None, error: BaseException | None) -> None:
        if self.done.is_set():
            return
        self.result, self.error = result, error
        self.reservation.release()
        self.done.set()

    def outcome(self) -> PromptResult:
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


Outcome = tuple[PromptResult | None, BaseException | None]


def _terminal(event: DaemonEvent, prompt_id: str) -> Outcome:
    try:
        return match_turn_event(event, prompt_id), None
    except DaemonError as exc:
        return None, exc


class DaemonSessionClient:
    def __init__(self, client: DaemonClient, session: SessionInfo, *,
                 client_id: str | None = None, last_event_id: int | None = None,
                 event_epoch: str | None = None,
                 max_pending_prompts_per_session: int | float | None = _INHERIT) -> None:
        self.client = client
        self.session = session
        self.client_id = client_id if client_id is not None else session.client_id
        self.cursor = StreamCursor(last_event_id, event_epoch or session.event_epoch)
        self.max_pending_prompts_per_session = (
            client.max_pending_prompts_per_session if max_pending_prompts_per_session is _INHERIT
            else normalize_pending_prompt_limit(max_pending_prompts_per_session))
        self._subscriptions = 0
        self._waiters: dict[str, _Waiter] = {}
        self._early: OrderedDict[str, Outcome] = OrderedDict()
        self._started: OrderedDict[str, None] = OrderedDict()

    @property
    def session_id(self) -> str:
        return self.session.session_id

    @property
    def pending_prompt_count(self) -> int:
        return self.client.pending_prompt_count(self.session_id)

    # -- factories ----------------------------------------------------------------------------
    @classmethod
    async def create_or_attach(cls, client: DaemonClient,
                               req: CreateSessionRequest | Mapping[str, Any] | None = None,
                               client_id: str | None = None) -> DaemonSessionClient:
        info = await client.create_or_attach_session(req, client_id)
        if isinstance(req, CreateSessionRequest):
            fields = (req.approval_mode, req.model_service_id)
        else:
            fields = ((req or {}).get("approvalMode"), (req or {}).get("modelServiceId"))
        from_start = not info.attached or any(value is not None for value in fields)
        return cls(client, info, last_event_id=0 if from_start else None)

    @classmethod
    async def load(cls, client: DaemonClient, session_id: str,
                   req: RestoreRequest | Mapping[str, Any] | None = None,
                   client_id: str | None = None) -> DaemonSessionClient:
        info = await client.load_session(session_id, req, client_id)
        return cls(client, info, last_event_id=info.last_event_id or 0)

    @classmethod
    async def resume(cls, client: DaemonClient, session_id: str,
                     req: RestoreRequest | Mapping[str, Any] | None = None,
                     client_id: str | None = None) -> DaemonSessionClient:
        info = await client.resume_session(session_id, req, client_id)
        return cls(client, info, last_event_id=info.last_event_id or 0)

    # -- events -------------------------------------------------------------------------------
    async def events(self, *, max_queued: int | None = None) -> AsyncGenerator[DaemonEvent, None]:
        """The session's events from the cursor on, resumed across drops; settles this
        session's waiting prompts as their terminal events pass."""
        self._subscriptions += 1
        try:
            stream = self.client.subscribe_events(self.session_id, cursor=self.cursor,
                                                  max_queued=max_queued, client_id=self.client_id)
            async with contextlib.aclosing(stream) as events:
                async for event in events:
                    self._observe(event)
                    yield event
        finally:
            self._subscriptions -= 1
            if self._subscriptions == 0:
                self._fail_waiters()

    def _observe(self, event: DaemonEvent) -> None:
        if event.type not in ("turn_complete", "turn_error"):
            pid = event_prompt_id(event)
            if pid is None:
                return
            watching = self._waiters.get(pid)
            if watching is not None:
                watching.watch.see(event)
            elif event.type != "pending_prompt_added":  # started before its 202 was read
                self._started[pid] = None
                while len(self._started) > MAX_EARLY_RESULTS:
                    self._started.popitem(last=False)
            return
        data = event.data if isinstance(event.data, dict) else {}
        prompt_id = data.get("promptId") or event.prompt_id
        if not isinstance(prompt_id, str):
            return
        outcome = _terminal(event, prompt_id)
        self._started.pop(prompt_id, None)
        waiter = self._waiters.pop(prompt_id, None)
        if waiter is not None:
            waiter.settle(*outcome)
            return
        self._early[prompt_id] = outcome
        while len(self._early) > MAX_EARLY_RESULTS:
            self._early.popitem(last=False)

    def _fail_waiters(self) -> None:
        waiters, self._waiters = self._waiters, {}
        for prompt_id, waiter in waiters.items():
            waiter.settle(None, DaemonStreamEndedError(
                f"Event stream of session {self.session_id!r} ended before prompt "
                f"{prompt_id!r} completed"))

    # -- prompts ------------------------------------------------------------------------------
    async def submit_prompt(self, req: PromptInput) -> PromptAccepted | PromptResult:
        """Admission only (no local reservation)."""
        return await self.client.prompt_nonblocking(self.session_id, req, self.client_id)

    async def prompt(self, req: PromptInput) -> PromptResult:
        if self._subscriptions == 0:
            return await self.client._prompt(self.session_id, req, self.client_id,
                                             self.max_pending_prompts_per_session, None)
        await anyio.lowlevel.checkpoint_if_cancelled()
        reservation = self.client.reserve_prompt_slot(self.session_id,
                                                      self.max_pending_prompts_per_session)
        waiter = _Waiter(reservation)
        try:
            answer = await self.client.prompt_nonblocking(self.session_id, req, self.client_id)
            if isinstance(answer, PromptResult):
                return answer  # a legacy blocking daemon
            prompt_id = answer.prompt_id
            early = self._early.pop(prompt_id, None)
            if early is not None:
                waiter.settle(*early)
            elif self._subscriptions == 0:
                waiter.settle(None, DaemonStreamEndedError(
                    f"Event stream of session {self.session_id!r} ended"))
            else:
                waiter.watch.prompt_id = prompt_id
                if self._started.pop(prompt_id, 0) is None:
                    waiter.watch.running = True
                self._waiters[prompt_id] = waiter
            try:
                await waiter.done.wait()
            except anyio.get_cancelled_exc_class():
                self._waiters.pop(prompt_id, None)
                with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_GRACE_S):
                    waiter.watch.prompt_id = prompt_id
                    await self.client._cancel_turn(self.session_id, waiter.watch, self.client_id)
                raise
            return waiter.outcome()
        finally:
            reservation.release()

    # -- session operations -------------------------------------------------------------------
    async def cancel(self) -> None:
        await self.client.cancel(self.session_id, self.client_id)

    async def close(self) -> None:
        await self.client.close_session(self.session_id, self.client_id)

    async def respond_to_permission(self, request_id: str, response: Mapping[str, Any]) -> bool:
        return await self.client.respond_to_permission(request_id, response, self.client_id,
                                                       session_id=self.session_id)
