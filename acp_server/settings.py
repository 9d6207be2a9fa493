"""Daemon settings: one frozen value built from the command line, validated once.

    settings = Settings.from_flags(port="0", workspace=".", max_pending_prompts_per_session="12")
    settings.options.pending_prompt_limit    # 12
    settings.base_url                        # "http://127.0.0.1:0"

Contracts:

* ``Settings(...)`` and ``Settings.from_flags(...)`` raise ``SettingsError`` (a
  ``ValueError``) whose message is what the CLI prints before exiting with status 2.
  Bridge option values are checked by ``BridgeOptions`` itself, so the messages are
  the bridge's (``Invalid max_sessions: -1. Must be ...``).
* A non-loopback bind needs a token; ``require_auth`` needs a token; ``*`` in the
  allowed origins needs a token.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shlex
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from acp_server.client.errors import redact_address
from acp_server.fleet.tls import client_auth_allowed
from acp_server.http.options import HttpOptions
from acp_server.http.policy import is_loopback
from acp_server.lmsp.permissions import POLICIES
from acp_server.principals.model import InvalidPrincipalError
from acp_server.principals.tokens import parse_duration
from acp_server.profiles import (
    AgentProfile,
    ProfileError,
    build_factory,
    load_config,
    merge,
    parse_agent_flags,
)
from acp_server.store.pg_engine import ANSWER_MARGIN_S, MIN_ANSWER_S
from acp_server.store.postgres import is_postgres_url
from bridge.errors import InvalidOptionError
from bridge.options import BridgeOptions

if TYPE_CHECKING:
    from bridge.agents.base import AgentFactory
    from bridge.agents.children import ChildRegistry

DEFAULT_HOSTNAME = "127.0.0.1"
DEFAULT_PORT = 4170
DEFAULT_MAX_BODY_BYTES = 10 * 1024 * 1024
DEFAULT_HEARTBEAT_S = 15.0
REFERENCE_AGENT = "reference"
DEFAULT_MAX_RUNNING_TASKS = 4
DEFAULT_HEADER_TIMEOUT_MS = 10_000
# Every SSE subscriber the bridge allows (32 sessions x 64 subscribers = 2048) plus
# 512 for requests, /acp streams and WebSockets; kept below the descriptor limit.
DEFAULT_MAX_CONNECTIONS = 2560
DEFAULT_STORE_LEASE_MS, DEFAULT_STORE_RENEW_MS, DEFAULT_STORE_POLL_MS = 30_000, 10_000, 1_000
DEFAULT_SESSION_RETENTION_BYTES = 4 << 30   # closed sessions' journaled events, in all
TOKEN_ENV = "ACP_SERVER_TOKEN"
MODEL_API_KEY_ENV = "ACP_SERVER_MODEL_API_KEY"   # the model server's key, unless named
DEFAULT_MODEL_HISTORY_CHARS = 16 * 1024 * 1024
DEFAULT_AUDIT_RETENTION_S = 30 * 86400
DEFAULT_RATE_LIMITS = {"prompt": 10, "mutation": 30, "read": 120}   # per minute
_ORIGIN = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/\s?#]+$")

# CLI flag name -> BridgeOptions field. Values arrive as strings and are parsed by
# ``parse_number``; BridgeOptions validates them.
OPTION_FLAGS = {
    "max_sessions": "max_sessions",
    "max_pending_prompts_per_session": "max_pending_prompts_per_session",
    "prompt_deadline_ms": "prompt_deadline_ms",
    "event_ring_size": "event_ring_size",
    "event_ring_bytes": "event_ring_bytes",
    "session_idle_timeout_ms": "session_idle_timeout_ms",
    "session_reap_interval_ms": "session_reap_interval_ms",
    "permission_response_timeout_ms": "permission_response_timeout_ms",
    "initialize_timeout_ms": "initialize_timeout_ms",
    "agent_request_timeout_ms": "agent_request_timeout_ms",
    "cancel_grace_ms": "cancel_grace_ms",
    "abandoned_turn_timeout_ms": "abandoned_turn_timeout_ms",
    "max_prompt_blocks": "max_prompt_blocks",
}


class SettingsError(ValueError):
    """An invalid setting; the message names the setting and the value."""


def default_state_dir(workspace: str) -> str:
    """One folder per workspace: ``$XDG_STATE_HOME/acp-server/workspaces/NAME-DIGEST``
    (``$XDG_STATE_HOME`` defaults to ``~/.local/state``). DIGEST (16 hex digits of the
    SHA-256 of the workspace's real path) is the key; NAME, its last component, is there
    to be read. So two workspaces never share tasks, and one workspace always finds its own."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    real = os.path.realpath(workspace)
    digest = hashlib.sha256(os.fsencode(real)).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(real))[:40] or "root"
    return os.path.join(base, "acp-server", "workspaces", f"{name}-{digest}")


def parse_number(text: str) -> Any:
    """``"5"`` → 5, ``"1.5"`` → 1.5, ``"inf"`` → inf; anything else is returned as is
    so that the validator names it in its message."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    workspace: str
    hostname: str = DEFAULT_HOSTNAME
    port: int = DEFAULT_PORT
    token: str | None = None
    require_auth: bool = False
    allow_origins: tuple[str, ...] = ()
    agent: str = REFERENCE_AGENT
    # Named agents besides the default (``--agent NAME=COMMAND``, ``--config``).
    agent_profiles: tuple[AgentProfile, ...] = ()
    model_server: str | None = None
    # ``--model-server``'s models are listed again at most this often (ms), when a name
    # nobody knows is asked for or the agents are listed (bridge.agents.catalog);
    # 0 = only at start.
    model_refresh_ms: int = 30_000
    # each model session's conversation sent upstream: its newest characters, at most
    model_history_chars: int = DEFAULT_MODEL_HISTORY_CHARS
    # from the environment only (never a flag: ps shows those); never shown
    model_api_key: str | None = dataclasses.field(default=None, repr=False)
    # what the agents of ``--model-server`` learn of it (``ModelServerState``)
    model_upstream: Any = dataclasses.field(default_factory=lambda: _model_server_state(),
                                            repr=False, compare=False)
    # "" = the workspace's own folder (``default_state_dir``); ``--state-dir`` chooses.
    state_dir: str = ""
    options: BridgeOptions = dataclasses.field(default_factory=BridgeOptions)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_acp_connections: int = 64
    acp_reap_grace_s: float = 10.0
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    # The LMSP SSE keep-alive after this much silence (LMSP §6.4: 15 s).
    lmsp_keepalive_s: float = DEFAULT_HEARTBEAT_S
    # LMSP task store (``sqlite:///path``; ``None`` = ``<state_dir>/lmsp.sqlite3``) and
    # how many tasks run at once (0 = accept tasks, run none).
    store: str | None = None
    max_running_tasks: int = DEFAULT_MAX_RUNNING_TASKS
    # The web console at ``/`` (``--no-web`` turns it off: 404).
    web: bool = True
    # ``--log-format``; how long /metrics reuses the LMSP task counts.
    log_format: str = "text"
    metrics_task_ttl_s: float = 5.0
    # Connection guard (acp_server/http/guard.py) and LMSP permission policy.
    header_timeout_ms: int = DEFAULT_HEADER_TIMEOUT_MS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    lmsp_permissions: str = "reject"
    # The HTTP server, TLS, Host allow-list and head caps (acp_server/http/options.py).
    http: HttpOptions = dataclasses.field(default_factory=HttpOptions)
    # A PostgreSQL store shared by several instances: how long a task this instance
    # claimed stays its own without renewal, how often the leases are renewed, how
    # often the store is polled for what NOTIFY missed (milliseconds).
    store_lease_ms: int = DEFAULT_STORE_LEASE_MS
    store_renew_ms: int = DEFAULT_STORE_RENEW_MS
    store_poll_ms: int = DEFAULT_STORE_POLL_MS
    # A SQLite store: how long a write waits for another process's lock (then 503).
    store_busy_timeout_ms: int = 5000
    # Principals (acp_server/principals): sessions, tasks and responses are their
    # creator's unless shared; the audit log; the rate limits of stored tokens
    # (requests per minute by class, 0 = no limit; qwen serve's tiers by default).
    share_sessions: bool = False
    audit_prompts: bool = False
    audit_retention_s: float = DEFAULT_AUDIT_RETENTION_S
    rate_limit_prompt: int = DEFAULT_RATE_LIMITS["prompt"]
    rate_limit_mutation: int = DEFAULT_RATE_LIMITS["mutation"]
    rate_limit_read: int = DEFAULT_RATE_LIMITS["read"]
    # The session journal (issue #23): "store" (sessions survive a restart, on the
    # store above) or "memory" (nothing survives); what happens to the prompt that
    # was running at a restart; how long a closed session's journal is kept.
    session_journal: str = "store"
    # events per session readers may see before their commit (0: publish after commit;
    # acp_server.store.write_behind)
    session_write_behind: int = 0
    # every journal commit fsynced (survives a power loss); else, on SQLite, written
    # to the WAL only (survives kill -9): acp_server.store.sqlite
    session_journal_fsync: bool = False
    session_on_restart: str = "fail"
    session_retention_ms: int = 7 * 24 * 3600 * 1000
    session_retention_bytes: int = DEFAULT_SESSION_RETENTION_BYTES
    # Sessions across instances on a PostgreSQL store (issue #24, docs/deployment.md):
    # the lease that makes one instance a session's owner, how often it is renewed,
    # and the base URL other instances forward that session's requests to (default:
    # http(s)://HOST:PORT of the bind, when HOST is not a wildcard).
    session_lease_ttl_ms: int = 8000
    session_lease_renew_ms: int = 2000
    advertise_url: str | None = None

    def __post_init__(self) -> None:
        if not self.hostname:
            raise SettingsError("Invalid hostname: ''. Must be a host name or an IP address.")
        if isinstance(self.port, bool) or not isinstance(self.port, int) \
                or not 0 <= self.port <= 65535:
            raise SettingsError(f"Invalid port: {self.port!r}. Must be an integer in [0, 65535].")
        if not os.path.isdir(self.workspace):
            raise SettingsError(f"Invalid workspace: {self.workspace!r}. Must be an existing directory.")
        object.__setattr__(self, "workspace", os.path.realpath(self.workspace))
        if not self.state_dir:
            object.__setattr__(self, "state_dir", default_state_dir(self.workspace))
        if self.token is not None and not self.token:
            raise SettingsError("Invalid token: ''. Must be a non-empty string.")
        if self.http.require_tls and not self.loopback and not self.http.tls:
            raise SettingsError(
                f"Refusing to bind {self.hostname} (not a loopback address) without TLS "
                "(--require-tls): pass --tls-cert and --tls-key, or bind 127.0.0.1.")
        if self.require_auth and self.token is None:
            raise SettingsError(
                f"--require-auth needs a token: pass --token or set {TOKEN_ENV}.")
        if not self.loopback and self.token is None:
            raise SettingsError(
                f"Refusing to bind {self.hostname} (not a loopback address) without a token: "
                f"pass --token or set {TOKEN_ENV}, or bind 127.0.0.1.")
        for origin in self.allow_origins:
            if origin == "*":
                if self.token is None:
                    raise SettingsError(
                        "Invalid allow-origin: '*' is only allowed when a token is configured.")
            elif not _ORIGIN.fullmatch(origin):
                raise SettingsError(
                    f"Invalid allow-origin: {origin!r}. Must be an origin like "
                    "http://localhost:3000, or '*'.")
        if not self.agent_argv:
            raise SettingsError(f"Invalid agent: {self.agent!r}. Must be 'reference' or a command line.")
        try:
            merge(self.default_profile, self.agent_profiles)
        except ProfileError as exc:
            raise SettingsError(str(exc)) from None
        if self.store is not None and \
                not self.store.startswith(("sqlite:///", "postgresql://", "postgres://")):
            raise SettingsError(f"Invalid store: {redact_address(self.store)!r}. "
                                "Must be sqlite:///PATH or postgresql://….")
        if isinstance(self.max_running_tasks, bool) or not isinstance(self.max_running_tasks, int) \
                or self.max_running_tasks < 0:
            raise SettingsError(f"Invalid max-running-tasks: {self.max_running_tasks!r}. "
                                "Must be a non-negative integer.")
        if self.model_server is not None and not re.match(r"^https?://[^\s/]+", self.model_server):
            raise SettingsError(f"Invalid model server: {redact_address(self.model_server)!r}. "
                                "Must be an http(s) URL such as http://127.0.0.1:11434/v1.")
        if self.model_server is not None and re.search(r"[?#]", self.model_server):
            # the paths are appended to it (/models after a query string), and httpx logs
            # each request's URL: a key there reached the log; it goes by --model-api-key-env
            raise SettingsError(f"Invalid model server: {redact_address(self.model_server)!r}. "
                                "Must have no query string or fragment (pass an API key "
                                "with --model-api-key-env).")
        if isinstance(self.model_refresh_ms, bool) or not isinstance(self.model_refresh_ms, int) \
                or self.model_refresh_ms < 0:
            raise SettingsError(f"Invalid model-refresh-ms: {self.model_refresh_ms!r}. Must be "
                                "a non-negative integer (0 = list the models only at start).")
        if isinstance(self.model_history_chars, bool) \
                or not isinstance(self.model_history_chars, int) or self.model_history_chars < 1:
            raise SettingsError(f"Invalid model-history-chars: {self.model_history_chars!r}. "
                                "Must be a positive integer.")
        if isinstance(self.max_acp_connections, bool) or not isinstance(self.max_acp_connections, int) \
                or self.max_acp_connections < 1:
            raise SettingsError(f"Invalid max_acp_connections: {self.max_acp_connections!r}. "
                                "Must be a positive integer.")
        if not (isinstance(self.max_body_bytes, int) and self.max_body_bytes > 0):
            raise SettingsError(f"Invalid max body bytes: {self.max_body_bytes!r}.")
        if self.log_format not in ("text", "json"):
            raise SettingsError(f"Invalid log format: {self.log_format!r}. Must be text or json.")
        if not self.metrics_task_ttl_s >= 0:
            raise SettingsError(f"Invalid metrics task TTL: {self.metrics_task_ttl_s!r}.")
        if not self.heartbeat_s > 0:
            raise SettingsError(f"Invalid heartbeat interval: {self.heartbeat_s!r}.")
        for name in ("header_timeout_ms", "max_connections", "store_lease_ms",
                     "store_renew_ms", "store_poll_ms", "store_busy_timeout_ms",
                     "session_lease_ttl_ms", "session_lease_renew_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SettingsError(f"Invalid {name.replace('_', '-')}: {value!r}. "
                                    "Must be a positive integer.")
        if self.store_renew_ms >= self.store_lease_ms:
            raise SettingsError(f"Invalid store-renew-ms: {self.store_renew_ms!r}. Must be "
                                f"less than store-lease-ms ({self.store_lease_ms}).")
        if self.session_lease_renew_ms >= self.session_lease_ttl_ms:
            raise SettingsError(f"Invalid session-lease-renew-ms: {self.session_lease_renew_ms!r}"
                                f". Must be less than session-lease-ttl-ms "
                                f"({self.session_lease_ttl_ms}).")
        if self.advertise_url is not None and not re.fullmatch(
                r"https?://[^\s/?#]+/?", self.advertise_url):
            raise SettingsError(f"Invalid advertise-url: {self.advertise_url!r}. Must be "
                                "http(s)://host:port, with no path.")
        if self.lmsp_permissions not in POLICIES:
            raise SettingsError(f"Invalid lmsp-permissions: {self.lmsp_permissions!r}. Must be "
                                f"one of {', '.join(POLICIES)}.")
        if self.session_write_behind < 0:
            raise SettingsError(f"Invalid session-write-behind: {self.session_write_behind}. "
                                "Must be 0 or more.")
        if self.session_journal not in ("store", "memory"):
            raise SettingsError(f"Invalid session-journal: {self.session_journal!r}. Must be "
                                "store or memory.")
        if self.session_on_restart not in ("fail", "continue"):
            raise SettingsError(f"Invalid session-on-restart: {self.session_on_restart!r}. "
                                "Must be fail or continue.")
        if isinstance(self.session_retention_ms, bool) \
                or not isinstance(self.session_retention_ms, int) or self.session_retention_ms < 1:
            raise SettingsError(f"Invalid session-retention: {self.session_retention_ms!r}. "
                                "Must be a positive number of milliseconds.")
        if isinstance(self.session_retention_bytes, bool) \
                or not isinstance(self.session_retention_bytes, int) \
                or self.session_retention_bytes < 0:
            raise SettingsError(f"Invalid session-retention-bytes: "
                                f"{self.session_retention_bytes!r}. Must be 0 (no bound) "
                                "or a positive number of bytes.")
        if not self.lmsp_keepalive_s > 0:
            raise SettingsError(f"Invalid LMSP keep-alive interval: {self.lmsp_keepalive_s!r}.")
        for klass in DEFAULT_RATE_LIMITS:
            value = getattr(self, f"rate_limit_{klass}")
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SettingsError(f"Invalid rate-limit-{klass}: {value!r}. Must be a "
                                    "non-negative integer (requests per minute; 0 = no limit).")
        if not (isinstance(self.audit_retention_s, int | float) and self.audit_retention_s >= 0):
            raise SettingsError(f"Invalid audit-retention: {self.audit_retention_s!r}.")

    # -- derived -----------------------------------------------------------------------
    @property
    def loopback(self) -> bool:
        return is_loopback(self.hostname)

    @property
    def health_needs_auth(self) -> bool:
        """``/health`` is open on a loopback bind unless ``--require-auth``."""
        return self.token is not None and (self.require_auth or not self.loopback)

    @property
    def agent_argv(self) -> list[str]:
        try:
            return shlex.split(self.agent)
        except ValueError:
            return []

    @property
    def agent_name(self) -> str:
        return self.default_profile.name

    @property
    def default_profile(self) -> AgentProfile:
        argv = self.agent_argv
        if argv == [REFERENCE_AGENT]:
            return AgentProfile(REFERENCE_AGENT)
        return AgentProfile(os.path.basename(argv[0]), tuple(argv))

    @property
    def agent_names(self) -> frozenset[str]:
        """The names of the agents configured here (the default, the named ones and
        ``reference``): a model id of ``--model-server`` must not take one."""
        return frozenset({self.default_profile.name, REFERENCE_AGENT,
                          *(p.name for p in self.agent_profiles)})

    def agent_factory(self, registry: ChildRegistry | None = None) -> AgentFactory:
        """The default agent: the reference agent in-process, or the command as a
        stdio ACP agent (without the server's token in its environment)."""
        return self._factory(self.default_profile, registry)

    def extra_agents(self, models: Iterable[str] = (),
                     registry: ChildRegistry | None = None) -> dict[str, AgentFactory]:
        """Every named agent besides the default (``reference`` always among them),
        plus one model-agent profile per model id of ``--model-server``."""
        named = [*self.agent_profiles,
                 *(AgentProfile(m, model_server=self.model_server) for m in models)]
        profiles = merge(self.default_profile, named)[1:]
        return {p.name: self._factory(p, registry) for p in profiles}

    def model_factory(self, model: str, registry: ChildRegistry | None = None) -> AgentFactory:
        """The model agent of one model id of ``--model-server`` (one listed later too)."""
        assert self.model_server is not None
        return self._factory(AgentProfile(model, model_server=self.model_server), registry)

    def _factory(self, profile: AgentProfile, registry: ChildRegistry | None) -> AgentFactory:
        return build_factory(profile, workspace=self.workspace,
                             hidden_env=[TOKEN_ENV, MODEL_API_KEY_ENV], registry=registry,
                             model_options={"max_history_chars": self.model_history_chars,
                                            "api_key": self.model_api_key,
                                            "upstream": self.model_upstream})

    @property
    def store_url(self) -> str:
        """The LMSP task store: ``--store``, else a file under the state directory."""
        return self.store or f"sqlite:///{os.path.join(self.state_dir, 'lmsp.sqlite3')}"

    def lease_margin_warning(self) -> str | None:
        """On a PostgreSQL store: a warning when ``--store-busy-timeout-ms`` leaves a
        renewal held up by a lock, or by a connection gone silent (given up after the
        busy timeout plus ``ANSWER_MARGIN_S``, at least ``MIN_ANSWER_S``:
        ``store.pg_engine``), no time before its lease expires (a session's: ``ttl -
        renew``; an LMSP task's: ``lease - renew``), else ``None``. Another instance may
        then adopt what this one still runs (fenced: this one's writes are refused and it
        stops), so it is a warning, not a refusal."""
        if not is_postgres_url(self.store_url):
            return None
        busy = self.store_busy_timeout_ms
        margin = int(ANSWER_MARGIN_S * 1000)
        for what, ttl, renew in (
                ("session-lease-ttl-ms", self.session_lease_ttl_ms, self.session_lease_renew_ms),
                ("store-lease-ms", self.store_lease_ms, self.store_renew_ms)):
            if max(busy + margin, MIN_ANSWER_S * 1000) >= ttl - renew:
                return (f"--store-busy-timeout-ms {busy} is not below --{what} {ttl} minus its "
                        f"renewal interval {renew} and {margin} ms (at least "
                        f"{int(MIN_ANSWER_S * 1000)} ms in all): a renewal held up by a lock "
                        f"another session holds, or by a connection to PostgreSQL gone silent, "
                        f"may let the lease expire while this instance still runs its work "
                        f"(another instance then adopts it)")
        return None

    def fleet_tls_warning(self) -> str | None:
        """On a PostgreSQL store with ``--tls-client-ca`` (the other instances require
        client certificates too, presumably): a warning when ``--tls-cert``, which this
        instance presents to them when it forwards, may not be a client certificate
        (its extended key usage lacks clientAuth): they would refuse the handshake."""
        http = self.http
        if (not is_postgres_url(self.store_url) or http.tls_client_ca is None
                or http.tls_cert is None or client_auth_allowed(http.tls_cert)):
            return None
        return (f"--tls-cert {http.tls_cert} does not allow clientAuth (its extended key "
                f"usage does not list it): other instances that require client "
                f"certificates (--tls-client-ca) will refuse it when this one forwards a "
                f"request to them (503 owner_unreachable); issue it with extendedKeyUsage "
                f"serverAuth,clientAuth")

    @property
    def rate_limits(self) -> dict[str, int]:
        """Requests per minute by class for stored tokens (0 = that class unlimited)."""
        return {klass: getattr(self, f"rate_limit_{klass}") for klass in DEFAULT_RATE_LIMITS}

    @property
    def children_dir(self) -> str:
        """Where the stdio agent processes of running servers are recorded."""
        return os.path.join(self.state_dir, "agents")

    # -- construction from flags ---------------------------------------------------------
    @classmethod
    def from_flags(cls, *, hostname: str = DEFAULT_HOSTNAME, port: str | int = DEFAULT_PORT,
                   workspace: str | None = None, token: str | None = None,
                   require_auth: bool = False, allow_origin: Iterable[str] = (),
                   agent: str | Iterable[str] = REFERENCE_AGENT, config: str | None = None,
                   model_server: str | None = None, model_refresh_ms: str | int = 30_000,
                   model_history_chars: str | int = DEFAULT_MODEL_HISTORY_CHARS,
                   model_api_key_env: str | None = None,
                   state_dir: str | None = None,
                   max_acp_connections: str | int = 64, store: str | None = None,
                   max_running_tasks: str | int = DEFAULT_MAX_RUNNING_TASKS,
                   web: bool = True,
                   log_format: str = "text",
                   header_timeout_ms: str | int = DEFAULT_HEADER_TIMEOUT_MS,
                   max_connections: str | int = DEFAULT_MAX_CONNECTIONS,
                   lmsp_permissions: str = "reject",
                   http: HttpOptions | None = None,
                   store_lease_ms: str | int = DEFAULT_STORE_LEASE_MS,
                   store_renew_ms: str | int = DEFAULT_STORE_RENEW_MS,
                   store_poll_ms: str | int = DEFAULT_STORE_POLL_MS,
                   store_busy_timeout_ms: str | int = 5000,
                   share_sessions: bool = False, audit_prompts: bool = False,
                   audit_retention: str | float | None = None,
                   rate_limit_prompt: str | int = DEFAULT_RATE_LIMITS["prompt"],
                   rate_limit_mutation: str | int = DEFAULT_RATE_LIMITS["mutation"],
                   rate_limit_read: str | int = DEFAULT_RATE_LIMITS["read"],
                   session_journal: str = "store", session_on_restart: str = "fail",
                   session_write_behind: int = 0, session_journal_fsync: bool = False,
                   session_retention_ms: str | int = 7 * 24 * 3600 * 1000,
                   session_retention_bytes: str | int = DEFAULT_SESSION_RETENTION_BYTES,
                   session_lease_ttl_ms: str | int = 8000,
                   session_lease_renew_ms: str | int = 2000,
                   advertise_url: str | None = None,
                   **option_flags: str | None) -> Settings:
        """Build from CLI strings. ``token=None`` falls back to ``$ACP_SERVER_TOKEN``;
        ``agent`` is one ``--agent`` value or all of them (``NAME=COMMAND`` adds a
        named agent, a bare command sets the default)."""
        try:
            default, named = parse_agent_flags([agent] if isinstance(agent, str) else agent)
            if config is not None:
                named += load_config(config)
        except ProfileError as exc:
            raise SettingsError(str(exc)) from None
        parsed_port = parse_number(port) if isinstance(port, str) else port
        if isinstance(parsed_port, float) or isinstance(parsed_port, str):
            raise SettingsError(f"Invalid port: {port!r}. Must be an integer in [0, 65535].")
        source = "--token"
        if token is None:
            token, source = os.environ.get(TOKEN_ENV), TOKEN_ENV
        token = token.strip() if token is not None else None
        if token == "" and source == "--token":   # never a silent "auth off"
            raise SettingsError("Invalid token: --token is empty or blank. Pass a token, "
                                f"or leave --token out (and {TOKEN_ENV} unset) for none.")
        if token == "":
            raise SettingsError(f"Invalid token: {TOKEN_ENV} is set but empty or blank. "
                                "Set a token, or unset it for none.")
        return cls(model_history_chars=_number(model_history_chars),
                   model_api_key=_model_api_key(model_api_key_env),
                   workspace=workspace or os.getcwd(), hostname=hostname, port=parsed_port,
                   token=token or None, require_auth=require_auth,
                   allow_origins=tuple(allow_origin),
                   agent=shlex.join(default.command) if default.command else REFERENCE_AGENT,
                   agent_profiles=tuple(named), model_server=model_server,
                   model_refresh_ms=_number(model_refresh_ms),
                   state_dir=os.path.abspath(state_dir) if state_dir else "",
                   max_acp_connections=parse_number(max_acp_connections)
                   if isinstance(max_acp_connections, str) else max_acp_connections,
                   store=store, max_running_tasks=parse_number(max_running_tasks)
                   if isinstance(max_running_tasks, str) else max_running_tasks,
                   web=web, log_format=log_format,
                   header_timeout_ms=parse_number(header_timeout_ms)
                   if isinstance(header_timeout_ms, str) else header_timeout_ms,
                   max_connections=parse_number(max_connections)
                   if isinstance(max_connections, str) else max_connections,
                   lmsp_permissions=lmsp_permissions, http=http or HttpOptions(),
                   store_lease_ms=_number(store_lease_ms), store_renew_ms=_number(store_renew_ms),
                   store_poll_ms=_number(store_poll_ms),
                   store_busy_timeout_ms=_number(store_busy_timeout_ms),
                   share_sessions=share_sessions, audit_prompts=audit_prompts,
                   audit_retention_s=_retention(audit_retention),
                   rate_limit_prompt=_number(rate_limit_prompt),
                   rate_limit_mutation=_number(rate_limit_mutation),
                   rate_limit_read=_number(rate_limit_read),
                   session_journal=session_journal, session_on_restart=session_on_restart,
                   session_write_behind=session_write_behind,
                   session_journal_fsync=session_journal_fsync,
                   session_retention_ms=_number(session_retention_ms),
                   session_retention_bytes=_number(session_retention_bytes),
                   session_lease_ttl_ms=_number(session_lease_ttl_ms),
                   session_lease_renew_ms=_number(session_lease_renew_ms),
                   advertise_url=advertise_url.rstrip("/") if advertise_url else None,
                   options=build_options(**option_flags))


def _model_server_state() -> Any:
    from bridge.agents.model import ModelServerState

    return ModelServerState()


def _model_api_key(env: str | None) -> str | None:
    """The model server's API key: from ``$env`` (``--model-api-key-env``), which must
    then be set, else from ``$ACP_SERVER_MODEL_API_KEY`` if set."""
    from acp_server.bearer import BLANKS, unsendable

    if env is None:
        key: str | None = os.environ.get(MODEL_API_KEY_ENV, "").strip(BLANKS) or None
        source = MODEL_API_KEY_ENV
    else:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", env):
            raise SettingsError("Invalid model-api-key-env: name an environment variable "
                                "(e.g. OPENAI_API_KEY), not the key itself (not repeated "
                                "here).")
        key, source = os.environ.get(env, "").strip(BLANKS), env
        if not key:
            raise SettingsError(f"Invalid model-api-key-env: {env} is not set or empty. "
                                f"Set it to the model server's API key.")
    why = None if key is None else unsendable(key)
    if why is not None:   # sent, httpx's refusal would quote it (logs, turn errors)
        raise SettingsError(f"Invalid model API key: ${source} {why}: no Authorization "
                            f"header can carry it (the key itself is not shown).")
    return key


def _number(value: str | int) -> Any:
    return parse_number(value) if isinstance(value, str) else value


def _retention(value: str | float | None) -> float:
    """``--audit-retention``: a duration (``30d``, ``12h``, seconds); ``0`` = forever."""
    if value is None:
        return DEFAULT_AUDIT_RETENTION_S
    if isinstance(value, int | float) or str(value).strip() == "0":
        return float(value)
    try:
        return parse_duration(value)
    except InvalidPrincipalError:
        raise SettingsError(f"Invalid audit-retention: {value!r}. Use a duration such as "
                            "30d, 12h or seconds; 0 keeps the log forever.") from None


def build_options(**flags: str | None) -> BridgeOptions:
    """``BridgeOptions`` from CLI strings (``None`` = the bridge default)."""
    kwargs: dict[str, Any] = {}
    for flag, value in flags.items():
        if flag not in OPTION_FLAGS:
            raise TypeError(f"unknown option flag {flag!r}")
        if value is not None:
            kwargs[OPTION_FLAGS[flag]] = parse_number(value) if isinstance(value, str) else value
    try:
        return BridgeOptions(**kwargs)
    except InvalidOptionError as exc:
        raise SettingsError(str(exc)) from None
