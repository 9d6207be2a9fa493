"""What the ``/acp`` door needs of the server's settings, handed to it when composed.

    app.state.acp_config = AcpConfig(max_body_bytes=1 << 20, heartbeat_s=15.0,
                                     guard=GuardPolicy(token="s3cret"))

Contracts: the door reads ``app.state.acp_config`` and nothing of
``acp_server.settings``; ``acp_server.app.build_app`` fills it from the ``Settings``.
``guard`` is the same policy the HTTP guard enforces; the WebSocket handshake, which
the front layer leaves to this door, checks it here (``websocket.handshake_refusal``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from acp_server.acp_http.registry import DEFAULT_GRACE_S, DEFAULT_MAX_CONNECTIONS
from acp_server.http.policy import GuardPolicy


@dataclass(frozen=True, slots=True)
class AcpConfig:
    max_body_bytes: int   # an HTTP body and a WebSocket text frame (else 413 / close 1009)
    heartbeat_s: float    # SSE keep-alive after this much silence
    guard: GuardPolicy = field(default_factory=GuardPolicy)
    max_connections: int = DEFAULT_MAX_CONNECTIONS   # live connections (initialize past it: 503)
    reap_grace_s: float = DEFAULT_GRACE_S            # streams gone this long: connection reaped
