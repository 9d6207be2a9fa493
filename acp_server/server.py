"""The server, composed in one place: every part it runs on, owned by one ``async with``.

    settings = Settings(workspace="/ws", port=0, state_dir="/var/lib/acp-server")
    async with open_server(settings) as server:
        await run_http(server, settings)            # acp_server.http.serving (the CLI)
        # or, in a test: serve ``server.app`` on any ASGI server, then
        await server.drain()

``open_server`` starts, in this order: the record of agent child processes
(``ChildRegistry``, stale ones of crashed runs reaped), the models of
``--model-server`` (listed at start, and again while it runs: ``Server.models``,
``bridge.agents.catalog``), the store (``--store``), the session journal on it
(``--session-journal store``, ``acp_server.store.sessions``), the ``Bridge`` and its
agents (journaled sessions restored before anything is served), the LMSP service on
the same store (restart recovery runs before anything is served), the principals on
that store (``acp_server.principals``: tokens, rate limits, the audit log), the
``/acp`` connection registry, the metrics, and the ASGI app over them
(``acp_server.app.build_app``). It yields a ``Server`` holding all of them.

Contracts:

* Nothing of it lives on ``app.state``: each door got its dependencies when its routes
  were built, so two servers in one process share nothing.
* ``Server.drain()`` shuts down in the designed order (``docs/architecture.md``):
  the front doors (LMSP stops taking and running work, running tasks stay in the store
  for the next start; every ``/acp`` connection closes), then the sessions
  (``Bridge.aclose``: prompts fail, streams end with ``session_closed``), then the
  agents. It is idempotent and shielded from cancellation; leaving ``open_server``
  drains (if nobody did), closes the store and removes the child record.
* Test overrides (keyword arguments, for tests and benchmarks only): ``agent_factory``
  (the default agent instead of ``settings.agent``), ``lmsp_store`` (an unopened
  ``TaskStore`` instead of ``settings.store_url``), ``lmsp_config``, ``group_commit``,
  ``acp_clock`` (the ``/acp`` registry's clock), ``session_clock`` (the session
  journal's retention clock, ``Server.purge_sessions``), ``principals_clock`` (the
  monotonic clock of the rate limits and the token cache), ``models_clock`` (the
  monotonic clock of ``--model-refresh-ms``), ``lease_offset`` (seconds
  added to the store's clock in the session leases' statements: tests move time with
  it, ``acp_server.store.leases``). Everything else comes from
  ``settings``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.applications import Starlette

from acp_server.acp_http import ConnectionRegistry
from acp_server.acp_http.registry import MONOTONIC, Clock
from acp_server.app import build_app, rest_config
from acp_server.fleet import Fleet, Forwarder, JournalReplicas, SessionRouter
from acp_server.fleet.tls import peer_context
from acp_server.http.guard import GuardStats
from acp_server.http.options import HttpOptions
from acp_server.lmsp import LmspConfig, LmspService, open_lmsp
from acp_server.store import store_for
from acp_server.store.leases import SessionLeases
from acp_server.store.pg_engine import PostgresEngine
from acp_server.store.sessions import StoreSessionJournal
from acp_server.store.tasks import TaskStore
from acp_server.ops.metrics import Metrics
from acp_server.principals import Gate, Tier, open_principals
from acp_server.rest.journal_reads import JournalReads
from acp_server.settings import Settings
from bridge import Bridge
from bridge.agents.base import AgentFactory
from bridge.agents.catalog import ModelCatalog
from bridge.agents.children import ChildRegistry
from bridge.journal import MemoryJournal, SessionJournal

log = logging.getLogger("acp_server")
PURGE_INTERVAL_S = 600
WILDCARDS = ("0.0.0.0", "::", "")


@dataclass(eq=False)
class Server:
    """The ASGI app and the parts it serves, as ``open_server`` composed them."""

    app: Starlette
    settings: Settings
    bridge: Bridge
    lmsp: LmspService
    acp: ConnectionRegistry
    metrics: Metrics
    gate: Gate
    # The connection guard's counters: counted by the HTTP server's guard
    # (acp_server.http.serving), reported by /daemon/status.
    guard_stats: GuardStats

    # The session journal's retention (``--session-retention-ms``) and its clock.
    session_clock: Callable[[], float] = time.time
    # Sessions across instances (a PostgreSQL store; else None): the leases and the
    # instance registry (acp_server.store.leases).
    leases: SessionLeases | None = None
    fleet: Fleet | None = None
    # ``--model-server``'s models, listed again while the server runs (else None).
    models: ModelCatalog | None = None

    def advertise(self, url: str) -> None:
        """The HTTP server listens at ``url``: unless ``--advertise-url`` says otherwise
        (or the bind is a wildcard), other instances forward this one's sessions there."""
        if self.leases is None or self.settings.advertise_url:
            return
        if self.settings.hostname.strip("[]") in WILDCARDS:
            log.warning("sessions across instances: the bind %s is a wildcard; pass "
                        "--advertise-url so other instances can reach this one",
                        self.settings.hostname)
            return
        journal = self.bridge.journal
        if isinstance(journal, StoreSessionJournal):
            journal.advertise(url.rstrip("/"))

    async def purge_sessions(self) -> int:
        """Remove the journals of sessions closed longer than the retention ago (on
        ``session_clock``), and the longest closed past the retention's bytes; run at start, then every ``PURGE_INTERVAL_S``, and on demand
        (tests)."""
        retention = self.settings.session_retention_ms / 1000
        return await self.bridge.journal.purge(self.session_clock() - retention,
                                               self.settings.session_retention_bytes)

    async def _purge_loop(self) -> None:
        """Purge at start, then every ``PURGE_INTERVAL_S``: a server restarted more
        often than that applies its retention all the same."""
        while True:
            try:
                await self.purge_sessions()
            except Exception as exc:   # noqa: BLE001 - a store outage: next time
                log.warning("session journal purge failed: %s", exc)
            await anyio.sleep(PURGE_INTERVAL_S)

    async def drain(self) -> None:
        """The front doors, then the sessions, then the agents (see the module docstring)."""
        self.lmsp.stop()
        self.acp.shutdown()
        with anyio.CancelScope(shield=True):
            await self.bridge.aclose()


def fleet_context(http: HttpOptions) -> ssl.SSLContext:
    """TLS of the forwards to the other instances (``acp_server.fleet.tls``): their CA
    (``--fleet-ca``, else ``--tls-client-ca``, else the public CAs), this instance's
    certificate as the client's, TLS 1.2 when the fleet requires client certificates."""
    return peer_context(ca=http.peer_ca, cert=http.tls_cert, key=http.tls_key,
                        mutual=http.tls_client_ca is not None)


@contextlib.asynccontextmanager
async def open_server(settings: Settings, *, agent_factory: AgentFactory | None = None,
                      lmsp_store: TaskStore | None = None,
                      lmsp_config: LmspConfig | None = None, group_commit: bool = True,
                      acp_clock: Clock | None = None,
                      session_clock: Callable[[], float] | None = None,
                      principals_clock: Callable[[], float] | None = None,
                      models_clock: Callable[[], float] | None = None,
                      lease_offset: Callable[[], float] | None = None
                      ) -> AsyncIterator[Server]:
    children = ChildRegistry(settings.children_dir)
    children.reap_stale()   # agents that killed earlier runs left behind
    try:
        catalog = models = None
        if settings.model_server:
            catalog = ModelCatalog(settings.model_server, taken=settings.agent_names,
                                   api_key=settings.model_api_key,
                                   interval_s=settings.model_refresh_ms / 1000,
                                   clock=models_clock or time.monotonic)
            models = await catalog.start()
        config = lmsp_config or LmspConfig(permission_policy=settings.lmsp_permissions,
                                           keepalive_s=settings.lmsp_keepalive_s)
        store = lmsp_store or store_for(
            settings.store_url, state_dir=settings.state_dir, group_commit=group_commit,
            lease_s=settings.store_lease_ms / 1000, renew_s=settings.store_renew_ms / 1000,
            poll_s=settings.store_poll_ms / 1000,
            busy_timeout_s=settings.store_busy_timeout_ms / 1000)
        journal: SessionJournal = MemoryJournal()
        leases = None
        if settings.session_journal == "store":
            if isinstance(store, PostgresEngine):
                leases = SessionLeases(store.instance,
                                       ttl_s=settings.session_lease_ttl_ms / 1000,
                                       renew_s=settings.session_lease_renew_ms / 1000,
                                       offset=lease_offset or (lambda: 0.0),
                                       url=settings.advertise_url)
            journal = StoreSessionJournal(store, ring_size=settings.options.event_ring_size,
                                          leases=leases,
                                          write_behind=settings.session_write_behind,
                                          fsync=settings.session_journal_fsync)
        the_bridge = Bridge(agent_factory or settings.agent_factory(children),
                            workspace_cwd=settings.workspace,
                            options=dataclasses.replace(
                                settings.options,
                                session_on_restart=settings.session_on_restart),
                            agents=settings.extra_agents(models or (), children),
                            journal=journal, journal_clock=session_clock or time.time)
        if catalog is not None:   # before the restore: a session's missing model may come
            the_bridge.agent_finder = catalog
            catalog.on_models = lambda new: the_bridge.add_agents(
                {m: settings.model_factory(m, children) for m in new})
        async with store, \
                (journal if isinstance(journal, StoreSessionJournal)
                 else contextlib.nullcontext(journal)), \
                the_bridge as bridge, \
                (catalog if catalog is not None else contextlib.nullcontext()), \
                open_lmsp(bridge, state_dir=settings.state_dir, store=store, store_open=True,
                          max_running_tasks=settings.max_running_tasks,
                          config=config) as lmsp, \
                open_principals(store, bootstrap=settings.token,
                                limits={k: Tier(v) for k, v in settings.rate_limits.items()},
                                share_sessions=settings.share_sessions,
                                audit_prompts=settings.audit_prompts,
                                audit_retention_s=settings.audit_retention_s,
                                **({"monotonic": principals_clock} if principals_clock
                                   else {})) as gate:
            gate.sessions.is_live = bridge.has_session   # ownership forgets closed first
            gate.sessions.recorded = bridge.session_owner   # journaled with each session
            acp = ConnectionRegistry(bridge, max_connections=settings.max_acp_connections,
                                     grace_s=settings.acp_reap_grace_s,
                                     clock=acp_clock or MONOTONIC)
            metrics = Metrics(bridge, acp, task_ttl_s=settings.metrics_task_ttl_s)
            bridge.observe(metrics)
            metrics.watch_lmsp(lmsp)   # task transitions and the task gauge
            metrics.watch_store(lmsp.store)   # the writer's commits
            guard_stats = GuardStats()
            fleet = router = replicas = None
            if leases is not None and isinstance(journal, StoreSessionJournal):
                fleet = Fleet(bridge, journal, Forwarder(
                    instance=leases.instance, max_body_bytes=settings.max_body_bytes,
                    check_s=leases.renew_s, secret=leases.shared_secret,
                    ssl_context=fleet_context(settings.http)))
                # reads of sessions live elsewhere: from the journal, woken by NOTIFY
                replicas = JournalReplicas(bridge, journal,
                                           poll_s=settings.store_poll_ms / 1000)
                store.on_sessions = replicas.wake
                store.sessions_followed = replicas.followed
                fleet.replicas = replicas
                bridge.sessions_elsewhere = replicas.statuses_elsewhere   # the listings
                reads = JournalReads(replicas, rest_config(settings, guard_stats))

                def router(stack: Any, fleet: Fleet = fleet,
                           reads: JournalReads = reads) -> Any:
                    return SessionRouter(stack, fleet, reads)
            app = build_app(settings, bridge=bridge, acp=acp, lmsp=lmsp, metrics=metrics,
                            gate=gate, guard_stats=guard_stats, sessions_router=router,
                            instances=fleet.report if fleet is not None else None,
                            forwarded_secret=leases.shared_secret if fleet is not None
                            else None)
            if fleet is not None:
                metrics.watch_fleet(fleet)
                bridge.before_restore = fleet.claim
            server = Server(app, settings, bridge, lmsp, acp, metrics, gate, guard_stats,
                            session_clock or time.time, leases, fleet, catalog)
            if isinstance(journal, StoreSessionJournal):
                journal.on_moved = bridge.sessions_moved
            async with anyio.create_task_group() as tg:
                if bridge.journal.durable:
                    tg.start_soon(server._purge_loop)
                if fleet is not None:
                    tg.start_soon(fleet.sweep_forever)
                if replicas is not None:
                    tg.start_soon(replicas.run)
                try:
                    yield server
                finally:
                    try:
                        await server.drain()
                    finally:
                        if app.recorder is not None:   # the refusals not logged: counted
                            app.recorder.close()
                    if fleet is not None:
                        with anyio.CancelScope(shield=True):
                            await fleet.forwarder.aclose()
                    tg.cancel_scope.cancel()
    finally:
        children.close()   # every agent was stopped with the bridge

