"""What the ``/acp`` door needs of the server's settings, handed to it when composed.

    config = AcpConfig(max_body_bytes=1 << 20, heartbeat_s=15.0,
                       guard=GuardPolicy(token="s3cret"))
    routes = acp_http.routes(registry, config)

Contracts: the door reads this and nothing of ``acp_server.settings``; the composition
(``acp_server.server``) builds it from the ``Settings`` (and the registry from its
``max_connections`` and ``reap_grace_s``).
``guard`` is the same policy the HTTP guard enforces; the WebSocket handshake, which
the front layer leaves to this door, checks it here (``websocket.handshake_refusal``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from acp_server.acp_http.registry import (DEFAULT_GRACE_S, DEFAULT_MAX_CONNECTIONS,
                                          DEFAULT_RESUME_GRACE_S)
from acp_server.http.policy import GuardPolicy


@dataclass(frozen=True, slots=True)
class AcpConfig:
    max_body_bytes: int   # an HTTP body and a WebSocket text frame (else 413 / close 1009)
    heartbeat_s: float    # SSE keep-alive after this much silence
    guard: GuardPolicy = field(default_factory=GuardPolicy)
    max_connections: int = DEFAULT_MAX_CONNECTIONS   # live connections (initialize past it: 503)
    reap_grace_s: float = DEFAULT_GRACE_S            # streams gone this long: connection reaped
    # a lost resumable connection's permission requests wait this long for it to return
    resume_grace_s: float = DEFAULT_RESUME_GRACE_S
