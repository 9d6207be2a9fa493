"""Prometheus metrics: every series of ``GET /metrics``, on one registry per app.

    metrics = Metrics(bridge, acp_registry)  # its own CollectorRegistry
    bridge.observe(metrics)                  # admissions, turns, evictions, restarts
    metrics.watch_lmsp(service)              # LMSP transitions; the task gauge reads its store
    body = await metrics.render()            # the text exposition (prometheus_client)
    app = Starlette(routes=routes(metrics))   # GET /metrics

Contracts:

* Series names are fixed (dashboards rely on them; README lists them). Counters get
  ``_total`` from ``prometheus_client``; the process and platform collectors are on.
* Pushed series use children bound once. The admissions, paid by every
  ``send_prompt`` (its refusal path included), are two integers that the bridge's
  hooks add to on the event loop, exposed at scrape time (no lock, no child). The
  request metrics, paid by every request, are as cheap: a record
  per (door, route, status) bound on first use, two integer additions and a
  ``bisect`` on the event loop, exposed at scrape time as a counter and a histogram
  family (``prometheus_client.core``).
* Live quantities are read when scraped, never pushed: sessions and prompts from
  ``Bridge.stats()``, ``/acp`` connections from the server's registry, LMSP tasks from
  the store. The task counts (one ``GROUP BY status`` over the ``tasks_status``
  index) are cached for ``task_ttl_s`` (5 s), fetched by at most one scrape at a
  time, so with PostgreSQL and several instances a scrape of every instance costs
  the shared store one query per instance per 5 s at most. A scrape waits for them at
  most ``SCRAPE_WAIT_S``, then serves the last counts (the query goes on in the
  store's task group: ``acp_server.store.bounded``), so a store that hangs or is down
  never holds ``/metrics``.
* ``route`` labels are route templates (``/session/{session_id}/prompt``) or
  ``unmatched``, never a raw path. ``stop_reason`` labels are ACP's stop reasons,
  ``error`` (a failed turn) or ``other`` (whatever else an agent answered): no label
  takes a value a client or an agent makes up, so the series stay bounded.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import Any, get_args

import anyio
from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from acp_server.acp_http import ConnectionRegistry
from acp_server.http.endpoints import route as bound_route
from acp_server.lmsp.wire import TaskStatus
from acp_server.store.errors import StoreUnavailableError
from acp_server.store.session_refusals import KINDS
from bridge import Bridge, BridgeStats
from bridge.abandoning import AGENT_STOPPED, SESSION_DETACHED
from bridge.observer import BridgeObserver

DOORS = ("rest", "acp", "lmsp")   # the doors with event streams
TRANSPORTS = ("http", "websocket")
TASK_STATUSES: tuple[str, ...] = get_args(TaskStatus)
DEFAULT_TASK_TTL_S = 5.0
SCRAPE_WAIT_S = 1.0   # a scrape waits this long for the task counts, then serves the last
HTTP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                5.0, 10.0)
_HTTP_BUCKET_NAMES = (*map(str, HTTP_BUCKETS), "+Inf")
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)
REFUSED_KINDS = tuple(KINDS.values())   # the journal's record kinds
# ACP's stopReason values and the bridge's "error"; any other word an agent says is "other".
STOP_REASONS = frozenset(("end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled",
                          "error"))
ABANDON_ACTIONS = (AGENT_STOPPED, SESSION_DETACHED)   # agent_abandoned's actions
TURN_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)


class _TaskCounts:
    """The LMSP store's tasks by status, cached for ``ttl_s``; one fetch at a time."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.store: Any = None
        self.counts: dict[str, int] | None = None
        self.fetched_at = -float("inf")
        self.fetches = 0
        self._lock: anyio.Lock | None = None

    async def refresh(self) -> None:
        if self.store is None or time.monotonic() - self.fetched_at < self.ttl_s:
            return
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            if time.monotonic() - self.fetched_at < self.ttl_s:
                return   # another scrape fetched them meanwhile
            bounded = getattr(self.store, "bounded", None)   # acp_server.store.bounded
            try:
                self.counts = await (self.store.status_counts() if bounded is None else
                                     bounded.ask("status_counts", self.store.status_counts,
                                                 SCRAPE_WAIT_S))
            except (StoreUnavailableError, TimeoutError):
                return   # the last counts stand; /health?deep=1 says the store is down
            self.fetched_at = time.monotonic()
            self.fetches += 1


class _LiveCollector(Collector):
    """Gauges read at scrape time."""

    def __init__(self, bridge: Bridge, acp: ConnectionRegistry | None,
                 tasks: _TaskCounts) -> None:
        self.bridge = bridge
        self.acp = acp
        self.tasks = tasks

    def describe(self) -> Iterator[Metric]:
        return self._families(None, {}, None)

    def collect(self) -> Iterator[Metric]:
        stats = self.bridge.stats()
        connections = dict.fromkeys(TRANSPORTS, 0)
        if self.acp is not None:
            for conn in self.acp.connections.values():
                connections["websocket" if conn.websocket else "http"] += 1
        return self._families(stats, connections, self.tasks.counts)

    @staticmethod
    def _families(stats: BridgeStats | None, connections: dict[str, int],
                  tasks: dict[str, int] | None) -> Iterator[Metric]:
        for name, key, doc in (
                ("acp_server_sessions", "sessions", "Live sessions."),
                ("acp_server_prompts_pending", "pending_prompts",
                 "Queued plus running prompts, all sessions."),
                ("acp_server_prompts_queued", "queued_prompts", "Prompts waiting for their turn."),
                ("acp_server_prompts_running", "active_prompts", "Prompts whose turn is running.")):
            yield GaugeMetricFamily(name, doc, value=getattr(stats, key, 0))
        acp = GaugeMetricFamily("acp_server_acp_connections", "Live /acp connections.",
                                labels=["transport"])
        for transport, count in connections.items():
            acp.add_metric([transport], count)
        yield acp
        family = GaugeMetricFamily("acp_server_lmsp_tasks",
                                   "LMSP tasks in the store by status (cached a few seconds).",
                                   labels=["status"])
        if tasks is not None:
            for status in TASK_STATUSES:
                family.add_metric([status], tasks.get(status, 0))
        yield family


class _StoreCollector(Collector):
    """The store writer's commits, read at scrape time."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("acp_server_store_commits",
                                     "Store transactions committed, by whether they were "
                                     "flushed to the disk before their callers woke.",
                                     labels=["synced"])
        synced = int(getattr(self.store, "synced_commits", 0))
        family.add_metric(["true"], synced)
        family.add_metric(["false"], int(getattr(self.store, "commits", 0)) - synced)
        yield family


class _JournalCollector(Collector):
    """``acp_server_journal_records_refused_total{kind}``: the session journal's records
    the store refused for good (``acp_server.store.session_refusals``), read when
    scraped; absent with a journal that does not refuse (in memory)."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge

    def collect(self) -> Iterator[Metric]:
        refusals = getattr(self.bridge.journal, "refusals", None)
        if refusals is None:
            return
        family = CounterMetricFamily("acp_server_journal_records_refused",
                                     "Session journal records the store refused for good "
                                     "(not retried), by kind.", labels=["kind"])
        for kind in REFUSED_KINDS:
            family.add_metric([kind], refusals.by_kind.get(kind, 0))
        yield family


class _FleetCollector(Collector):
    """Sessions across instances (``acp_server.fleet``), read at scrape time."""

    def __init__(self, fleet: Any) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        report = self.fleet.report()
        info = GaugeMetricFamily("acp_server_instance_info",
                                 "This instance's id on the shared store.", labels=["instance"])
        info.add_metric([report["instance"]], 1)
        yield info
        yield GaugeMetricFamily("acp_server_sessions_owned",
                                "Sessions whose lease this instance holds.",
                                value=report["sessionsOwned"])
        for name, key, doc in (
                ("acp_server_session_adoptions", "leasesTakenOver",
                 "Sessions this instance took over after their owner's lease expired."),
                ("acp_server_sessions_moved_away", "sessionsMovedAway",
                 "Sessions another instance took over from this one."),
                ("acp_server_session_forwards", "forwards",
                 "Requests forwarded to the instance that runs their session."),
                ("acp_server_session_forward_failures", "forwardFailures",
                 "Forwards whose owner could not be reached (503)."),
                ("acp_server_session_forwards_rerouted", "forwardsRerouted",
                 "Forwards that reached an owner who had just let the session go, "
                 "routed anew."),
                ("acp_server_session_journal_reads", "journalReads",
                 "Reads of sessions live on another instance served from the journal."),
                ("acp_server_session_handoffs_given", "handOffsGiven",
                 "Idle sessions this instance let go to another that asked for them."),
                ("acp_server_session_handoffs_taken", "handOffsTaken",
                 "Idle sessions another instance let go to this one."),
                ("acp_server_session_handoffs_refused", "handOffsRefused",
                 "Sessions asked for and not let go in time (busy elsewhere).")):
            yield CounterMetricFamily(name, doc, value=report[key])


class _Timing:
    """One histogram series as plain numbers on the event loop: observations per bucket
    of ``bounds`` (the last is +Inf; an observation lands in the first bucket whose
    bound is not below it, as ``prometheus_client.Histogram`` puts it) and their sum.
    Also one (door, route) of the HTTP requests, ``HTTP_BUCKETS``."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = HTTP_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount

    def buckets(self, names: Iterable[str]) -> list[tuple[str, float]]:
        """The cumulative counts, each under its bound's name in ``names``."""
        total, buckets = 0, []
        for name, count in zip(names, self.counts):
            total += count
            buckets.append((name, total))
        return buckets


class _Series(_Timing):
    """A ``_Timing`` with when it was made, exposed as ``prometheus_client.Histogram``
    exposes a series (``_created`` included), without its lock and value objects."""

    __slots__ = ("created",)

    def __init__(self, bounds: tuple[float, ...]) -> None:
        super().__init__(bounds)
        self.created = time.time()

    def add_to(self, family: HistogramMetricFamily, labels: dict[str, str]) -> None:
        """This series in ``family``, under ``labels`` (the family's label names, in
        its order, to their values)."""
        names = (*map(floatToGoString, self.bounds), "+Inf")
        family.add_metric(list(labels.values()), self.buckets(names), self.sum)
        # as a Histogram's child exposes it (the module's switch: no public getter)
        if prometheus_metrics._use_created:
            family.samples.append(Sample(family.name + "_created", labels, self.created))


class _TurnCollector(Collector):
    """``acp_server_prompt_queue_wait_seconds`` and ``acp_server_turn_duration_seconds``
    {stop_reason}: two observations per turn, plain numbers on the event loop (was two
    ``Histogram.observe``, a lock and a loop over the buckets each), exposed when scraped
    with the same samples (a stop reason's series from its first turn on)."""

    def __init__(self) -> None:
        self.wait = _Series(WAIT_BUCKETS)
        self.turns: dict[str, _Series] = {}

    def describe(self) -> Iterator[Metric]:
        return self._families(None, {})

    def collect(self) -> Iterator[Metric]:
        return self._families(self.wait, dict(self.turns))

    @staticmethod
    def _families(wait: _Series | None, turns: dict[str, _Series]) -> Iterator[Metric]:
        family = HistogramMetricFamily("acp_server_prompt_queue_wait_seconds",
                                       "Admission to the start of the turn.")
        if wait is not None:
            wait.add_to(family, {})
        yield family
        family = HistogramMetricFamily("acp_server_turn_duration_seconds",
                                       "Start of the turn to its settlement.",
                                       labels=["stop_reason"])
        for stop_reason, series in turns.items():
            series.add_to(family, {"stop_reason": stop_reason})
        yield family


class _Admissions(Collector):
    """``acp_server_prompt_admissions_total``: counts the bridge's hooks keep (on the
    event loop), read when scraped."""

    def __init__(self) -> None:
        self.accepted = self.rejected = 0

    def describe(self) -> Iterator[Metric]:
        return self._families(0, 0)

    def collect(self) -> Iterator[Metric]:
        return self._families(self.accepted, self.rejected)

    @staticmethod
    def _families(accepted: int, rejected: int) -> Iterator[Metric]:
        family = CounterMetricFamily("acp_server_prompt_admissions", "send_prompt admissions.",
                                     labels=["outcome"])
        family.add_metric(["accepted"], accepted)
        family.add_metric(["rejected"], rejected)
        yield family


class _Requests:
    """One (door, route, status): its count, and its route's timing."""

    __slots__ = ("count", "timing")

    def __init__(self, timing: _Timing) -> None:
        self.count = 0
        self.timing = timing


class _RequestCollector(Collector):
    """``acp_server_http_requests_total`` and ``…_request_duration_seconds`` from the
    records the middleware keeps."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, int], _Requests] = {}
        self.timings: dict[tuple[str, str], _Timing] = {}

    def record(self, door: str, route: str, status: int) -> _Requests:
        timing = self.timings.get((door, route))
        if timing is None:
            timing = self.timings[(door, route)] = _Timing()
        record = self.requests[(door, route, status)] = _Requests(timing)
        return record

    def describe(self) -> Iterator[Metric]:
        return self._families({}, {})

    def collect(self) -> Iterator[Metric]:
        return self._families(dict(self.requests), dict(self.timings))

    @staticmethod
    def _families(requests: dict[tuple[str, str, int], _Requests],
                  timings: dict[tuple[str, str], _Timing]) -> Iterator[Metric]:
        counter = CounterMetricFamily("acp_server_http_requests", "HTTP requests answered.",
                                      labels=["door", "route", "status"])
        for (door, route, status), record in requests.items():
            counter.add_metric([door, route, str(status)], record.count)
        yield counter
        histogram = HistogramMetricFamily(
            "acp_server_http_request_duration_seconds",
            "HTTP request duration (streams: until they close).", labels=["door", "route"])
        for (door, route), timing in timings.items():
            histogram.add_metric([door, route], timing.buckets(_HTTP_BUCKET_NAMES),
                                 timing.sum)
        yield histogram


class Metrics(BridgeObserver):
    """The app's metrics; also the bridge's observer (see ``bridge.observer``)."""

    def __init__(self, bridge: Bridge, acp: ConnectionRegistry | None = None, *,
                 task_ttl_s: float = DEFAULT_TASK_TTL_S) -> None:
        self.registry = registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        self.tasks = _TaskCounts(task_ttl_s)
        registry.register(_LiveCollector(bridge, acp, self.tasks))
        registry.register(_JournalCollector(bridge))

        self._admissions = _Admissions()
        registry.register(self._admissions)
        self._turns = _TurnCollector()
        registry.register(self._turns)
        self.turn_started = self._turns.wait.observe  # type: ignore[method-assign]
        self._turn_children = self._turns.turns
        self.subscriber_evicted = Counter(  # type: ignore[method-assign]
            "acp_server_sse_evictions", "Event subscribers evicted for reading too slowly.",
            registry=registry).inc
        self._sse = Gauge("acp_server_sse_subscribers", "Open event streams.", ["door"],
                          registry=registry)
        self._streams = {door: self._sse.labels(door) for door in DOORS}
        self._requests = _RequestCollector()
        registry.register(self._requests)
        self._http = self._requests.requests
        self._transitions = Counter("acp_server_lmsp_task_transitions",
                                    "Committed LMSP task transitions, by target status.",
                                    ["to"], registry=registry)
        self._transition_children = {s: self._transitions.labels(s) for s in TASK_STATUSES}
        self._restarts = Counter("acp_server_agent_restarts",
                                 "Agent process (re)starts after a death.", ["agent"],
                                 registry=registry)
        abandoned = Counter("acp_server_agent_abandoned",
                            "Sessions that gave up on an agent that never ended a cancelled "
                            "turn, by what was done (bridge.abandoning).", ["action"],
                            registry=registry)
        self._abandoned = {action: abandoned.labels(action) for action in ABANDON_ACTIONS}
        self._foreign = Counter("acp_server_agent_foreign_messages_dropped",
                                "Agent messages naming another agent's session, dropped.",
                                ["agent", "method"], registry=registry)

    # -- bridge hooks (the others are bound methods set in __init__) --------------------
    def prompt_admitted(self) -> None:
        self._admissions.accepted += 1

    def prompt_rejected(self) -> None:
        self._admissions.rejected += 1

    def turn_settled(self, stop_reason: str, duration_s: float) -> None:
        child = self._turn_children.get(stop_reason)
        if child is None:
            if stop_reason not in STOP_REASONS:
                stop_reason = "other"   # an agent's own word: one series, not one each
            child = self._turn_children.get(stop_reason)
            if child is None:
                child = self._turn_children[stop_reason] = _Series(TURN_BUCKETS)
        child.observe(duration_s)

    def agent_restarted(self, agent: str) -> None:
        self._restarts.labels(agent).inc()

    def agent_abandoned(self, agent: str, action: str) -> None:
        child = self._abandoned.get(action)
        if child is not None:   # the bridge's two actions: no other series
            child.inc()

    def foreign_message_dropped(self, agent: str, method: str) -> None:
        self._foreign.labels(agent, method).inc()

    # -- HTTP (called by the request-log middleware) ----------------------------------
    def request_done(self, door: str, route: str, status: int, seconds: float) -> None:
        """On the event loop only (the records are plain integers)."""
        record = self._http.get((door, route, status))
        if record is None:
            record = self._requests.record(door, route, status)
        record.count += 1
        timing = record.timing
        timing.counts[bisect_left(HTTP_BUCKETS, seconds)] += 1
        timing.sum += seconds

    def stream_opened(self, door: str) -> None:
        child = self._streams.get(door)
        if child is None:
            child = self._streams[door] = self._sse.labels(door)
        child.inc()

    def stream_closed(self, door: str) -> None:
        self._streams[door].dec()

    # -- LMSP -------------------------------------------------------------------------
    def watch_lmsp(self, service: Any) -> None:
        """Count the store's committed transitions; read its tasks when scraped."""
        service.store.on_transition = self.task_moved
        self.tasks.store = service.store

    def task_moved(self, status: str) -> None:
        child = self._transition_children.get(status)
        if child is None:
            child = self._transition_children[status] = self._transitions.labels(status)
        child.inc()

    # -- sessions across instances ------------------------------------------------------
    def watch_store(self, store: Any) -> None:
        """``acp_server_store_commits_total{synced}``: the store writer's transactions,
        read at scrape time (``synced="true"``: flushed to the disk before their callers
        woke; on SQLite the session journal's own commits are not)."""
        self.registry.register(_StoreCollector(store))

    def watch_fleet(self, fleet: Any) -> None:
        """Report ``acp_server.fleet.Fleet``'s instance id, owned sessions and counters
        (read at scrape time)."""
        self.registry.register(_FleetCollector(fleet))

    # -- exposition -------------------------------------------------------------------
    async def render(self) -> bytes:
        await self.tasks.refresh()
        return generate_latest(self.registry)


async def metrics_endpoint(request: Request, *, metrics: Metrics) -> Response:
    return Response(await metrics.render(), 200, media_type=CONTENT_TYPE_PLAIN_0_0_4)


def routes(metrics: Metrics) -> list[BaseRoute]:
    return [bound_route("/metrics", metrics_endpoint, ["GET"], metrics=metrics)]
