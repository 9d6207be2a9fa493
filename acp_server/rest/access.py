"""What each REST request needs of its principal: a scope and a rate-limit class.

    access("POST", "/session/3c0f…/prompt")    # PROMPTING: scope prompt, class prompt
    access("GET", "/session/3c0f…/events")     # READING: scope read, class read

The front layer (``acp_server.http.front``) applies it before the route runs (403
``forbidden`` / 429 ``rate_limit_exceeded``), on the path the router matches
(``canonical_path``); ownership (404 for another principal's session) is the routes'
own check. A rule reads the path's shape, never a parameter's value: a route's
template path and every path it matches get the same access (property-tested). The rules (``docs/security.md``):

* ``/health`` and heartbeats need nothing and are not counted (as the peer);
  ``/capabilities``, ``/daemon/status``, ``/whoami`` and ``/openapi.json`` any credential (class
  read); ``/metrics`` (when it needs a credential at all), ``/tokens`` and ``/audit``
  the ``admin`` scope.
* A prompt (``POST /session/{id}/prompt``) needs ``prompt`` and counts as a prompt;
  every other POST, DELETE or PATCH needs ``prompt`` and counts as a mutation (create,
  load, resume, branch, cancel, close, permission answers, dropping a queued prompt).
* Every other GET or HEAD needs ``read`` (status, pending prompts, event streams,
  the workspace's sessions).
"""

from __future__ import annotations

from acp_server.principals.model import (ADMIN_READ, ADMIN_WRITE, INFO, MUTATING, OPEN,
                                         PROMPTING, READING, Access)

INFO_PATHS = frozenset({"/capabilities", "/daemon/status", "/openapi.json", "/whoami"})
ADMIN_PREFIXES = ("/tokens", "/audit", "/metrics")


def _admin(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in ADMIN_PREFIXES)


def access(method: str, path: str) -> Access:
    if path == "/health":
        return OPEN
    if method in ("GET", "HEAD"):
        if path in INFO_PATHS:
            return INFO
        return ADMIN_READ if _admin(path) else READING
    # ``/session/{id}/prompt`` and ``/session/{id}/heartbeat`` by shape: three segments
    # (``/session/x/permission/prompt`` answers a permission, a mutation)
    if method == "POST" and path.startswith("/session/") and path.count("/") == 3:
        if path.endswith("/prompt"):
            return PROMPTING
        if path.endswith("/heartbeat"):
            return OPEN
    if method == "OPTIONS":
        return OPEN
    return ADMIN_WRITE if _admin(path) else MUTATING


__all__ = ["access"]
