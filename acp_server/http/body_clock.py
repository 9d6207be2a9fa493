"""A request body that stops arriving: answered 408 rather than held for ever.

    clock = BodyClock(receive, timeout_s=10.0)
    await app(scope, clock.receive, clock.bind(send, answer_408))
    await clock.settle()        # the 408, when the body timed out and nothing was answered

Why: the header timeout ends when a request's head is complete, and no HTTP server we
ship has a timer for its body (hyper's ``header_read_timeout`` and the uvicorn guard
cover heads only). A request whose body never comes (HTTP/2: HEADERS without
END_STREAM, then nothing; HTTP/1.1: a ``Content-Length`` never met) stayed in flight
for as long as the client kept the connection alive (granian's keep-alive PING is
answered by any live client), and a request in flight is never cut by the idle sweep
and counts against ``--max-connections``: one HTTP/2 connection opening 100 such
streams held 100 of the cap, 26 held all of it (every new request 503).

Contracts:

* ``receive``: until the body is complete (an ``http.request`` without
  ``more_body``) or the client gone, each call must be answered within ``timeout_s``
  of being made (the time between two pieces of the body, as nginx's
  ``client_body_timeout``; a body trickled faster than that is not bounded here, only
  by the body caps). Past it the body is abandoned: this and every later call return
  ``http.disconnect`` (the app's body reader raises ``ClientDisconnected``). Once the
  body is complete, calls pass through untimed (an event stream waits for the
  disconnect for as long as it lasts). An app slow to ask is never timed: the clock
  runs while a call waits.
* ``bind(send, answer)``: the app's ``send``. Once the body timed out, the first
  response the app starts is replaced by ``answer(send)`` (the door's 408, sent as
  soon as the timeout passes: nothing of the body is read or awaited before it; over
  HTTP/1.x with ``Connection: close``: ``body_timeout(scope)``), and the app's own
  messages are dropped; a response already started before is left alone.
* ``settle()``: when the body timed out and the app answered nothing, ``answer`` now.
* ``drain(limit)``: once answered, what the app left unread of the body is read and
  dropped (at most ``limit`` bytes; the front layer does it over HTTP/2).
* ``replay(chunks, last, receive)``: a ``receive`` that gives a body already read
  (the front layer's hot path) and then the rest.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Iterator
from dataclasses import replace
from typing import Any

import anyio
from starlette.types import Message, Receive, Scope, Send

from acp_server.http.policy import Refusal

BODY_TIMEOUT = Refusal(408, "request_timeout",
                       "The request body stopped arriving: none of what was left of it "
                       "came within the header timeout.")
# Over HTTP/1.x the 408 closes the connection (RFC 9110: the server has chosen to close
# it rather than wait on): the body's rest is not coming, and without it uvicorn kept the
# connection open after the answer for its keep-alive timeout (5 s) against the cap;
# granian closed it already. HTTP/2 has no such header: the stream ends, the connection
# serves on.
BODY_TIMEOUT_CLOSE = replace(BODY_TIMEOUT, headers=((b"connection", b"close"),))


def body_timeout(scope: Scope) -> Refusal:
    """The 408 for ``scope``'s connection: ``BODY_TIMEOUT_CLOSE`` over HTTP/1.x,
    ``BODY_TIMEOUT`` over HTTP/2."""
    return BODY_TIMEOUT if scope.get("http_version") == "2" else BODY_TIMEOUT_CLOSE

DISCONNECT: Message = {"type": "http.disconnect"}

Answer = Callable[[Send], Awaitable[None]]


class BodyClock:
    __slots__ = ("_answer", "_complete", "_receive", "_send", "_started", "_timeout",
                 "timed_out")

    def __init__(self, receive: Receive, timeout_s: float) -> None:
        self._receive = receive
        self._timeout = timeout_s
        self._complete = False
        self._started = False
        self._send: Send | None = None
        self._answer: Answer | None = None
        self.timed_out = False

    def receive(self) -> Awaitable[Message]:
        """The app's ``receive``: an awaitable, not a coroutine (the clock itself until
        the body is complete, then the server's own read), so a timed read is one
        generator step over the server's. The clock (a cancel scope, ~10 µs on asyncio)
        is started only when the server's read suspends: a body already received, the
        common case, costs one step of its coroutine."""
        if self._complete:
            return self._receive()   # type: ignore[no-any-return]
        return self

    def __await__(self) -> Generator[Any, Any, Message]:
        if self.timed_out:
            return DISCONNECT
        steps = self._receive().__await__()
        try:
            suspended = next(steps)
        except StopIteration as done:   # the body already there: no clock started
            message: Message = done.value
        else:
            message = DISCONNECT
            with anyio.move_on_after(self._timeout):
                message = yield from _resume(steps, suspended)
        if message is DISCONNECT:
            self.timed_out = True
        elif message["type"] != "http.request" or not message.get("more_body", False):
            self._complete = True
        return message

    @property
    def complete(self) -> bool:
        """The body was read to its end, or the client is gone, or it timed out."""
        return self._complete or self.timed_out

    def bind(self, send: Send, answer: Answer) -> Send:
        self._send, self._answer = send, answer

        async def guarded(message: Message) -> None:
            if self.timed_out:
                if not self._started:
                    self._started = True
                    await answer(send)
                return
            if message["type"] == "http.response.start":
                self._started = True
            await send(message)

        return guarded

    async def drain(self, limit: int) -> None:
        """Read and drop what is left of a body the app answered without reading, at
        most ``limit`` bytes more (each piece within the timeout, as any read): over
        HTTP/2 granian resets a stream whose body is left unread, so a client still
        sending it loses the answer (httpx: ``LocalProtocolError``), and the window
        the unread data held stalls the connection by the third such request."""
        read = 0
        while not self.complete and read <= limit:
            message = await self.receive()
            if message["type"] != "http.request":
                return
            read += len(message.get("body", b""))

    async def settle(self) -> None:
        if self.timed_out and not self._started and self._send is not None \
                and self._answer is not None:
            self._started = True
            try:
                await self._answer(self._send)
            except OSError:
                pass   # the client went away meanwhile


def _resume(steps: Iterator[Any], suspended: Any) -> Generator[Any, Any, Message]:
    """Go on driving ``steps`` from where it suspended, as ``yield from`` would (a
    server's awaitable may be a plain iterator: granian's has no ``send`` nor
    ``throw``; what is thrown in is then raised here, the awaitable abandoned)."""
    while True:
        try:
            sent = yield suspended
        except GeneratorExit:
            close = getattr(steps, "close", None)
            if close is not None:
                close()
            raise
        except BaseException as exc:   # noqa: BLE001 - a cancellation, passed on
            throw = getattr(steps, "throw", None)
            if throw is None:
                raise
            try:
                suspended = throw(exc)
            except StopIteration as done:
                return done.value   # type: ignore[no-any-return]
        else:
            try:
                suspended = next(steps) if sent is None else steps.send(sent)  # type: ignore[attr-defined]
            except StopIteration as done:
                return done.value   # type: ignore[no-any-return]


def replay(chunks: list[bytes], last: Message | None, receive: Receive) -> Receive:
    """A ``receive`` that gives the body read so far as one message, then the rest. A
    disconnect seen while reading (``last``) follows an unfinished body: the body was
    never complete, and the app's reader says so (``ClientDisconnected``)."""
    pending: list[Message] = []
    if last is not None and "more" in last:
        pending.append({"type": "http.request", "body": b"".join(chunks), "more_body": True})
    elif last is not None:   # a disconnect seen while reading
        if chunks:
            pending.append({"type": "http.request", "body": b"".join(chunks),
                            "more_body": True})
        pending.append(last)
    else:
        pending.append({"type": "http.request", "body": b"".join(chunks), "more_body": False})

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()   # type: ignore[no-any-return]

    return replayed


__all__ = ["BODY_TIMEOUT", "BODY_TIMEOUT_CLOSE", "BodyClock", "body_timeout", "replay"]
