"""The bytes of ``/load`` answers in flight, per server: a session's history may be
tens of megabytes (its event ring keeps up to ``--event-ring-bytes``), built whole in
memory for each request, so concurrent loads of one large session grew the process by
that much each (sixteen loads of a 58 MB history: 1.6 GB of RSS).

    budget = BodyBudget()
    with budget.taken(bridge.history_bytes(session_id)) as held:   # or RestError 503
        info = await bridge.load_session(...)                      # the history is built
        return held.response(encode(info), 200)                    # counted until sent

Contracts: ``taken(estimate)`` admits a request while the bytes in flight plus its
estimate stay within ``limit``, or when nothing is in flight (so one answer over the
limit is still served), before anything is built; ``response`` counts the body's real
size instead, until it has been sent (in ``CHUNK`` pieces, so an HTTP server that
buffers what it is given waits for its reader between them) or its sending failed
(the client gone); leaving ``taken`` without a response gives the estimate back.
Past the limit the answer is 503 ``{error, code: "server_busy", limit}`` with
``Retry-After: 1``: the request is safe to send again (a ``/load`` of a live session
attaches again).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from acp_server.rest.errors import RestError

LARGE_ANSWERS_BUDGET = 256 * 1024 * 1024   # bytes of ``/load`` answers in flight, per server
RETRY_AFTER_S = 1
CHUNK = 256 * 1024   # the pieces an answer is sent in


class BodyBudget:
    def __init__(self, limit: int | None = None) -> None:
        self.limit = LARGE_ANSWERS_BUDGET if limit is None else limit
        self.used = 0
        self.refused = 0

    @contextmanager
    def taken(self, estimate: int) -> Iterator[Held]:
        if self.used and self.used + estimate > self.limit:
            self.refused += 1
            raise RestError(503, {"error": "Too many large answers in flight; retry shortly",
                                  "code": "server_busy", "limit": self.limit},
                            {"Retry-After": str(RETRY_AFTER_S)})
        held = Held(self, estimate)
        self.used += estimate
        try:
            yield held
        finally:
            if not held.handed:
                held.release()


class Held:
    """A request's share of the budget: its estimate, then its answer's size."""

    def __init__(self, budget: BodyBudget, size: int) -> None:
        self._budget: BodyBudget | None = budget
        self.size = size
        self.handed = False

    def response(self, body: bytes, status: int,
                 headers: Mapping[str, str] | None = None) -> Response:
        if self._budget is not None:
            self._budget.used += len(body) - self.size
            self.size = len(body)
        self.handed = True
        return _Budgeted(self, body, status, headers)

    def release(self) -> None:
        if self._budget is not None:
            self._budget.used -= self.size
            self._budget = None


class _Budgeted(Response):
    def __init__(self, held: Held, body: bytes, status: int,
                 headers: Mapping[str, str] | None) -> None:
        super().__init__(body, status, headers, "application/json")
        self._held = held

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            body = memoryview(self.body)
            end = 0
            while True:
                piece, end = bytes(body[end:end + CHUNK]), end + CHUNK
                await send({"type": "http.response.body", "body": piece,
                            "more_body": end < len(body)})
                if end >= len(body):
                    break
        finally:
            self._held.release()
