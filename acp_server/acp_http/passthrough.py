"""Methods that are neither ours nor handled by ``/acp``: to the session's agent when
it advertises them, else ``-32601``.

    if advertised(bridge.agent_info(agent_name), "_zed.dev/buffers"): ...
    result = await pass_through(conn, method, params, is_request=True)

Contracts:

* A method is advertised by an agent (its ``initialize`` result) when it is a known
  method of the unstable schema whose capability the agent offers (``KNOWN_GATES``:
  ``providers/*``, ``nes/*``, ``document/*``, ``mcp/*``); or an extension whose
  namespace is a truthy key of ``agentCapabilities._meta`` (``_zed.dev/x`` →
  ``"zed.dev"``, as the spec's extensibility page advertises them); or whose exact
  name appears in a list under the result's or the capabilities' ``_meta`` (as qwen
  lists its methods in ``_meta.qwen.methods``).
* Only session-scoped traffic (``params.sessionId`` of a live session) is passed:
  the default agent serves every client, so a method without a session is ours or
  unknown. The request and its answer pass unchanged; an unknown or unadvertised
  request raises ``MethodNotFoundError`` (a notification is then dropped).
"""

from __future__ import annotations

from typing import Any

from acp_server.acp_http.connection import AcpConnection
from acp_server.acp_http.errors import MethodNotFoundError

KNOWN_GATES: dict[str, tuple[str, ...]] = {
    "providers/": ("providers",), "nes/": ("nes",), "document/": ("nes",),
    "mcp/": ("mcpCapabilities", "acp"),
}
MAX_DEPTH = 4


def advertised(info: dict[str, Any], method: str) -> bool:
    """Does an agent (its ``initialize`` result) advertise ``method``?"""
    caps = info.get("agentCapabilities")
    caps = caps if isinstance(caps, dict) else {}
    for prefix, path in KNOWN_GATES.items():
        if method.startswith(prefix):
            value: Any = caps
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            return value is not None and value is not False
    meta = caps.get("_meta")
    namespace = method.lstrip("_").split("/", 1)[0]
    if isinstance(meta, dict) and namespace and meta.get(namespace):
        return True
    return _lists(info.get("_meta"), method) or _lists(meta, method)


def _lists(value: Any, name: str, depth: int = MAX_DEPTH) -> bool:
    if isinstance(value, list):
        return name in value
    if isinstance(value, dict) and depth > 0:
        return any(_lists(v, name, depth - 1) for v in value.values())
    return False


async def pass_through(conn: AcpConnection, method: str, params: dict[str, Any],
                       is_request: bool) -> Any:
    sid = params.get("sessionId")
    bridge = conn.bridge
    if not isinstance(sid, str) or not bridge.has_session(sid) \
            or not advertised(bridge.agent_info(bridge.session_status(sid).agent), method):
        raise MethodNotFoundError(method)
    if is_request:
        return await bridge.forward(sid, method, params)
    await bridge.forward_notification(sid, method, params)
    return None
