"""qwen serve 0.24.4's session setters, on the session's ACP agent: its approval mode,
its model, a config option.

    $ curl -s -X POST localhost:4170/session/$SID/approval-mode -d '{"mode":"plan"}'
    {"sessionId":"3c0f…","mode":"plan","previous":"default","persisted":false}
    $ curl -s -X POST localhost:4170/session/$SID/model -d '{"modelId":"reference-large"}'
    {}
    $ curl -s -X POST localhost:4170/session/$SID/config-option \\
           -d '{"configId":"reasoning_effort","value":"high"}'
    {"configOptions":[{"id":"reasoning_effort",…,"currentValue":"high"}],"persisted":false}

Contracts (``docs/rest.md``):

* Checked as qwen checks them, in its order: the session (another principal's, or
  unknown: 404 ``session_not_found``; a session restored after a restart is restored on
  its agent first), the body, the client id (for a mode or a model one the session
  issued, else 400 ``invalid_client_id``; for an option only its form, as qwen's). ``persist`` must be a boolean when given
  (approval mode: 400 ``invalid_persist_flag``), ``planMode`` a boolean with a mode
  other than ``plan`` (400 ``invalid_plan_mode``); both are then not used: nothing is
  written to settings, so ``persisted`` is always ``false``.
* ``approval-mode`` is ``session/set_mode`` with ``mode`` as the mode id. qwen's mode
  names are ``qwen --acp``'s ids; any agent's mode is one it advertises (its
  ``modes.availableModes``): another (or a mode that is not a string) is qwen's 400
  ``invalid_approval_mode`` with ``allowed``, the session's agent's ids (``[]`` for an
  agent with no modes), and the agent is not asked. ``previous`` is the agent's current
  mode as last known (its session answer, the modes set through either door, the
  agent's own reports: ``bridge.agent_state``); setters run one at a time per session.
* ``model`` is ``session/set_model`` when the agent advertises ``models``, else
  ``session/set_config_option`` on its option of category ``model`` when it has one
  (else ``session/set_model`` all the same); the answer is the agent's, as qwen's.
* ``config-option`` is ``session/set_config_option``; a ``configId`` the agent does not
  have but qwen sends (``reasoning_effort``) names the agent's one ``thought_level``
  option when it has exactly one. The answer is ``{configOptions, persisted}``.
* The agent refusing (a JSON-RPC error answer) is 400 ``agent_refused`` when it called
  the parameters invalid (-32602), else 409 ``agent_refused``, with its message and
  ``rpcCode`` (and its ``data``, bounded by the bridge: ``bridge.setting_changes.refused``);
  an agent that died or did not answer is answered as
  on every route (503 ``agent_died``, 504 ``agent_timeout``).
* What the agent reports afterwards (``current_mode_update``, ``config_option_update``)
  reaches the session's event stream as any ``session/update``; the bridge publishes
  qwen's own events for a mode and a model (``approval_mode_changed``,
  ``model_switched``, ``model_switch_failed``: ``bridge.setting_changes``), with the
  ``X-Qwen-Client-Id`` as their ``originatorClientId`` when the session issued it.
* A setter the agent accepted is in the audit log: ``setting.changed`` with the
  setting, its value before (as last known) and after.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from acp_server.http.endpoints import route
from acp_server.rest import wire
from acp_server.rest.config import RestConfig
from acp_server.rest.errors import RestError, bad_request, json_response
from acp_server.principals import caller_of
from acp_server.rest.owners import owned
from bridge import Bridge
from bridge.errors import AgentError
from bridge.agent_calls import SetResult

INVALID_PARAMS = -32602   # JSON-RPC's: the agent called the value invalid
MAX_MESSAGE = 1000        # characters of the agent's message in an answer


async def _set(request: Request, bridge: Bridge, session_id: str, method: str,
               params: dict[str, Any], client_id: str | None) -> SetResult:
    """The setter on the agent (its JSON-RPC error is the door's ``agent_refused``),
    recorded in the audit log once accepted; the agent's answer and what it changed."""
    try:
        result = await bridge.set_setting(session_id, method,
                                          {**params, "sessionId": session_id},
                                          client_id=client_id)
    except AgentError as exc:
        body: dict[str, Any] = {"error": str(exc.message)[:MAX_MESSAGE] or "Refused by the agent",
                                "code": "agent_refused", "rpcCode": exc.rpc_code}
        if exc.data is not None:
            body["data"] = exc.data
        raise RestError(400 if exc.rpc_code == INVALID_PARAMS else 409, body) from None
    change = result.change
    if change is not None:
        caller_of(request.scope).setting_changed(session_id, change.setting, change.old,
                                                 change.new, "rest")
    return result


def _trusted(bridge: Bridge, session_id: str, request: Request) -> str | None:
    """``X-Qwen-Client-Id``, which must be one the session issued (400
    ``invalid_client_id`` otherwise, the agent not asked), as qwen's mode and model
    setters check it (``resolveTrustedClientId``)."""
    client_id = wire.client_id(request)
    if client_id is not None:
        bridge.check_client(session_id, client_id)
    return client_id


def _mode_ids(state: dict[str, Any]) -> list[str]:
    modes = state.get("modes")
    available = modes.get("availableModes") if isinstance(modes, dict) else None
    if not isinstance(available, list):
        return []
    return [m["id"] for m in available if isinstance(m, dict) and isinstance(m.get("id"), str)]


def _options(state: dict[str, Any]) -> list[dict[str, Any]]:
    options = state.get("configOptions")
    return [o for o in options if isinstance(o, dict)] if isinstance(options, list) else []


async def set_approval_mode(request: Request, *, bridge: Bridge, config: RestConfig) -> Response:
    session_id = request.path_params["session_id"]
    state = await bridge.agent_state(session_id)   # 404 first, as qwen's
    body = await wire.read_json(request, wire.ApprovalModeBody, limit=config.max_body_bytes)
    allowed = _mode_ids(state)
    if not isinstance(body.mode, str) or body.mode not in allowed:
        raise bad_request("`mode` is required and must be one of the allowed values "
                          "(the modes the session's agent offers)", "invalid_approval_mode",
                          allowed=allowed)
    if body.persist is not wire.UNSET and not isinstance(body.persist, bool):
        raise bad_request("`persist` must be a boolean when provided", "invalid_persist_flag")
    if body.planMode is not wire.UNSET and (not isinstance(body.planMode, bool)
                                            or body.mode == "plan"):
        raise bad_request("`planMode` must be a boolean with a non-plan execution mode",
                          "invalid_plan_mode")
    client_id = _trusted(bridge, session_id, request)
    change = (await _set(request, bridge, session_id, "session/set_mode",
                         {"modeId": body.mode}, client_id)).change
    previous = change.old if change is not None else None
    return json_response(200, wire.ApprovalModeSet(
        sessionId=session_id, mode=body.mode,
        previous=previous if isinstance(previous, str) else body.mode, persisted=False))


async def set_model(request: Request, *, bridge: Bridge, config: RestConfig) -> Response:
    session_id = request.path_params["session_id"]
    state = await bridge.agent_state(session_id)
    body = await wire.read_json(request, wire.ModelBody, limit=config.max_body_bytes)
    if not isinstance(body.modelId, str) or not body.modelId:
        raise bad_request("`modelId` is required and must be a non-empty string")
    client_id = _trusted(bridge, session_id, request)
    by_option = [o for o in _options(state) if o.get("category") == "model"]
    if not isinstance(state.get("models"), dict) and by_option:
        answer = (await _set(request, bridge, session_id, "session/set_config_option",
                             {"configId": by_option[0].get("id"), "value": body.modelId},
                             client_id)).answer
    else:
        answer = (await _set(request, bridge, session_id, "session/set_model",
                             {"modelId": body.modelId}, client_id)).answer
    return json_response(200, answer if isinstance(answer, dict) else {})


async def set_config_option(request: Request, *, bridge: Bridge, config: RestConfig) -> Response:
    session_id = request.path_params["session_id"]
    state = await bridge.agent_state(session_id)
    body = await wire.read_json(request, wire.ConfigOptionBody, limit=config.max_body_bytes)
    if not isinstance(body.configId, str) or not body.configId:
        raise bad_request("`configId` is required and must be a non-empty string")
    if not (isinstance(body.value, bool) or isinstance(body.value, str) and body.value):
        raise bad_request("`value` is required and must be a non-empty string")
    if body.persist is not wire.UNSET and not isinstance(body.persist, bool):
        raise bad_request("`persist` must be a boolean when provided")
    client_id = wire.client_id(request)
    options = _options(state)
    config_id = body.configId
    thought = [o.get("id") for o in options if o.get("category") == "thought_level"]
    if config_id == "reasoning_effort" and len(thought) == 1 and \
            all(o.get("id") != config_id for o in options):
        config_id = thought[0]
    answer = (await _set(request, bridge, session_id, "session/set_config_option",
                         {"configId": config_id, "value": body.value}, client_id)).answer
    after = answer.get("configOptions") if isinstance(answer, dict) else None
    return json_response(200, wire.ConfigOptionSet(
        configOptions=after if isinstance(after, list) else
        _options(await bridge.agent_state(session_id)), persisted=False))


def routes(bridge: Bridge, config: RestConfig) -> list[BaseRoute]:
    deps = {"bridge": bridge, "config": config}
    return [
        route("/session/{session_id}/approval-mode", owned(set_approval_mode), ["POST"], **deps),
        route("/session/{session_id}/model", owned(set_model), ["POST"], **deps),
        route("/session/{session_id}/config-option", owned(set_config_option), ["POST"], **deps),
    ]
