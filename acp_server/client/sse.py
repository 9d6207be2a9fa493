"""One reconnecting Server-Sent Events reader, shared by the session and task streams.

    stream = ResumingStream(http, "/lmsp/v1/tasks/t-1/events", answer=check_answer,
                            request=lambda attempt: ({"Last-Event-ID": "4"}, {}),
                            lost="Task t-1 event stream lost")
    async with contextlib.aclosing(stream.frames()) as frames:
        async for data in frames:            # each event's data (str), never empty
            stream.progressed()               # an event moved the cursor: retries start over
            ...

Contracts:

* Each connection asks ``request(attempt)`` for its headers and query parameters, so a
  reconnect carries the cursor the caller kept (``attempt`` is 0 for the first one).
* ``answer(response, attempt)`` judges each answer before any frame is read: ``READ``
  (parse the frames), ``END`` (the stream is over for good), ``Retry(problem)``; or it
  raises the caller's error.
* Frames without data (the ``retry:`` block, comments) are skipped; a body that is not
  an event stream raises ``DaemonProtocolError``, and so does one line or one event
  over ``max_event_bytes`` (``bounded.MAX_EVENT_BYTES``): what a stream holds is bounded
  whatever the server sends (``acp_server.client.bounded``). Each line must be complete
  within the read timeout (``timeout``, else the client's) of the one before it, plus a
  second per 16 KiB it holds; past that the connection is a drop, resumed as any: a
  server that trickles a line or sends nothing holds the reader for at most
  ``max_reconnects + 1`` such times (plus the backoffs), never for ever.
* A drop (transport error, a clean end, a ``Retry``) is resumed after ``backoff``, at
  most ``max_reconnects`` times in a row without ``progressed()``; past that →
  ``DaemonStreamError(f"{lost} and not resumed after N attempts (problem)")``. With
  ``reconnect=False`` a clean end ends the iteration and a transport error raises
  ``DaemonStreamError``; so does, at once, a connection that failed in a way the next
  would repeat (``errors.lasting_failure``: ``f"{lost}: certificate verify failed: …"``).
* The caller stops the iteration when its stream is done (a terminal event); closing the
  generator drops the connection.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final

import anyio
import httpx

from acp_server.client.bounded import (
    EVENT_STREAM_HEADERS,
    MAX_EVENT_BYTES,
    check_event_stream,
    event_data,
)
from acp_server.client.errors import (DaemonStreamError, lasting_failure, redact,
                                      transport_reason)

MAX_RECONNECT_DELAY_S = 5.0
READ: Final = "read"
END: Final = "end"


@dataclass(frozen=True)
class Retry:
    """An answer worth reconnecting after; ``problem`` says what it was."""

    problem: str


Answer = Callable[[httpx.Response, int], Awaitable[str | Retry]]
Request = Callable[[int], tuple[Mapping[str, str], Mapping[str, str]]]


def backoff(attempt: int, base_delay: float) -> float:
    """0 for the first retry (a drop is usually one-off), then doubling, capped."""
    if attempt <= 1:
        return 0.0
    return float(min(base_delay * 2.0 ** (attempt - 2), MAX_RECONNECT_DELAY_S))


class ResumingStream:
    """See the module contract."""

    def __init__(self, http: httpx.AsyncClient, path: str, *, answer: Answer,
                 request: Request, lost: str, ended: str = "the stream ended",
                 timeout: httpx.Timeout | None = None, reconnect: bool = True,
                 max_reconnects: int = 5, reconnect_delay: float = 0.25,
                 max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.http = http
        self.path = path
        self.answer = answer
        self.request = request
        self.lost = lost
        self.ended = ended
        self.timeout = timeout
        self.reconnect = reconnect
        self.max_reconnects = max_reconnects
        self.reconnect_delay = reconnect_delay
        self.max_event_bytes = max_event_bytes
        self.attempt = 0

    def progressed(self) -> None:
        self.attempt = 0

    def _line_timeout(self) -> float | None:
        timeout = self.timeout if self.timeout is not None else self.http.timeout
        return timeout.read

    async def frames(self) -> AsyncGenerator[str, None]:
        while True:
            headers, params = self.request(self.attempt)
            try:
                async with self.http.stream("GET", self.path, params=params,
                                            headers={**EVENT_STREAM_HEADERS, **headers},
                                            timeout=self.timeout) as response:
                    verdict = await self.answer(response, self.attempt)
                    if verdict == END:
                        return
                    if isinstance(verdict, Retry):
                        problem = verdict.problem
                    else:
                        check_event_stream(response)
                        async for data in event_data(response,
                                                     max_bytes=self.max_event_bytes,
                                                     line_timeout=self._line_timeout()):
                            if data:
                                yield data
                        problem = self.ended
            except httpx.TransportError as exc:
                if not self.reconnect:
                    raise DaemonStreamError(redact(f"Event stream dropped: {exc!r}")) from exc
                if lasting_failure(exc):
                    raise DaemonStreamError(
                        redact(f"{self.lost}: {transport_reason(exc)}")) from exc
                problem = redact(repr(exc))
            if not self.reconnect:
                return
            self.attempt += 1
            if self.attempt > self.max_reconnects:
                raise DaemonStreamError(f"{self.lost} and not resumed after "
                                        f"{self.max_reconnects} attempts ({problem})")
            await anyio.sleep(backoff(self.attempt, self.reconnect_delay))
