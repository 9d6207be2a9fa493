"""What a scenario works with: the target, the options, results and bounded waits.

    async with Context.open(url, options, on_result=print) as ctx:
        response = await ctx.request("POST", "/session", json={"sessionScope": "thread"})
        async with ctx.stream("GET", f"/session/{sid}/events",
                              headers={"Last-Event-ID": "0"}) as events:
            frame = await events.wait_for(lambda f: f.event == "turn_complete")
        ctx.passed("backpressure.release.completed")

Contracts: what is read of the server is capped (``MAX_ANSWER_BYTES``, ``MAX_EVENT_BYTES``,
through ``acp_server.client.bounded``; a compressed answer inflated within the cap) and
a JSON body nested too deep to decode is a failed check, never the runner's crash. Every
wait is bounded: a request by ``options.timeout_s`` (httpx timeout), a
frame by ``options.timeout_s`` unless the caller names a longer bound (the settle
bound, ``options.settle_timeout_s``, for prompts that end by themselves). A check gets
exactly one result; the first one recorded wins. ``describe`` renders what was sent
and what was seen, for failure details.

No check expects a 429: a 429 answer (a request, a stream, a WebSocket upgrade) that
names the rate limit (``rate_limit_exceeded``) or no code at all (a proxy's), and a
JSON-RPC error whose ``data.errorKind`` is ``rate_limit_exceeded``, is the target
rate-limiting the runner, never a check's failure (``is_rate_limit``): ``RateLimited``
(a ``RunStopped``) is raised, ``checking`` lets it through (out of task groups too) and
the run stops. A 429 naming another code is the server's answer, judged as any other.
Clean-ups a rate limit refuses are tried again after its ``Retry-After``, within their
bound.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.abc
import httpx

from acp_server.client.bounded import events, read_answer, read_capped, with_body
from acp_server.client.errors import DaemonProtocolError, redact
from acp_server.client.inflate import request_headers
from acp_server.conformance.catalog import CHECKS

Outcome = Literal["pass", "fail", "skip"]
DETAIL_CHARS = 600
# Sent with every session the runner creates (POST /session, /acp session/new): a
# server that knows the label (acp-server) lists them as the runner's; others ignore it.
ORIGIN_META = {"acp-server/origin": "conformance"}


@dataclass(frozen=True)
class Options:
    token: str | None = None
    hold_prompt: str | None = None     # stays pending >= 5 s; None: the reference default
    fail_prompt: str | None = None     # ends in turn_error; None: the reference default
    quick_prompt: str = "Say hello."
    model: str | None = None           # LMSP model; None: the first one advertised
    timeout_s: float = 10.0            # one request, one awaited frame
    settle_timeout_s: float = 60.0     # a prompt or task ending by itself
    poll_interval_s: float = 0.05      # LMSP status polling
    max_fill: int = 32                 # largest queue limit the runner fills
    saturate_tasks: int = 8            # tasks created to observe a queued one
    oversize_bytes: int = 17 * 1024 * 1024


@dataclass
class Result:
    id: str
    outcome: Outcome
    detail: str = ""

    @property
    def suite(self) -> str:
        return CHECKS[self.id].suite

    @property
    def level(self) -> str:
        return CHECKS[self.id].level


class RunStopped(Exception):
    """The run cannot start or go on; its message is one line (exit status 2)."""


class RateLimited(RunStopped):
    """The target rate-limited the runner (a 429): no check is blamed, the run stops."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


UNLIMITED_HINT = ("a run sends more requests than a rate-limited token may, so it stops "
                  "rather than fail checks for it: use a token without rate limits "
                  "(acp-server token create NAME --unlimited) or a server without them")


def _error_data(body: Any) -> dict[str, Any]:
    """Where an error body keeps its code: the body (REST, an LMSP problem) or a
    JSON-RPC error's ``data``."""
    if not isinstance(body, dict):
        return {}
    error = body.get("error")
    data = error.get("data") if isinstance(error, dict) else None
    return data if isinstance(data, dict) else body


def error_code(body: Any) -> str | None:
    """An error body's code (``code``, or JSON-RPC ``data.errorKind``), if it names one."""
    data = _error_data(body)
    code = data.get("errorKind") or data.get("code")
    return code if isinstance(code, str) else None


def rate_limit_of(body: Any) -> dict[str, Any] | None:
    """What a rate-limit refusal's body says (``code``, ``tier``, retry ms) as one dict,
    in any door's shape (REST, LMSP problem, JSON-RPC ``error.data``); else None."""
    if error_code(body) != "rate_limit_exceeded":
        return None
    data = _error_data(body)
    retry_ms = data.get("retryAfterMs", data.get("retry_after_ms"))
    return {"code": "rate_limit_exceeded", "tier": data.get("tier"),
            "retry_ms": retry_ms if isinstance(retry_ms, int | float) else None}


def is_rate_limit(response: httpx.Response) -> bool:
    """A 429 naming the rate limit (``rate_limit_exceeded``) or no code at all (a
    proxy's page, a WebSocket upgrade's refusal); a 429 naming another code (acp-server's
    ``subscriber_limit_exceeded``) is the server's answer, judged as any other."""
    if response.status_code != 429:
        return False
    try:
        code = error_code(json_of(response))
    except httpx.ResponseNotRead:
        return True
    return code in (None, "rate_limit_exceeded")


def _found(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first ``kind`` in ``exc`` or the (nested) exception groups it is."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _found(inner, kind)
            if found is not None:
                return found
    return None


def stopped(exc: BaseException) -> RunStopped | None:
    """The ``RunStopped`` in ``exc`` (itself, or within task groups' exception groups)."""
    found = _found(exc, RunStopped)
    return found if isinstance(found, RunStopped) else None


class CheckFailed(Exception):
    """Raised inside ``ctx.checking(id)`` to fail that check with a detail."""


class Skip(Exception):
    """Raised inside ``ctx.checking(id)`` to skip that check with a reason."""


def clip(value: str, limit: int = DETAIL_CHARS) -> str:
    return value if len(value) <= limit else value[:limit] + f"… ({len(value)} chars)"


def describe(response: httpx.Response, *, headers: tuple[str, ...] = ()) -> str:
    """``sent POST /x {body}; saw 503 {headers} {body}``, clipped."""
    request = response.request
    target = request.url.path + (f"?{request.url.query.decode()}" if request.url.query else "")
    sent = clip(request.content.decode(errors="replace"), 200) if request.content else ""
    shown = {name: response.headers[name] for name in headers if name in response.headers}
    try:
        body = response.text
    except httpx.ResponseNotRead:
        body = "(body not read)"
    return clip(f"sent {request.method} {target}{' ' + sent if sent else ''}; "
                f"saw {response.status_code}{' ' + json.dumps(shown) if shown else ''} "
                f"{clip(body, 300)}")


def _value(text: str) -> Any:
    """An SSE frame's data: its JSON value, else the text itself."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):   # not JSON, or nested too deep to decode
        return text


def json_of(response: httpx.Response) -> dict[str, Any]:
    """The body as a JSON object, or ``{}`` (not JSON, not an object)."""
    try:
        body = response.json()
    except (ValueError, RecursionError):
        return {}
    return body if isinstance(body, dict) else {}


@dataclass
class Frame:
    """One SSE frame; ``seq`` orders frames across every stream of one context."""

    event: str
    id: str | None
    data: Any
    seq: int


@dataclass
class Stream:
    """An open SSE stream read in the background."""

    response: httpx.Response
    frames: list[Frame] = field(default_factory=list)
    ended: bool = False
    timeout_s: float = 10.0
    problem: str | None = None    # why the stream was cut (a line or an event too long)
    _changed: anyio.Event = field(default_factory=anyio.Event)

    def _add(self, frame: Frame) -> None:
        self.frames.append(frame)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, match: Callable[[Frame], bool],
                       timeout: float | None = None) -> Frame:
        """The first frame (seen or to come) matching; TimeoutError past the bound."""
        seen = 0
        with anyio.fail_after(timeout or self.timeout_s):
            while True:
                for frame in self.frames[seen:]:
                    if match(frame):
                        return frame
                seen = len(self.frames)
                if self.ended:
                    why = f" ({self.problem})" if self.problem else ""
                    raise CheckFailed(f"the stream ended before the frame awaited{why}; "
                                      f"frames: {clip(str([f.data for f in self.frames]))}")
                await self._changed.wait()

    async def wait_for_end(self, timeout: float | None = None) -> None:
        with anyio.fail_after(timeout or self.timeout_s):
            while not self.ended:
                await self._changed.wait()

    def rpc_reply(self, rpc_id: Any) -> Callable[[Frame], bool]:
        return lambda f: isinstance(f.data, dict) and f.data.get("id") == rpc_id \
            and "method" not in f.data


_EXPECTED = (httpx.HTTPError, ValueError, KeyError, TypeError, IndexError, AttributeError,
             DaemonProtocolError)
# What the runner reads of the server under test: an answer, one SSE line or event.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
MAX_EVENT_BYTES = 16 * 1024 * 1024


def _leaf(exc: BaseException) -> BaseException:
    """The first non-group exception of a (nested) exception group, else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


class Context:
    def __init__(self, client: httpx.AsyncClient, options: Options,
                 on_result: Callable[[Result], None] | None = None) -> None:
        self.client = client
        self.options = options
        self.results: dict[str, Result] = {}
        self.capabilities: dict[str, Any] | None = None
        self.lmsp_capabilities: dict[str, Any] | None = None
        self.probes: dict[str, str] = {}   # discovery: path -> what it answered
        self._on_result = on_result
        self._seq = itertools.count()
        self._cleanups: list[Callable[[], Awaitable[Any]]] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, url: str, options: Options,
                   on_result: Callable[[Result], None] | None = None,
                   transport: httpx.AsyncBaseTransport | None = None,
                   ) -> AsyncIterator[Context]:
        headers = request_headers(options.token)
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=20)
        async with httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers,
                                     timeout=options.timeout_s, limits=limits,
                                     transport=transport) as client:
            yield cls(client, options, on_result)

    @property
    def base_url(self) -> str:
        return str(self.client.base_url).rstrip("/")

    @property
    def reference_agent(self) -> bool:
        """The target serves our reference agent by default (acp-server's envelope)."""
        agents = (self.capabilities or {}).get("agents")
        return isinstance(agents, dict) and agents.get("default") == "reference"

    @property
    def hold_prompt(self) -> str | None:
        if self.options.hold_prompt is not None:
            return self.options.hold_prompt
        return "/sleep 5s conformance hold" if self.reference_agent else None

    @property
    def fail_prompt(self) -> str | None:
        if self.options.fail_prompt is not None:
            return self.options.fail_prompt
        return "/fail conformance" if self.reference_agent else None

    # results

    def record(self, check_id: str, outcome: Outcome, detail: str = "") -> None:
        if check_id not in CHECKS:
            raise KeyError(check_id)
        if check_id in self.results:
            return
        result = Result(check_id, outcome, clip(redact(detail), 2 * DETAIL_CHARS))
        self.results[check_id] = result
        if self._on_result is not None:
            self._on_result(result)

    def passed(self, check_id: str, detail: str = "") -> None:
        self.record(check_id, "pass", detail)

    def failed(self, check_id: str, detail: str) -> None:
        self.record(check_id, "fail", detail)

    def skipped(self, check_id: str, reason: str) -> None:
        self.record(check_id, "skip", reason)

    def expect(self, check_id: str, ok: bool, detail: str) -> bool:
        if ok:
            self.passed(check_id)
        else:
            self.failed(check_id, detail)
        return ok

    @contextlib.asynccontextmanager
    async def checking(self, *check_ids: str) -> AsyncIterator[None]:
        """Failures inside (``CheckFailed``, a timeout, an HTTP error, a bad body) fail
        the named checks that have no result yet; ``Skip`` skips them. Exceptions that
        reach here through task groups (open streams) are unwrapped."""
        try:
            yield
        except BaseException as raised:
            stop = stopped(raised)
            if stop is not None and stop is not raised:
                raise stop from None   # out of the task groups: the run stops
            exc = _leaf(raised)
            if isinstance(exc, Skip):
                outcome, detail = "skip", str(exc)
            elif isinstance(exc, CheckFailed):
                outcome, detail = "fail", str(exc)
            elif isinstance(exc, TimeoutError):
                outcome, detail = "fail", "timed out waiting (see --timeout / --settle-timeout)"
            elif isinstance(exc, RecursionError):   # json / msgspec on a too deep nesting
                outcome, detail = "fail", "the server's JSON is nested too deep to decode"
            elif isinstance(exc, _EXPECTED):
                outcome, detail = "fail", f"{type(exc).__name__}: {exc}"
            else:
                raise
            for check_id in check_ids:
                self.record(check_id, outcome, detail)  # type: ignore[arg-type]

    # HTTP

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The answer, its body read whole but never past ``MAX_ANSWER_BYTES`` (a server
        that sends more fails the check: ``DaemonProtocolError``)."""
        response = await read_answer(self.client, method, path, max_bytes=MAX_ANSWER_BYTES,
                                     **kwargs)
        if is_rate_limit(response):
            raise self.rate_limited(response)
        return response

    def rate_limited(self, response: httpx.Response | None = None, *, where: str = "",
                     body: Any = None) -> RateLimited:
        """The run's stop for a rate limit: a 429 ``response``, or a JSON-RPC error
        ``body`` met ``where`` (e.g. on the WebSocket)."""
        retry_after_s: float | None = None
        if response is not None:
            where = f"{response.request.method} {response.request.url.path}"
            try:
                body = json_of(response)
            except httpx.ResponseNotRead:   # a WebSocket upgrade's refusal
                body = {}
            header = response.headers.get("retry-after", "")
            retry_after_s = float(header) if header.isdigit() else None
        said = rate_limit_of(body) or {}
        if retry_after_s is None and said.get("retry_ms") is not None:
            retry_after_s = said["retry_ms"] / 1000
        facts = ", ".join(part for part in (
            f"429 {said.get('code') or 'Too Many Requests'}" if response is not None
            else str(said.get("code") or "rate_limit_exceeded"),
            f"tier {said['tier']}" if said.get("tier") else "",
            f"Retry-After {retry_after_s:g} s" if retry_after_s is not None else "") if part)
        return RateLimited(f"{redact(self.base_url)} rate-limited the runner ({facts}) at "
                           f"{where}: {UNLIMITED_HINT}", retry_after_s)

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, *, headers: dict[str, str] | None = None,
                     params: dict[str, str] | None = None, expect: int | None = 200,
                     ) -> AsyncIterator[Stream]:
        """An SSE stream read in the background; a status other than ``expect`` fails
        with the response described (``expect=None`` yields any answer)."""
        sent = {"Accept": "text/event-stream", **(headers or {})}
        timeout = httpx.Timeout(self.options.timeout_s, read=None)
        request = self.client.build_request(method, path, headers=sent, params=params,
                                            timeout=timeout)
        with anyio.fail_after(self.options.timeout_s):   # the answer's head is bounded
            response = await self.client.send(request, stream=True)
        try:
            # Any other answer than a stream: its body, read within the cap, once.
            answer = None if response.status_code == 200 else \
                with_body(response, await read_capped(response))
            if answer is not None and is_rate_limit(answer):
                raise self.rate_limited(answer)
            stream = Stream(response if answer is None else answer,
                            timeout_s=self.options.timeout_s)
            if expect is not None and response.status_code != expect:
                raise CheckFailed(f"stream not opened: {describe(stream.response)}")
            async with anyio.create_task_group() as tg:
                if answer is None:
                    tg.start_soon(self._read, stream)
                else:
                    stream.ended = True
                try:
                    yield stream
                finally:
                    tg.cancel_scope.cancel()
        finally:
            await response.aclose()

    async def _read(self, stream: Stream) -> None:
        """The stream's frames, each line and each event's data bounded by
        ``MAX_EVENT_BYTES``: past it the stream ends, and ``problem`` says why (a check
        waiting on it fails naming that)."""
        try:
            async for event, event_id, data in events(stream.response,
                                                      max_bytes=MAX_EVENT_BYTES):
                stream._add(Frame(event, event_id, _value(data), next(self._seq)))
        except DaemonProtocolError as exc:
            stream.problem = str(exc)
        except (httpx.HTTPError, anyio.ClosedResourceError, anyio.EndOfStream):
            pass
        finally:
            stream.ended = True
            stream._wake()

    # clean-up

    def later(self, cleanup: Callable[[], Awaitable[Any]]) -> None:
        """Run ``cleanup`` when the scenario ends (shielded, bounded, errors ignored)."""
        self._cleanups.append(cleanup)

    async def run_cleanups(self) -> None:
        cleanups, self._cleanups = self._cleanups[::-1], []
        with anyio.CancelScope(shield=True):
            for cleanup in cleanups:
                with anyio.move_on_after(self.options.timeout_s), \
                        contextlib.suppress(Exception):
                    await self._clean(cleanup)

    @staticmethod
    async def _clean(cleanup: Callable[[], Awaitable[Any]]) -> None:
        """``cleanup``, tried again after a rate limit's ``Retry-After`` (the caller
        bounds the whole)."""
        while True:
            try:
                await cleanup()
                return
            except RateLimited as exc:
                await anyio.sleep(exc.retry_after_s or 1.0)
