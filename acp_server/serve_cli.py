"""``acp-server serve``: its flags, the settings made of them, and the daemon's life
from the bound socket to the drained exit (``acp_server.cli`` dispatches to it).

    $ acp-server serve --port 0 --workspace . --max-pending-prompts-per-session 12
    acp-server listening on http://127.0.0.1:53117 (workspace=/abs/ws, agent=reference)
    state in /home/me/.local/state/acp-server/workspaces/ws-1f0c… (--state-dir chooses another)

Contracts:

* An invalid flag value exits with status 2 and the validation message on stderr
  (the bridge's own message for bridge options), before anything is started.
* An address that cannot be bound (a port in use) exits with status 2 and one line,
  ``acp-server: cannot listen on 127.0.0.1:4170: address already in use (…what to
  do)``, before anything is started.
* A ``--store sqlite:///PATH`` whose folder does not exist (a typo) exits with status
  2 and one line, before anything is started; a store that fails once found (its file
  gone, its disk full or read-only) is waited out with 503s, as an outage.
* A SQLite store another live ``serve`` holds (the same workspace's state folder, or
  the same ``--store sqlite:///…``) exits with status 2 and one line naming the store
  and that process's pid, before anything is started (``store.exclusive``).
* The listening line is printed to stdout (flushed) once the socket accepts
  connections, with the real port when ``--port 0``; the next line names the state
  folder (by default one per workspace, ``settings.default_state_dir``).
* LMSP tasks (``/lmsp/v1``) are kept in ``--store`` (default ``lmsp.sqlite3`` in the
  state directory); restart recovery runs before the server listens.
* SIGTERM, SIGINT or SIGHUP drains: LMSP stops starting tasks (running ones are left to
  restart recovery), every prompt is cancelled, every session closed (open event
  streams end with ``session_closed``), the agent is stopped, then the server stops
  and the process exits 0 (SIGHUP not when it was ignored at start: ``nohup``). A
  second signal skips the wait for open connections. One
  that comes while the store is being opened (or waited for) stops the start: once
  the open in progress returns (at most the store's busy or connect timeout), what was
  opened is closed and the process exits 0, with one log line.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib.util
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import anyio
import anyio.abc
import anyio.lowlevel

from acp_server.http.options import (
    DEFAULT_GRANIAN_INTERFACE,
    DEFAULT_SERVER,
    GRANIAN_INTERFACE_ENV,
    GRANIAN_INTERFACES,
    SERVERS,
    HttpOptions,
)
from acp_server.http.policy import (
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_HEADERS,
    DEFAULT_MAX_REQUEST_LINE,
)
from acp_server.app import DOORS
from acp_server.http.serving import STOP_SIGNALS, ListenError, listen, run_http
from acp_server.http.starting import answer_starting, tls_context
from acp_server.ops.request_log import configure_logging
from acp_server.profiles import merge, unfound
from acp_server.server import Server, open_server
from acp_server.store import prepare_state_dir
from acp_server.store.errors import StoreUnavailableError
from acp_server.store.exclusive import StoreInUseError, claim_sqlite_store
from acp_server.store.postgres import is_postgres_url
from acp_server.store.sqlite import store_path
from bridge.loggable import loggable
from acp_server.settings import (
    DEFAULT_HOSTNAME,
    DEFAULT_PORT,
    OPTION_FLAGS,
    TOKEN_ENV,
    Settings,
    SettingsError,
)

log = logging.getLogger("acp_server")

PLAIN_HTTP_WARNING = (
    "\n" + "!" * 78 + "\n!! PLAIN HTTP on %s, a non-loopback address: the bearer token and every "
    "prompt\n!! cross the network in clear. Pass --tls-cert and --tls-key (or put a TLS proxy "
    "in\n!! front), and --require-tls to refuse to start like this.\n" + "!" * 78)


def add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    """``serve``'s flags (``settings_from_args`` reads them)."""
    serve.add_argument("--hostname", default=DEFAULT_HOSTNAME,
                       help="address to bind (default %(default)s)")
    serve.add_argument("--port", default=str(DEFAULT_PORT),
                       help="port to bind, 0 = ephemeral (default %(default)s)")
    serve.add_argument("--workspace", default=None,
                       help="the workspace folder (default: the current folder)")
    serve.add_argument("--token", default=None,
                       help=f"bearer token required on every request (default ${TOKEN_ENV})")
    serve.add_argument("--require-auth", action="store_true",
                       help="require the token on /health too, even on loopback")
    serve.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                       help="allow browser requests from ORIGIN (repeatable)")
    serve.add_argument("--max-sessions", help="live session cap, 0 = off (default 32)")
    serve.add_argument("--max-pending-prompts-per-session",
                       help="queued + running prompts per session, 0 = off (default 5)")
    serve.add_argument("--prompt-deadline-ms", help="absolute prompt deadline (default none)")
    serve.add_argument("--event-ring-size", help="events kept per session for replay (default 8000)")
    serve.add_argument("--event-ring-bytes",
                       help="bytes of events kept per session for replay (default 67108864)")
    serve.add_argument("--session-idle-timeout-ms",
                       help="close idle sessions after this long, 0 = never (default 1800000)")
    serve.add_argument("--session-reap-interval-ms",
                       help="how often idle sessions are looked for, 0 = never (default 60000)")
    serve.add_argument("--permission-response-timeout-ms",
                       help="resolve an unanswered permission request as cancelled after this "
                            "long, 0 = wait forever (default 0)")
    serve.add_argument("--initialize-timeout-ms",
                       help="how long the agent may take to answer initialize (default 10000)")
    serve.add_argument("--agent-request-timeout-ms",
                       help="how long an agent may take to answer session/new, load, resume, "
                            "fork, close or a setter (set_mode, set_model, set_config_option; "
                            "default 30000)")
    serve.add_argument("--cancel-grace-ms",
                       help="how long an agent may take to end a cancelled turn before the "
                            "turn ends cancelled without it (default 5000)")
    serve.add_argument("--abandoned-turn-timeout-ms",
                       help="how long past that a stdio agent may still not end the cancelled "
                            "turn before the server gives up on it (stops it, or detaches the "
                            "session from it) and restores the session anew (default 60000)")
    serve.add_argument("--agent", action="append", default=[], metavar="[NAME=]COMMAND",
                       help="the default agent: 'reference' (default) or the command line of a "
                            "stdio ACP agent; NAME=COMMAND adds a named agent (repeatable)")
    serve.add_argument("--config", help="a TOML file with [agents.NAME] profiles "
                                        "(command, env, cwd)")
    serve.add_argument("--max-acp-connections", default="64",
                       help="live /acp connections; initialize past it is refused (default 64)")
    serve.add_argument("--state-dir", help="where the server keeps its state (default: a folder "
                                           "per workspace under $XDG_STATE_HOME/acp-server/"
                                           "workspaces, ~/.local/state by default)")
    serve.add_argument("--store", metavar="URL",
                       help="the LMSP task store, sqlite:///PATH or postgresql://… "
                            "(shared by several instances) (default: "
                            "lmsp.sqlite3 in the state directory)")
    serve.add_argument("--max-running-tasks", default="4",
                       help="LMSP tasks run at once; queued ones start in creation order "
                            "(default 4)")
    serve.add_argument("--model-server", metavar="URL",
                       help="an OpenAI-compatible server (e.g. http://127.0.0.1:11434/v1); "
                            "each model it lists becomes an agent of that name")
    serve.add_argument("--model-refresh-ms", default="30000",
                       help="list the model server's models again at most this often, when "
                            "a model nobody knows is named or the agents are listed; 0 = only "
                            "at start (default 30000)")
    serve.add_argument("--model-history-chars", default=str(16 * 1024 * 1024), metavar="N",
                       help="send each model session's newest N characters of conversation "
                            "(whole messages), for a model whose context is smaller "
                            "(default 16777216)")
    serve.add_argument("--model-api-key-env", metavar="NAME",
                       help="the environment variable holding the model server's API key, "
                            "sent as Authorization: Bearer (default: "
                            "ACP_SERVER_MODEL_API_KEY when set)")
    serve.add_argument("--no-web", action="store_true",
                       help="do not serve the web console at / (404 there)")
    serve.add_argument("--log-format", choices=("text", "json"), default="text",
                       help="log lines as text or JSON objects, one per line; every request "
                            "is logged (default %(default)s)")
    serve.add_argument("--max-prompt-blocks",
                       help="content blocks per prompt; more is refused with 400 (default 1024)")
    serve.add_argument("--header-timeout-ms", default="10000",
                       help="close a connection that has not sent a complete request head "
                            "within this long (default 10000)")
    serve.add_argument("--max-connections", default="2560",
                       help="live connections (SSE streams and WebSockets included); past it a "
                            "new one is refused at once with 503 (default 2560)")
    serve.add_argument("--http-server", choices=SERVERS, default=DEFAULT_SERVER,
                       help="the HTTP server, each with HTTP/1.1 and HTTP/2 on one port "
                            "and TLS with ALPN: uvicorn (HTTP/2 in the event loop) or "
                            "granian (default %(default)s)")
    serve.add_argument("--granian-interface", choices=GRANIAN_INTERFACES,
                       default=os.environ.get(GRANIAN_INTERFACE_ENV, DEFAULT_GRANIAN_INTERFACE),
                       help="how granian calls the app: asgi, or rsgi (granian's own "
                            "interface: cheaper per request, but no back-pressure on event "
                            "streams and no WebSocket subprotocol) (default "
                            f"${GRANIAN_INTERFACE_ENV}, else {DEFAULT_GRANIAN_INTERFACE})")
    serve.add_argument("--tls-cert", metavar="PEM",
                       help="serve HTTPS with this certificate chain (with --tls-key)")
    serve.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    serve.add_argument("--tls-client-ca", metavar="PEM",
                       help="mutual TLS: require client certificates signed by this CA")
    serve.add_argument("--fleet-ca", metavar="PEM",
                       help="instances on one store: trust only this CA bundle for the other "
                            "instances' certificates when forwarding to them (default: "
                            "--tls-client-ca when given, else the public CAs)")
    serve.add_argument("--require-tls", action="store_true",
                       help="refuse to start on a non-loopback address without TLS")
    serve.add_argument("--allow-host", action="append", default=[], metavar="HOST[:PORT]",
                       help="accept this Host header besides the loopback names (DNS "
                            "rebinding guard; repeatable)")
    serve.add_argument("--trusted-proxy", action="append", default=[],
                       metavar="ADDRESS[/BITS]",
                       help="believe X-Forwarded-For from this proxy address or network "
                            "(a load balancer): the client is its rightmost untrusted "
                            "address (repeatable; default: the header is ignored)")
    serve.add_argument("--max-header-bytes", default=str(DEFAULT_MAX_HEADER_BYTES),
                       help="request header bytes; more is refused with 431 "
                            "(default %(default)s)")
    serve.add_argument("--max-headers", default=str(DEFAULT_MAX_HEADERS),
                       help="request header fields; more is refused with 431 "
                            "(default %(default)s)")
    serve.add_argument("--max-request-line-bytes", default=str(DEFAULT_MAX_REQUEST_LINE),
                       help="request line bytes (method, target, version); more is "
                            "refused with 414 (default %(default)s)")
    serve.add_argument("--lmsp-permissions", default="reject",
                       choices=["reject", "allow", "cancel"],
                       help="how a permission asked during LMSP work is answered "
                            "(default reject: the agent's reject option, else cancelled)")
    serve.add_argument("--store-lease-ms", default="30000",
                       help="PostgreSQL store shared by several instances: how long a task "
                            "this instance claimed stays its own without renewal; another "
                            "instance recovers it after that (default 30000)")
    serve.add_argument("--store-renew-ms", default="10000",
                       help="how often this instance renews its leases, below "
                            "--store-lease-ms (default 10000)")
    serve.add_argument("--store-poll-ms", default="1000",
                       help="how often the shared store is polled for what its notifications "
                            "missed (default 1000)")
    serve.add_argument("--store-busy-timeout-ms", default="5000",
                       help="SQLite store: how long a write waits for a lock another process "
                            "holds before it answers 503; PostgreSQL store: how long any "
                            "statement waits for a lock another session holds before it "
                            "answers 503, and, plus 500 ms (at least 2000), for an answer "
                            "before its connection is given up (default 5000)")
    serve.add_argument("--share-sessions", action="store_true",
                       help="every principal sees every session, task and response (by "
                            "default each is its creator's; admins see all)")
    serve.add_argument("--audit-prompts", action="store_true",
                       help="keep the text of each accepted prompt in the audit log "
                            "(by default only its id)")
    serve.add_argument("--audit-retention", default="30d", metavar="DURATION",
                       help="purge audit records older than this (30d, 12h, seconds; "
                            "0 = keep forever) (default %(default)s)")
    serve.add_argument("--rate-limit-prompt", default="10", metavar="N",
                       help="prompts per minute per stored token, 0 = no limit (default 10)")
    serve.add_argument("--rate-limit-mutation", default="30", metavar="N",
                       help="other changes per minute per stored token, 0 = no limit "
                            "(default 30)")
    serve.add_argument("--rate-limit-read", default="120", metavar="N",
                       help="reads per minute per stored token, 0 = no limit (default 120)")
    serve.add_argument("--session-journal", default="store", choices=["store", "memory"],
                       help="where sessions are journaled: store (the default: sessions, "
                            "their events and every accepted prompt survive a restart, in "
                            "--store) or memory (nothing survives)")
    serve.add_argument("--session-write-behind", default=0, type=int, metavar="EVENTS",
                       help="events per session readers may see before they are committed "
                            "(a bounded write-behind window; after a crash such a session "
                            "resyncs with a new epoch); 0 (the default) publishes after "
                            "commit")
    serve.add_argument("--session-journal-fsync", action="store_true",
                       help="flush every session journal commit to the disk (survives a "
                            "power loss); by default, on SQLite, the journal's commits are "
                            "written to the WAL without waiting for the disk (they survive "
                            "kill -9 and any crash of the server; task writes always flush)")
    serve.add_argument("--session-on-restart", default="fail", choices=["fail", "continue"],
                       help="the prompt that was running when the server stopped: fail "
                            "(its terminal is server_restarted) or continue (the restored "
                            "agent is asked to continue the turn); queued prompts still run "
                            "(default fail)")
    serve.add_argument("--session-retention-ms", default=str(7 * 24 * 3600 * 1000),
                       help="how long a closed session's journal is kept (default 7 days)")
    serve.add_argument("--session-retention-bytes", default=str(4 << 30),
                       help="the closed sessions' journaled events, in all: past it the "
                            "longest closed are purged first; 0 = no bound (default "
                            "4294967296, 4 GiB)")
    serve.add_argument("--session-lease-ttl-ms", default="8000",
                       help="PostgreSQL store shared by several instances: how long a "
                            "session stays this instance's without renewal; another instance "
                            "takes it over after that (default 8000)")
    serve.add_argument("--session-lease-renew-ms", default="2000",
                       help="how often this instance renews its session leases, below "
                            "--session-lease-ttl-ms (default 2000)")
    serve.add_argument("--advertise-url", default=None, metavar="URL",
                       help="the base URL other instances reach this one at, to forward "
                            "requests for the sessions it runs (default: http(s)://HOST:PORT "
                            "of the bind, unless HOST is a wildcard)")


def state_dir_ready(path: str) -> None:
    """The state directory made (mode 0700) before anything starts; one that cannot be
    (a parent missing or not writable, a file in its place) is a ``SettingsError``."""
    try:
        prepare_state_dir(path)
    except OSError as exc:
        raise SettingsError(f"Invalid state-dir: {path!r}: cannot create it "
                            f"({exc.strerror or exc}). Pass --state-dir with a folder "
                            f"this user may create or write.") from None


def store_folder_ready(url: str) -> None:
    """A ``--store sqlite:///PATH`` whose folder does not exist at start is a
    ``SettingsError``: a mistyped path, not an outage, so not waited out with 503s (a
    store that fails once started, its file gone, its disk full or read-only, still
    is). The default store's folder is the state folder, made by ``state_dir_ready``."""
    if is_postgres_url(url):
        return
    folder = os.path.dirname(os.path.abspath(store_path(url)))
    if not os.path.isdir(folder):
        what = "is not a folder" if os.path.exists(folder) else "does not exist (create it)"
        raise SettingsError(f"Invalid store: {url!r}: its folder {folder} {what}. Pass "
                            f"--store with a file in an existing folder, or none for "
                            f"lmsp.sqlite3 in the state folder.")


def settings_from_args(args: argparse.Namespace) -> Settings:
    try:
        http = HttpOptions.from_flags(
            server=args.http_server, tls_cert=args.tls_cert, tls_key=args.tls_key,
            tls_client_ca=args.tls_client_ca, fleet_ca=args.fleet_ca,
            require_tls=args.require_tls,
            allow_host=args.allow_host, trusted_proxy=args.trusted_proxy,
            max_header_bytes=args.max_header_bytes,
            max_headers=args.max_headers, max_request_line=args.max_request_line_bytes,
            granian_interface=args.granian_interface)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    return Settings.from_flags(http=http,
        hostname=args.hostname, port=args.port, workspace=args.workspace, token=args.token,
        require_auth=args.require_auth, allow_origin=args.allow_origin,
        agent=args.agent or ["reference"], config=args.config, model_server=args.model_server,
        model_refresh_ms=args.model_refresh_ms, model_history_chars=args.model_history_chars,
        model_api_key_env=args.model_api_key_env,
        state_dir=args.state_dir, max_acp_connections=args.max_acp_connections,
        store=args.store, max_running_tasks=args.max_running_tasks, web=not args.no_web,
        log_format=args.log_format,
        header_timeout_ms=args.header_timeout_ms, max_connections=args.max_connections,
        lmsp_permissions=args.lmsp_permissions, store_lease_ms=args.store_lease_ms,
        store_renew_ms=args.store_renew_ms, store_poll_ms=args.store_poll_ms,
        store_busy_timeout_ms=args.store_busy_timeout_ms,
        share_sessions=args.share_sessions, audit_prompts=args.audit_prompts,
        audit_retention=args.audit_retention, rate_limit_prompt=args.rate_limit_prompt,
        rate_limit_mutation=args.rate_limit_mutation, rate_limit_read=args.rate_limit_read,
        session_journal=args.session_journal, session_on_restart=args.session_on_restart,
        session_write_behind=args.session_write_behind,
        session_journal_fsync=args.session_journal_fsync,
        session_retention_ms=args.session_retention_ms,
        session_retention_bytes=args.session_retention_bytes,
        session_lease_ttl_ms=args.session_lease_ttl_ms,
        session_lease_renew_ms=args.session_lease_renew_ms, advertise_url=args.advertise_url,
        **{flag: getattr(args, flag) for flag in OPTION_FLAGS})


def run_serve_args(args: argparse.Namespace) -> int:
    """``acp-server serve`` with its parsed flags: the process's exit status."""
    try:
        settings = settings_from_args(args)
    except SettingsError as exc:
        _refuse(str(exc))
    try:
        sock = listen(settings)   # before anything starts: a port in use is one line
    except ListenError as exc:
        print(f"acp-server: {loggable(str(exc), MESSAGE_CHARS)}", file=sys.stderr)
        return 2
    try:
        if settings.store is not None:   # before the state folder: a typo makes nothing
            store_folder_ready(settings.store)
        state_dir_ready(settings.state_dir)   # after the port: a port in use makes nothing
    except SettingsError as exc:
        sock.close()
        _refuse(str(exc))
    try:
        store_lock = claim_sqlite_store(settings.store_url)   # held until the process ends
    except StoreInUseError as exc:
        sock.close()
        print(f"acp-server: {loggable(str(exc), MESSAGE_CHARS)}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format)
    if settings.token is None:
        log.warning("no token configured: trusted loopback mode, every local process has "
                    "full access (set --token or %s to require one)", TOKEN_ENV)
    if not settings.loopback and not settings.http.tls:
        log.warning(PLAIN_HTTP_WARNING, loggable(settings.hostname))
    for warning in (settings.lease_margin_warning(), settings.fleet_tls_warning()):
        if warning is not None:   # may name a path (--tls-cert)
            log.warning("%s", loggable(warning, MESSAGE_CHARS))
    for name, program in unfound(merge(settings.default_profile, settings.agent_profiles),
                                 settings.workspace):
        log.warning("agent %r: %r is not found (not on PATH, or not an executable file): "
                    "its sessions answer 503 agent_unavailable until it is installed",
                    name, program)
    try:
        anyio.run(functools.partial(serve, settings, sock=sock), backend="asyncio",
                  backend_options=_loop_options())
    finally:
        if store_lock is not None:
            store_lock.release()
    return 0


MESSAGE_CHARS = 4096   # a start-up line that echoes a flag or a path: one line, escaped


def _refuse(message: str) -> NoReturn:
    """A value refused after parsing: one line on stderr, exit 2. (argparse's ``error``
    would print serve's whole usage first, some fifty lines above the reason.)"""
    print(f"acp-server serve: error: {loggable(message, MESSAGE_CHARS)}", file=sys.stderr)
    raise SystemExit(2)


def _loop_options() -> dict[str, Any]:
    """uvloop when installed (it is, with ``uvicorn[standard]``), as uvicorn itself picks."""
    return {"use_uvloop": importlib.util.find_spec("uvloop") is not None}


async def serve(settings: Settings, *, sock: socket.socket | None = None,
                **overrides: Any) -> None:
    """The daemon: ``open_server`` plus the HTTP server, until SIGTERM/SIGINT (drained).
    ``overrides`` are ``open_server``'s (benchmarks only)."""
    if sock is None:
        sock = listen(settings)
    # One receiver for the process's life (asyncio keeps one handler a signal): while
    # starting, a signal cancels ``starting``; once serving, ``run_http`` drains on it.
    with sock, anyio.open_signal_receiver(*STOP_SIGNALS) as signals, \
            anyio.CancelScope() as starting:
        async with anyio.create_task_group() as tg, contextlib.AsyncExitStack() as stack:
            watching = await tg.start(_stop_starting, signals, starting)
            server = await _open_when_store(stack, settings, sock, overrides)
            watching.cancel()   # no await since the open returned: a signal is run_http's
            settle_heap()
            await run_http(server, settings, sock, signals=signals)


async def _stop_starting(signals: AsyncIterator[int], starting: anyio.CancelScope, *,
                         task_status: anyio.abc.TaskStatus[anyio.CancelScope]
                         = anyio.TASK_STATUS_IGNORED) -> None:
    """Until cancelled (the store opened): the first signal cancels ``starting``."""
    with anyio.CancelScope() as watching:
        task_status.started(watching)
        async for signum in signals:
            log.info("received %s while starting: stopping", signal.Signals(signum).name)
            starting.cancel()
            return


# Waits between attempts to start while the store is down: doubled up to the last.
STORE_RETRY_S = (1.0, 2.0, 4.0, 8.0, 10.0)


async def _open_when_store(stack: contextlib.AsyncExitStack, settings: Settings,
                           sock: socket.socket, overrides: dict[str, Any]) -> Server:
    """``open_server`` entered on ``stack``; while the store is unavailable, logged, the
    socket answered 503 (``acp_server.http.starting``) and tried again, for ever (until
    the caller's signal watcher cancels it)."""
    attempt = 0
    while True:
        try:
            return await stack.enter_async_context(open_server(settings, **overrides))
        except Exception as exc:   # noqa: BLE001 - only a store outage is waited out
            reason = store_outage(exc)
            if reason is None:
                raise
        await anyio.lowlevel.checkpoint_if_cancelled()   # stopped meanwhile: no next try
        wait = STORE_RETRY_S[min(attempt, len(STORE_RETRY_S) - 1)]
        attempt += 1
        log.warning("cannot start: %s; answering 503 and trying again in %g s (attempt %d)",
                    reason, wait, attempt)
        await answer_starting(sock, DOORS, seconds=wait, tls=tls_context(settings.http))


def store_outage(exc: BaseException) -> str | None:
    """Why the store is unavailable, when ``exc`` is that (alone or grouped), else None."""
    if isinstance(exc, StoreUnavailableError):
        return str(exc)
    if isinstance(exc, BaseExceptionGroup):
        reasons = [store_outage(inner) for inner in exc.exceptions]
        if reasons and all(reasons):
            return reasons[0]
    return None


# Net allocations of tracked objects between two collections of the youngest generation
# (CPython's default: 700).
GC_YOUNG = 7000


def settle_heap() -> None:
    """Once start-up is over. What it made (modules, routes, restored sessions) lives as
    long as the process: frozen, no collection walks it again (a full collection of it
    took ~35 ms, a pause that landed in event bursts, #23). And the youngest generation
    is collected every ``GC_YOUNG`` net allocations, not 700: a request, a turn or an
    LMSP task allocates in bursts that crossed 700 again and again, ~630 young, ~58
    middle and 5 full collections per 3,000 LMSP tasks, 70-120 µs of the event loop's
    CPU a task (``bench.lmsp_inprocess``); at 7,000, one. Garbage in cycles waits at
    most that many allocations longer."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])

