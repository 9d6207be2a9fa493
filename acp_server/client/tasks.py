"""``TaskClient``: LMSP v1 async tasks (``/lmsp/v1/tasks``).

    async with TaskClient("http://127.0.0.1:4170") as tasks:
        task = await tasks.create({"model": "reference", "input": "Write a report."})
        async with contextlib.aclosing(tasks.events(task.id)) as events:
            async for event in events:            # TaskEvent(type=…, sequence_number=…)
                if event.type == "response.output_text.delta":
                    print(event.delta, end="")
        done = await tasks.wait(task.id)          # Task(status="succeeded", response={…})

Contracts:

* ``create`` sends an ``Idempotency-Key`` (a new UUID unless given), so a retried
  create returns the same task; ``on_restart`` is ``fail`` unless given.
* Problem objects (``application/problem+json``) become ``LmspProblem`` subclasses
  chosen by ``code`` (``TaskNotFoundError``, ``TaskNotCancelableError``,
  ``EventHistoryExpiredError`` for 410, …); each carries ``code``, ``status`` and
  the whole ``problem``.
* ``events`` replays from ``after`` (default: from the first event), resumes a dropped
  stream with ``Last-Event-ID`` = the last ``sequence_number`` seen (at most
  ``max_reconnects`` times in a row without progress), and stops after the terminal
  event (or on ``204``: nothing after the cursor). Events are yielded one at a time.
* Each request of a call ends within ``timeout`` seconds, its answer included (a
  server that trickles it fails the call with ``DaemonConnectionError`` "timed out");
  ``events`` reads as ``acp_server.client.sse`` says (each line within the stream's
  read timeout, at least ``MIN_STREAM_READ_TIMEOUT_S``). A redirect is never followed
  (``LmspProblem`` ``http_3xx`` "redirected to …"), so the token stays with the server
  it was given for. A task id is always one path segment (quoted).
* ``wait`` follows the events to the end (falls back to polling when the server has no
  event stream) and returns the final task object. Once a terminal event was seen, the task object is asked for at most
  ``POLLS_AFTER_END + 1`` times: a server whose task never agrees with its events is
  ``DaemonProtocolError``, not a poll for ever. (Without events it polls as long as
  the task runs: bound that with ``anyio.fail_after``.)
"""

from __future__ import annotations

import contextlib
import os
import uuid
from urllib.parse import urlencode
from collections.abc import AsyncGenerator, Mapping
from types import TracebackType
from typing import Any

import anyio
import httpx
import msgspec

from acp_server.bearer import bearer_token
from acp_server.client.errors import (DaemonConnectionError, DaemonError, DaemonProtocolError,
                                      one_line, redirect_detail, retry_seconds, text_summary)
from acp_server.client.bounded import (
    MAX_ANSWER_BYTES,
    MAX_EVENT_BYTES,
    read_answer,
    read_capped,
)
from acp_server.client.inflate import request_headers
from acp_server.client.sse import END, READ, ResumingStream, Retry
from acp_server.client.wire import path_segment

TOKEN_ENV = "ACP_SERVER_TOKEN"
PREFIX = "/lmsp/v1"
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed",
                             "response.cancelled"})
MIN_STREAM_READ_TIMEOUT_S = 45.0
# How often ``wait`` asks for a task its events said had ended, before it gives up.
POLLS_AFTER_END = 25


# -- wire ----------------------------------------------------------------------------------
class Task(msgspec.Struct, kw_only=True):
    """The task object (LMSP §7.1)."""

    id: str
    status: str
    object: str = "task"
    type: str = "response"
    created_at: int = 0
    updated_at: int = 0
    response_id: str | None = None
    events_url: str | None = None
    on_restart: str = "fail"
    response: dict[str, Any] | None = None
    error: dict[str, Any] | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class TaskSummary(Task, kw_only=True):
    """An item of ``GET /lmsp/v1/tasks`` (acp-server's listing): the task, its model,
    its input's text (a preview) and its final usage (``None`` until it ends)."""

    model: str = ""
    input_text: str = ""
    usage: dict[str, Any] | None = None


class TaskPage(msgspec.Struct, kw_only=True):
    data: list[TaskSummary]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class TaskEvent(msgspec.Struct, kw_only=True):
    """One response event (LMSP §6.3); the members an event type lacks are ``None``."""

    type: str
    sequence_number: int
    response: dict[str, Any] | None = None
    item: dict[str, Any] | None = None
    part: dict[str, Any] | None = None
    item_id: str | None = None
    output_index: int | None = None
    content_index: int | None = None
    delta: str | None = None
    text: str | None = None

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_EVENTS


_TASK = msgspec.json.Decoder(Task)
_EVENT = msgspec.json.Decoder(TaskEvent)
_PAGE = msgspec.json.Decoder(TaskPage)
_ANY = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()


# -- problems ---------------------------------------------------------------------------------
class LmspProblem(DaemonError):
    """An LMSP problem object (RFC 9457). ``code`` is what to switch on."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        self.code: str = str(problem.get("code") or "unknown")
        self.title: str | None = problem.get("title")
        self.detail: str | None = problem.get("detail")
        super().__init__(f"HTTP {status} {self.code}: {self.detail or self.title or ''}".rstrip())

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status, self.problem))


class InvalidRequestError(LmspProblem):
    pass


class UnsupportedCapabilityError(LmspProblem):
    pass


class UnauthorizedError(LmspProblem):
    """401: no credential, or one the server refused (wrong, revoked, expired)."""


class ForbiddenError(LmspProblem):
    """403: the credential lacks ``required_scope`` (or the Origin was refused)."""

    @property
    def required_scope(self) -> str | None:
        return self.problem.get("required_scope")


class RateLimitedError(LmspProblem):
    """429: this credential's rate limit (``tier``); retry after ``retry_after_s``."""

    @property
    def retry_after_s(self) -> float | None:
        return retry_seconds(self.problem.get("retry_after_ms"))


class TaskNotFoundError(LmspProblem):
    pass


class ModelNotFoundError(LmspProblem):
    pass


class TaskNotCancelableError(LmspProblem):
    pass


class IdempotencyKeyInUseError(LmspProblem):
    pass


class IdempotencyKeyReusedError(LmspProblem):
    pass


class EventHistoryExpiredError(LmspProblem):
    """410: the task's events are past retention (``earliest_sequence_number``,
    ``retention_seconds`` from the problem)."""

    @property
    def earliest_sequence_number(self) -> int | None:
        return self.problem.get("earliest_sequence_number")

    @property
    def retention_seconds(self) -> int | None:
        return self.problem.get("retention_seconds")


class PayloadTooLargeError(LmspProblem):
    pass


class TaskQueueFullError(LmspProblem):
    pass


PROBLEM_CLASSES: dict[str, type[LmspProblem]] = {
    "invalid_request": InvalidRequestError,
    "unsupported_capability": UnsupportedCapabilityError,
    "unauthorized": UnauthorizedError,
    "forbidden": ForbiddenError,
    "rate_limit_exceeded": RateLimitedError,
    "task_not_found": TaskNotFoundError,
    "model_not_found": ModelNotFoundError,
    "task_not_cancelable": TaskNotCancelableError,
    "idempotency_key_in_use": IdempotencyKeyInUseError,
    "idempotency_key_reused": IdempotencyKeyReusedError,
    "event_history_expired": EventHistoryExpiredError,
    "payload_too_large": PayloadTooLargeError,
    "prompt_queue_full": TaskQueueFullError,
}


def problem_error(status: int, content: bytes,
                  headers: Mapping[str, str] | None = None) -> LmspProblem:
    """The typed error for a non-2xx answer (a non-problem body gets code ``http_<status>``
    and a one-line detail: a redirect's target, a proxy page's title)."""
    try:
        body = _ANY.decode(content) if content else None
    except (msgspec.DecodeError, RecursionError):
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        headers = headers or {}
        text = content.decode("utf-8", "replace") if content else ""
        detail = text_summary(text, headers.get("content-type")) if text else None
        if 300 <= status < 400:
            detail = redirect_detail(headers)
        body = {"code": f"http_{status}", "detail": detail or None}
    return PROBLEM_CLASSES.get(body["code"], LmspProblem)(status, body)


def _decode(decoder: msgspec.json.Decoder[Any], content: bytes | str) -> Any:
    try:
        return decoder.decode(content)
    except msgspec.DecodeError as exc:
        raise DaemonProtocolError(f"Malformed LMSP answer: {exc}") from exc
    except RecursionError as exc:
        raise DaemonProtocolError("Malformed LMSP answer: JSON nested too deep") from exc


# -- client -----------------------------------------------------------------------------------
class TaskClient:
    """See the module docstring. Owns one ``httpx.AsyncClient``."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout: float | None = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None, max_reconnects: int = 5,
                 reconnect_delay: float = 0.25, max_answer_bytes: int = MAX_ANSWER_BYTES,
                 max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        # first: a token no header can carry is UnsendableTokenError (it is not shown)
        token = bearer_token(token) or bearer_token(os.environ.get(TOKEN_ENV))
        self.base_url = base_url.rstrip("/")
        self.max_answer_bytes = max_answer_bytes
        self.max_event_bytes = max_event_bytes
        headers = request_headers(token)
        self.max_reconnects = max_reconnects
        self.reconnect_delay = reconnect_delay
        self.timeout = timeout
        self._stream_timeout = httpx.Timeout(
            timeout, read=None if timeout is None else max(timeout, MIN_STREAM_READ_TIMEOUT_S))
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout,
                                       transport=transport, follow_redirects=False)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> TaskClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def _call(self, method: str, path: str, *, body: bytes | None = None,
                    headers: Mapping[str, str] | None = None,
                    ok: tuple[int, ...] = (200,)) -> httpx.Response:
        all_headers = dict(headers or {})
        if body is not None:
            all_headers["Content-Type"] = "application/json"
        try:
            response = await read_answer(self._http, method, PREFIX + path, content=body,
                                         headers=all_headers, max_bytes=self.max_answer_bytes,
                                         deadline=self.timeout)
        except httpx.TransportError as exc:
            raise DaemonConnectionError.from_transport(exc, str(self._http.base_url), method,
                                                       PREFIX + path) from exc
        if response.status_code not in ok:
            raise problem_error(response.status_code, response.content, response.headers)
        return response

    async def capabilities(self) -> dict[str, Any]:
        response = await self._call("GET", "/capabilities")
        return _decode(_ANY, response.content)  # type: ignore[no-any-return]

    async def create(self, input: Mapping[str, Any], *, on_restart: str = "fail",
                     idempotency_key: str | None = None) -> Task:
        """Create a task running the response request ``input``."""
        key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
        body = _ENCODER.encode({"type": "response", "input": dict(input),
                                "on_restart": on_restart})
        response = await self._call("POST", "/tasks", body=body,
                                    headers={"Idempotency-Key": key}, ok=(200, 201, 202))
        return _decode(_TASK, response.content)  # type: ignore[no-any-return]

    async def get(self, task_id: str) -> Task:
        response = await self._call("GET", f"/tasks/{path_segment(task_id)}")
        return _decode(_TASK, response.content)  # type: ignore[no-any-return]

    async def list(self, *, limit: int = 20, status: str | None = None,
                   after: str | None = None) -> TaskPage:
        """One page of the caller's tasks, newest first (``after``: the previous page's
        ``last_id``)."""
        query = {"limit": str(limit), **({"status": status} if status else {}),
                 **({"after": after} if after else {})}
        response = await self._call("GET", "/tasks?" + urlencode(query))
        return _decode(_PAGE, response.content)  # type: ignore[no-any-return]

    async def cancel(self, task_id: str) -> Task:
        response = await self._call("POST", f"/tasks/{path_segment(task_id)}/cancel", body=b"{}")
        return _decode(_TASK, response.content)  # type: ignore[no-any-return]

    async def events(self, task_id: str, *, after: int | None = None
                     ) -> AsyncGenerator[TaskEvent, None]:
        """The task's events after ``after``, resumed across drops (module contract)."""
        cursor = after

        def request(attempt: int) -> tuple[dict[str, str], dict[str, str]]:
            return ({"Last-Event-ID": str(cursor)} if cursor is not None else {}), {}

        async def answer(response: httpx.Response, attempt: int) -> str | Retry:
            if response.status_code == 200:
                return READ
            if response.status_code == 204:
                return END
            error = problem_error(response.status_code, await read_capped(response),
                                  response.headers)
            if response.status_code not in (502, 503, 504) or not attempt:
                raise error
            return Retry(str(error))

        stream = ResumingStream(self._http, f"{PREFIX}/tasks/{path_segment(task_id)}/events", answer=answer,
                                request=request, lost=f"Task {task_id} event stream lost",
                                ended="the stream ended before the terminal event",
                                timeout=self._stream_timeout,
                                max_reconnects=self.max_reconnects,
                                reconnect_delay=self.reconnect_delay,
                                max_event_bytes=self.max_event_bytes)
        async with contextlib.aclosing(stream.frames()) as frames:
            async for data in frames:
                event: TaskEvent = _decode(_EVENT, data)
                if cursor is not None and event.sequence_number <= cursor:
                    continue  # never yield an event twice
                cursor = event.sequence_number
                stream.progressed()
                yield event
                if event.terminal:
                    return

    async def wait(self, task_id: str, *, poll_interval: float = 0.5) -> Task:
        """The task once it is terminal (module contract)."""
        ended: TaskEvent | None = None
        try:
            async with contextlib.aclosing(self.events(task_id)) as events:
                async for event in events:
                    if event.terminal:
                        ended = event
                        break
        except LmspProblem as exc:
            if exc.status not in (404, 410):  # no stream (or no history): poll instead
                raise
        polls = 0
        while True:
            task = await self.get(task_id)
            if task.terminal:
                return task
            polls += 1
            if ended is not None and polls > POLLS_AFTER_END:
                raise DaemonProtocolError(
                    f"Task {one_line(task_id, 100)}: its events ended it ({ended.type}) but "
                    f"the task is still {one_line(task.status, 60)!r}")
            await anyio.sleep(poll_interval)
