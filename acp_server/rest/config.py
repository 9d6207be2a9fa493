"""What the REST door needs of the server's settings, handed to it when it is composed.

    routes = rest.routes(bridge, RestConfig(max_body_bytes=1 << 20, heartbeat_s=15.0,
                                            agent_name="reference"))

Contracts: the door reads this and nothing of ``acp_server.settings``; the composition
(``acp_server.server``) builds it from the ``Settings``.
The security fields are reported by ``/daemon/status`` and ``/capabilities`` only:
the guard itself (``acp_server.http.policy``) enforces them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from acp_server.http.guard import GuardStats
from acp_server.rest.budget import BodyBudget


@dataclass(frozen=True, slots=True)
class RestConfig:
    max_body_bytes: int
    heartbeat_s: float
    agent_name: str
    token_configured: bool = False
    require_auth: bool = False
    loopback_bind: bool = True
    allow_origins: tuple[str, ...] = ()
    header_timeout_ms: int = 10_000
    max_connections: int = 2560
    prompt_deadline_ms: int | None = None
    # The connection guard's counters (acp_server/http/guard.py), when one runs.
    guard_stats: GuardStats | None = None
    # The bytes of ``/load`` answers in flight (``acp_server.rest.budget``), per server.
    large_answers: BodyBudget = field(default_factory=BodyBudget)
