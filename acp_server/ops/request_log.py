"""Request logs and request metrics: the observer of the one front layer.

    recorder = AccessRecorder(router_of=lambda: app.router, metrics=metrics)
    FrontLayer(app, policy, doors=..., observer=recorder)   # acp_server.http.front
    configure_logging("json")      # the CLI's --log-format text|json

    # text:  2026-12-01 10:02:03,114 INFO acp_server.access: POST /session/{session_id}/prompt
    #        503 0.41ms door=rest session=3c0f…
    # json:  {"ts":"2026-12-01T10:02:03.114Z","level":"INFO","logger":"acp_server.access",
    #         "message":"…","kind":"request","method":"POST","route":"/session/{session_id}/prompt",
    #         "status":503,"duration_ms":0.41,"door":"rest","session_id":"3c0f…"}

Contracts:

* One line per HTTP request (logger ``acp_server.access``, level INFO): method (another
  than HTTP's own cut to ``MAX_METHOD_CHARS``, then "…"), route
  template (``unmatched`` when no route matched; never the raw path or the query),
  status, duration in ms, door (``rest``, ``acp``, ``lmsp``, ``ops``), and the
  ``session_id`` / ``task_id`` of the path when it has one (at most 128 characters,
  then "…"). What the client chose (an id, a method not HTTP's own) goes through
  ``bridge.loggable.loggable`` in both formats: readable text as it is, controls, bidi
  overrides and lone surrogates escaped. Never a header, a token or a body.
* A refused request (4xx, 503) is logged unless its cause's window has had its lines
  (``acp_server.ops.refusals``): then it is counted, and a WARNING summary line says how
  many once the window is over (the writer's thread asks on each write; ``close`` when
  the server stops). The metrics count it either way.
* An event stream (a ``text/event-stream`` answer) logs ``stream_open`` when its
  headers go out and ``stream_close`` (its request line) when it ends, with its
  duration and the number of events sent (SSE frames other than comments and
  ``retry:``; every writer here sends whole frames per write).
* Every request is counted in ``acp_server_http_requests_total`` and timed in
  ``acp_server_http_request_duration_seconds``; open streams are the
  ``acp_server_sse_subscribers`` gauge. A request that raised before answering is
  counted as 500.
* Lines go through the ``acp_server.access`` logger, unless ``configure_logging`` (the
  CLI) installed an ``AccessWriter``: then the request path formats the line itself
  and appends it to a queue that a thread writes out every 50 ms (and at exit), so a
  line costs a few µs and no write on the 503 path. With INFO disabled for
  ``acp_server.access`` (and no writer) the middleware only times and counts.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec
from starlette.routing import Match, Router
from starlette.types import Scope

from acp_server.http.front import count_events
from acp_server.ops.metrics import Metrics
from acp_server.ops.refusals import RefusalLog, Summary, refused
from bridge.loggable import loggable
from bridge.wire import iso as _iso

access_log = logging.getLogger("acp_server.access")
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
UNMATCHED = "unmatched"
_ID_PARAMS = ("session_id", "task_id")
MAX_ID_CHARS = 128
MAX_METHOD_CHARS = 16
HTTP_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS",
                          "CONNECT", "TRACE"))


class AccessRecorder:
    """The request log and the request metrics, as the front layer's observer
    (``acp_server.http.front.Observer``): called on the event loop when a stream
    opens and when an exchange ends; never awaits."""

    def __init__(self, *, router_of: Callable[[], Router], metrics: Metrics | None = None,
                 refusals: RefusalLog | None = None) -> None:
        self.router_of = router_of
        self.metrics = metrics
        self.refusals = refusals if refusals is not None else RefusalLog()
        _open_refusals.add(self.refusals)   # the writer's thread closes their windows

    def close(self) -> None:
        """The server stops: every refusal window's summary is written now."""
        _open_refusals.discard(self.refusals)
        write_summaries(self.refusals.due(final=True))

    def stream_opened(self, door: str, scope: Scope) -> None:
        if self.metrics is not None:
            self.metrics.stream_opened(door)
        if access_writer is not None or access_log.isEnabledFor(logging.INFO):
            self._log(scope, "stream_open", door, 200, None, None)

    def done(self, door: str, scope: Scope, status: int, seconds: float,
             events: int | None) -> None:
        matched = scope.get("route")
        if matched is not None:
            route, params = matched.path, scope.get("path_params") or {}
        else:
            route, params = self.resolve(scope)
        metrics = self.metrics
        if metrics is not None:
            metrics.request_done(door, route, status, seconds)
            if events is not None:
                metrics.stream_closed(door)
        writer = access_writer
        if refused(status) and (writer is not None or access_log.isEnabledFor(logging.INFO)):
            refusals = self.refusals
            admitted = refusals.admit((status, route, door))
            summaries = refusals.due()
            if summaries:
                write_summaries(summaries)
            if not admitted:   # a flood: counted in its window's summary
                return
        if writer is not None and not writer.json and events is None:   # the hot case
            writer.text("request", method_of(scope), route, status, seconds * 1000, door,
                        params.get("session_id"), params.get("task_id"), None)
        elif writer is not None or access_log.isEnabledFor(logging.INFO):
            self._log(scope, "request" if events is None else "stream_close", door, status,
                      seconds, events, route, params)

    def resolve(self, scope: Scope) -> tuple[str, dict[str, Any]]:
        """The route template and path parameters; matched again when the router did
        not run (an answer of the front layer)."""
        route = scope.get("route")
        if route is not None:
            return route.path, scope.get("path_params") or {}
        router = self.router_of()
        candidates = router.candidates(scope["path"]) if hasattr(router, "candidates") \
            else router.routes
        for candidate in candidates:
            match, child = candidate.matches(scope)
            if match is not Match.NONE and hasattr(candidate, "path"):
                return candidate.path, child.get("path_params") or {}
        return UNMATCHED, {}

    def _log(self, scope: Scope, kind: str, door: str, status: int, seconds: float | None,
             events: int | None, route: str | None = None,
             params: dict[str, Any] | None = None) -> None:
        if route is None:
            route, params = self.resolve(scope)
        writer = access_writer
        if writer is not None and not writer.json:   # the hot case: straight to the line
            ids = params or {}
            writer.text(kind, method_of(scope), route, status,
                        None if seconds is None else seconds * 1000, door,
                        ids.get("session_id"), ids.get("task_id"), events)
            return
        fields: dict[str, Any] = {"kind": kind, "method": method_of(scope), "route": route,
                                  "status": status, "door": door}
        if seconds is not None:
            fields["duration_ms"] = round(seconds * 1000, 3)
        for name in _ID_PARAMS:
            value = (params or {}).get(name)
            if value is not None:   # the client chose it: as a text line says it
                fields[name] = loggable(value, MAX_ID_CHARS)
        if kind == "stream_close":
            fields["events"] = events
        if access_writer is not None:
            access_writer.write(fields)
        else:
            access_log.info("%s", _Line(fields), extra={"access": fields})


class _Line:
    """The text form of an access record, built only if a handler formats it."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def __str__(self) -> str:
        f = self.fields
        return text_line(f["kind"], f["method"], f["route"], f["status"], f.get("duration_ms"),
                         f["door"], f.get("session_id"), f.get("task_id"), f.get("events"))


def method_of(scope: Scope) -> str:
    """The request's method as a line says it: HTTP's own as they are; another (the
    client chose it: the HTTP server takes any token, 8 KB long) cut to
    ``MAX_METHOD_CHARS`` then "…", so neither a line nor the line cache grows with it;
    escaped as every client-chosen value is (``loggable``)."""
    method: str = scope["method"]
    if method in HTTP_METHODS:
        return method
    return loggable(method, MAX_METHOD_CHARS)


_SESSION_PARTS: dict[str, str] = {}   # session id -> " session=<loggable id>"
_MAX_SESSION_PARTS = 4096


def _session_part(session_id: str) -> str:
    """`` session=<loggable id>``, kept for the ids seen (bounded: cleared when full),
    ids of ``MAX_ID_CHARS`` at most: a longer one (the client's, a refused request's
    too) is formatted each time, so the memo's bytes are bounded as well."""
    part = _SESSION_PARTS.get(session_id)
    if part is None:
        part = " session=" + loggable(session_id, MAX_ID_CHARS)
        if len(session_id) <= MAX_ID_CHARS:
            if len(_SESSION_PARTS) >= _MAX_SESSION_PARTS:
                _SESSION_PARTS.clear()
            _SESSION_PARTS[session_id] = part
    return part


def text_line(kind: str, method: str, route: str, status: int, duration_ms: float | None,
              door: str, session_id: str | None, task_id: str | None,
              events: int | None) -> str:
    """``[kind ]METHOD ROUTE STATUS[ N.NNms] door=D[ session=S][ task=T][ events=E]``."""
    key = (kind, method, route, status, door)
    parts = _line_parts.get(key)
    if parts is None:
        parts = _parts(*key)
    if duration_ms is None:
        text = parts[2]
    else:
        text = f"{parts[0]}{duration_ms:.2f}{parts[1]}"
    if session_id is not None:
        text += _session_part(session_id)
    if task_id is not None:
        text += " task=" + loggable(task_id, MAX_ID_CHARS)
    if kind == "stream_close":
        text += f" events={events}"
    return text


_line_parts: dict[tuple[str, str, str, int, str], tuple[str, str, str]] = {}
_MAX_LINE_PARTS = 4096


def _parts(kind: str, method: str, route: str, status: int, door: str) -> tuple[str, str, str]:
    """The fixed text around a line's duration, built once per (kind, method, route,
    status, door); route is a template or ``unmatched``, so the keys are few (bounded
    anyway: the cache is cleared when full)."""
    head = f"{method} {route} {status}" if kind == "request" else \
        f"{kind} {method} {route} {status}"
    if len(_line_parts) >= _MAX_LINE_PARTS:
        _line_parts.clear()
    parts = _line_parts[(kind, method, route, status, door)] = (
        head + " ", "ms door=" + door, head + " door=" + door)
    return parts


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, and an access record's
    fields."""

    _encode = msgspec.json.Encoder().encode

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _iso(record.created), "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        access = getattr(record, "access", None)
        if access is not None:
            out.update(access)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return self._encode(out).decode()


class AccessWriter:
    """Access lines formatted as the handler would, queued, written by a thread."""

    FLUSH_S = 0.05
    MAX_QUEUED = 32768   # lines; past it (the stream stuck) lines are counted, not kept

    def __init__(self, stream: Any, log_format: str) -> None:
        self.stream = stream
        self.json = log_format == "json"
        self.queue: deque[str] = deque()
        self.dropped = 0   # lines not kept since the last write (event loop adds)
        self._ms = -1
        self._prefix = ""
        # (second, its text): one attribute, as the loop (a line's prefix) and the
        # writer's thread (a summary, a "dropped" line) both format times
        self._stamped: tuple[int, str] = (-1, "")
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="access-log", daemon=True)
        self._thread.start()

    def write(self, fields: dict[str, Any]) -> None:
        if len(self.queue) >= self.MAX_QUEUED:
            self.dropped += 1
            return
        now = time.time()
        if self.json:
            line = JsonFormatter._encode({"ts": _iso(now), "level": "INFO",
                                          "logger": access_log.name,
                                          "message": str(_Line(fields)), **fields}).decode()
        else:
            line = self.prefix() + str(_Line(fields))
        self.queue.append(line)

    def text(self, kind: str, method: str, route: str, status: int,
             duration_ms: float | None, door: str, session_id: str | None,
             task_id: str | None, events: int | None) -> None:
        """Queue a text line (``text_line``'s arguments) with its prefix: the request
        path's one call for its line (on the event loop)."""
        queue = self.queue
        if len(queue) >= self.MAX_QUEUED:
            self.dropped += 1
            return
        now = time.time()
        prefix = self._prefix if int(now * 1000) == self._ms else self.prefix(now)
        if session_id is not None and task_id is None and kind == "request" \
                and duration_ms is not None:   # the common line, without text_line's call
            parts = _line_parts.get((kind, method, route, status, door))
            if parts is not None:
                part = _SESSION_PARTS.get(session_id)
                if part is None:
                    part = _session_part(session_id)
                queue.append(f"{prefix}{parts[0]}{duration_ms:.2f}{parts[1]}{part}")
                return
        queue.append(prefix + text_line(kind, method, route, status, duration_ms, door,
                                        session_id, task_id, events))

    def prefix(self, now: float | None = None) -> str:
        """``<asctime> INFO acp_server.access: `` as ``TEXT_FORMAT`` writes it (built
        once per millisecond)."""
        if now is None:
            now = time.time()
        ms = int(now * 1000)
        if ms != self._ms:
            self._ms, self._prefix = ms, f"{self._asctime(now)} INFO acp_server.access: "
        return self._prefix

    def _asctime(self, now: float) -> str:
        second = int(now)
        stamped = self._stamped   # read once: another thread may replace it
        if stamped[0] != second:   # logging.Formatter's default asctime, local time
            stamped = self._stamped = (second, time.strftime("%Y-%m-%d %H:%M:%S",
                                                             time.localtime(second)))
        return f"{stamped[1]},{int((now - second) * 1000):03d}"

    def flush(self) -> None:
        for refusals in _open_refusals.alive():   # refusal windows over by now
            for summary in refusals.due():
                self.summary(summary)
        with self._lock:
            lines = []
            dropped, self.dropped = self.dropped, 0   # a count lost to a race is one line
            if dropped:
                lines.append(self._dropped_line(dropped))
            while self.queue:
                lines.append(self.queue.popleft())
            if lines:
                try:
                    self.stream.write("\n".join(lines) + "\n")
                    self.stream.flush()
                except (OSError, ValueError):   # the stream is gone (exit)
                    pass

    def summary(self, summary: Summary) -> None:
        """A refusal window's summary line (WARNING), queued as any line."""
        self.queue.append(self._warning(summary.message(), summary.fields()))

    def _dropped_line(self, count: int) -> str:
        return self._warning(f"{count} access lines dropped: the log stream did not keep up",
                             {"kind": "dropped", "dropped": count})

    def _warning(self, message: str, fields: dict[str, object]) -> str:
        """A WARNING line of the access logger, as the handler would format it."""
        now = time.time()
        if self.json:
            return JsonFormatter._encode({"ts": _iso(now), "level": "WARNING",
                                          "logger": access_log.name, "message": message,
                                          **fields}).decode()
        return f"{self._asctime(now)} WARNING {access_log.name}: {message}"

    def _run(self) -> None:
        while not self._stop.wait(self.FLUSH_S):
            try:
                self.flush()
            except Exception:   # noqa: BLE001 - a bug here must not end the access log
                logging.getLogger("acp_server").exception(
                    "access log: a flush failed; the writer goes on")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.flush()


access_writer: AccessWriter | None = None


class _Registry:
    """The refusal logs of the recorders alive, which the writer's thread asks: added
    and removed on the event loop (or any thread), read on the writer's, under one lock
    (a ``WeakSet`` changed while the writer's thread copied it raised there, and the
    thread ended: no access line was written again)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refs: dict[int, weakref.ref[RefusalLog]] = {}

    def add(self, refusals: RefusalLog) -> None:
        with self._lock:
            self._refs[id(refusals)] = weakref.ref(refusals)

    def discard(self, refusals: RefusalLog) -> None:
        with self._lock:
            ref = self._refs.get(id(refusals))
            if ref is not None and ref() is refusals:
                del self._refs[id(refusals)]

    def alive(self) -> list[RefusalLog]:
        with self._lock:   # a copy under the lock, each one looked at without it
            refs = list(self._refs.values())
        out = [refusals for ref in refs if (refusals := ref()) is not None]
        if len(out) < len(refs):   # a recorder gone without close (a test's)
            with self._lock:
                for key, ref in list(self._refs.items()):
                    if ref() is None:
                        del self._refs[key]
        return out


_open_refusals = _Registry()


def write_summaries(summaries: list[Summary]) -> None:
    """Refusal windows' summaries: through the writer, else the logger (WARNING)."""
    for summary in summaries:
        if access_writer is not None:
            access_writer.summary(summary)
        else:
            access_log.warning("%s", summary.message(), extra={"access": summary.fields()})


def configure_logging(log_format: str = "text", *, stream: Any = None) -> None:
    """The process's logging: INFO to stderr, as text or JSON lines; access lines
    through an ``AccessWriter`` on the same stream."""
    global access_writer
    if log_format not in LOG_FORMATS:
        raise ValueError(f"Invalid log format: {log_format!r}. Must be text or json.")
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if log_format == "json"
                         else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    if access_writer is not None:
        access_writer.close()
    access_writer = AccessWriter(stream, log_format)
    atexit.register(access_writer.close)


def unconfigure_access_writer() -> None:
    """Back to the ``acp_server.access`` logger (tests, embedding)."""
    global access_writer
    if access_writer is not None:
        access_writer.close()
        access_writer = None
