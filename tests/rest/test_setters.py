"""qwen's session setters over real HTTP (``acp_server.rest.setters``): approval mode,
model and config option on the session's agent, their answers and their errors."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from bridge.agents.reference import ReferenceAgentFactory
from bridge.errors import AgentDiedError, AgentError
from tests.rest.server import RunningServer, running_server

pytestmark = pytest.mark.anyio

MODES = ["default", "plan", "auto-edit", "yolo"]   # the reference agent's


async def _post(server: RunningServer, sid: str, route: str, body: Any,
                **headers: str) -> tuple[int, Any]:
    answer = await server.client.post(f"/session/{sid}/{route}", json=body, headers=headers)
    return answer.status_code, answer.json()


async def test_approval_mode_sets_the_agents_mode(server: RunningServer) -> None:
    """``session/set_mode`` with qwen's answer: ``previous`` the mode before; the
    agent's ``current_mode_update`` reaches the stream."""
    sid = (await server.create_session())["sessionId"]
    assert await _post(server, sid, "approval-mode", {"mode": "plan"}) == (200, {
        "sessionId": sid, "mode": "plan", "previous": "default", "persisted": False})
    assert await _post(server, sid, "approval-mode",
                       {"mode": "auto-edit", "persist": True, "planMode": False}) == (200, {
        "sessionId": sid, "mode": "auto-edit", "previous": "plan", "persisted": False})
    frames = await server.events_until(sid, lambda kind, data: kind == "session_update" and
                                       data["data"]["update"].get("currentModeId") == "auto-edit",
                                       last_event_id=0)
    modes = [data["data"]["update"]["currentModeId"] for kind, data in frames
             if data["data"].get("update", {}).get("sessionUpdate") == "current_mode_update"]
    assert modes == ["plan", "auto-edit"]


async def test_approval_modes_at_once_chain(server: RunningServer) -> None:
    """Modes set at once are set one at a time: each ``previous`` is the mode the other
    left (never both ``default``), as qwen queues them."""
    sid = (await server.create_session())["sessionId"]
    answers: dict[str, Any] = {}

    async def one(mode: str) -> None:
        answers[mode] = await _post(server, sid, "approval-mode", {"mode": mode})

    async with anyio.create_task_group() as tg:
        for mode in ("plan", "yolo", "auto-edit"):
            tg.start_soon(one, mode)
    chain = {body["previous"]: body["mode"] for _status, body in answers.values()}
    assert len(chain) == 3 and "default" in chain
    mode, seen = "default", []
    while mode in chain:
        mode = chain[mode]
        seen.append(mode)
    assert sorted(seen) == ["auto-edit", "plan", "yolo"]


async def test_approval_mode_errors(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    for mode in ("auto", "x", 3, None):   # ``auto``: qwen's, which this agent lacks
        assert await _post(server, sid, "approval-mode", {"mode": mode}) == (400, {
            "error": "`mode` is required and must be one of the allowed values (the modes "
                     "the session's agent offers)",
            "code": "invalid_approval_mode", "allowed": MODES})
    status, body = await _post(server, sid, "approval-mode", {"mode": "plan", "persist": 1})
    assert (status, body["code"]) == (400, "invalid_persist_flag")
    for bad in ({"mode": "plan", "planMode": True}, {"mode": "yolo", "planMode": "no"}):
        status, body = await _post(server, sid, "approval-mode", bad)
        assert (status, body["code"]) == (400, "invalid_plan_mode")
    status, body = await _post(server, sid, "approval-mode", {"mode": "plan"},
                               **{"X-Qwen-Client-Id": "no spaces"})
    assert (status, body["code"]) == (400, "invalid_client_id")
    unknown = str(uuid.uuid4())
    for route, body in (("approval-mode", {"mode": "plan"}), ("model", {"modelId": "m"}),
                        ("config-option", {"configId": "reasoning_effort", "value": "high"})):
        status, answer = await _post(server, unknown, route, body)
        assert (status, answer["code"]) == (404, "session_not_found")
    # nothing was changed by the refusals
    assert (await _post(server, sid, "approval-mode", {"mode": "yolo"}))[1]["previous"] == \
        "default"


async def test_a_mode_or_model_under_a_client_id_not_issued_is_refused(
        server: RunningServer) -> None:
    """qwen's mode and model setters take only a client id the session issued (its
    ``resolveTrustedClientId``: 400 ``invalid_client_id``, nothing asked of the agent);
    its config-option setter checks only the form. An issued one is the events'
    ``originatorClientId``."""
    made = await server.create_session()
    sid, issued = made["sessionId"], made["clientId"]
    stranger = {"X-Qwen-Client-Id": "client_00000000-0000-4000-8000-000000000000"}
    for route, body in (("approval-mode", {"mode": "plan"}),
                        ("model", {"modelId": "reference-large"})):
        status, answer = await _post(server, sid, route, body, **stranger)
        assert (status, answer["code"], answer["clientId"]) == \
            (400, "invalid_client_id", stranger["X-Qwen-Client-Id"]), route
    status, _ = await _post(server, sid, "config-option",
                            {"configId": "reasoning_effort", "value": "high"}, **stranger)
    assert status == 200
    state = (await server.client.post(f"/session/{sid}/approval-mode", json={"mode": "yolo"},
                                      headers={"X-Qwen-Client-Id": issued})).json()
    assert state["previous"] == "default"   # the refused one changed nothing
    frames = await server.events_until(sid, lambda kind, data: kind == "approval_mode_changed",
                                       last_event_id=0)
    changed = [data for kind, data in frames if kind == "approval_mode_changed"]
    assert [(d["data"]["next"], d["originatorClientId"]) for d in changed] == \
        [("yolo", issued)]


async def test_model_and_config_option(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    assert await _post(server, sid, "model", {"modelId": "reference-large"}) == (200, {})
    status, body = await _post(server, sid, "config-option",
                               {"configId": "reasoning_effort", "value": "high"})
    assert (status, body["persisted"]) == (200, False)
    assert [o["currentValue"] for o in body["configOptions"]] == ["high"]
    # the agent refusing a value: 400 with its message
    assert await _post(server, sid, "model", {"modelId": "gpt-9"}) == (400, {
        "error": 'Unknown model "gpt-9"', "code": "agent_refused", "rpcCode": -32602,
        "data": {"modelId": "gpt-9"}})
    status, body = await _post(server, sid, "config-option",
                               {"configId": "reasoning_effort", "value": "extreme"})
    assert (status, body["code"], body["rpcCode"]) == (400, "agent_refused", -32602)
    # qwen's checks of the body
    for bad in ({}, {"modelId": ""}, {"modelId": 7}):
        assert await _post(server, sid, "model", bad) == (
            400, {"error": "`modelId` is required and must be a non-empty string"})
    for bad, message in (({"value": "high"}, "`configId` is required and must be a "
                                             "non-empty string"),
                         ({"configId": "reasoning_effort", "value": ""},
                          "`value` is required and must be a non-empty string"),
                         ({"configId": "reasoning_effort", "value": "high", "persist": "y"},
                          "`persist` must be a boolean when provided")):
        assert await _post(server, sid, "config-option", bad) == (400, {"error": message})


class _Refusing:
    """The reference agent, whose setters fail as ``failure`` says."""

    name = "reference"

    def __init__(self, failure: BaseException) -> None:
        self.inner = ReferenceAgentFactory()
        self.failure = failure

    async def connect(self, client: Any, task_group: anyio.abc.TaskGroup) -> Any:
        inner = await self.inner.connect(client, task_group)
        failure = self.failure

        class Connection:
            closed = property(lambda self: inner.closed)

            async def request(self, method: str, params: Any) -> Any:
                if method.startswith("session/set_"):
                    raise failure
                return await inner.request(method, params)

            async def notify(self, method: str, params: Any) -> None:
                await inner.notify(method, params)

            async def aclose(self) -> None:
                await inner.aclose()

        return Connection()


@pytest.mark.parametrize(("failure", "status", "code"), [
    (AgentError(-32601, "Method not found"), 409, "agent_refused"),
    (AgentError(-32603, "Internal error"), 409, "agent_refused"),
    (AgentDiedError("Agent process exited", exit_code=3), 503, "agent_died"),
])
async def test_the_agent_failing(tmp_path: Path, failure: BaseException, status: int,
                                 code: str) -> None:
    """An agent's other errors are 409 ``agent_refused`` with its message; one that
    died is 503 ``agent_died`` with ``Retry-After``, as on every route."""
    async with running_server(tmp_path, agent_factory=_Refusing(failure)) as srv:
        sid = (await srv.create_session())["sessionId"]
        for route, body in (("approval-mode", {"mode": "plan"}),
                            ("model", {"modelId": "reference-large"}),
                            ("config-option", {"configId": "reasoning_effort", "value": "low"})):
            answer = await srv.client.post(f"/session/{sid}/{route}", json=body)
            assert (answer.status_code, answer.json()["code"]) == (status, code), route
            if status == 409:
                assert answer.json()["error"] == str(failure)
            else:
                assert answer.headers["Retry-After"] == "5"


class _Wrapped:
    """The reference agent, each request going through ``ask(inner, method, params)``
    first (a subclass's): a test's agent that answers some requests its own way."""

    name = "reference"

    def __init__(self) -> None:
        self.inner = ReferenceAgentFactory()

    async def ask(self, inner: Any, method: str, params: Any) -> Any:
        return await inner.request(method, params)

    async def connect(self, client: Any, task_group: anyio.abc.TaskGroup) -> Any:
        inner, ask = await self.inner.connect(client, task_group), self.ask

        class Connection:
            closed = property(lambda self: inner.closed)

            async def request(self, method: str, params: Any) -> Any:
                return await ask(inner, method, params)

            async def notify(self, method: str, params: Any) -> None:
                await inner.notify(method, params)

            async def aclose(self) -> None:
                await inner.aclose()

        return Connection()


class _OptionsOnly(_Wrapped):
    """An agent whose model and effort are config options (``model``, ``effort``):
    no ``models``; it records the setters it is sent and answers its options."""

    OPTIONS = [{"id": "model", "category": "model", "type": "select", "currentValue": "a"},
               {"id": "effort", "category": "thought_level", "type": "select",
                "currentValue": "low"}]

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, Any]] = []

    async def ask(self, inner: Any, method: str, params: Any) -> Any:
        if method.startswith("session/set_"):
            self.sent.append((method, params))
            return {"configOptions": self.OPTIONS}
        answer = await inner.request(method, params)
        if method == "session/new":
            return {"sessionId": answer["sessionId"], "configOptions": self.OPTIONS}
        return answer


async def test_model_and_effort_as_config_options(tmp_path: Path) -> None:
    """An agent with no ``models`` but a ``model`` option: ``/model`` sets that option;
    qwen's ``reasoning_effort`` names the agent's one ``thought_level`` option."""
    agent = _OptionsOnly()
    async with running_server(tmp_path, agent_factory=agent) as srv:
        sid = (await srv.create_session())["sessionId"]
        assert (await srv.client.post(f"/session/{sid}/model", json={"modelId": "b"})
                ).status_code == 200
        effort = await srv.client.post(f"/session/{sid}/config-option",
                                       json={"configId": "reasoning_effort", "value": "high"})
        assert effort.status_code == 200, effort.text
        modes = await srv.client.post(f"/session/{sid}/approval-mode", json={"mode": "plan"})
        assert (modes.status_code, modes.json()["allowed"]) == (400, [])   # no modes
    assert agent.sent == [
        ("session/set_config_option", {"configId": "model", "value": "b", "sessionId": sid}),
        ("session/set_config_option", {"configId": "effort", "value": "high",
                                       "sessionId": sid})]


class _Silent(_Wrapped):
    """The reference agent, whose first setter is never answered (the rest are)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    async def ask(self, inner: Any, method: str, params: Any) -> Any:
        if method.startswith("session/set_"):
            self.asked += 1
            if self.asked == 1:
                await anyio.sleep_forever()
        return await inner.request(method, params)


async def test_a_setter_the_agent_does_not_answer(tmp_path: Path) -> None:
    """A setter has the agent requests' deadline (``--agent-request-timeout-ms``): 504
    ``agent_request_timeout``, as docs/rest.md says, and the session's next setter is
    not held behind it (it waited for ever, holding the setter lock). The short
    deadline is the bridge's only for the setter that meets it: ``session/new`` and
    the next setter have it too, and a loaded machine may stall the process for 300 ms
    while the agent answers them."""
    async with running_server(tmp_path, agent_factory=_Silent(), timeout=20) as srv:
        sid = (await srv.create_session())["sessionId"]
        patient = srv.bridge.options
        srv.bridge.options = dataclasses.replace(patient, agent_request_timeout_ms=300)
        with anyio.fail_after(15):
            status, body = await _post(srv, sid, "approval-mode", {"mode": "plan"})
        assert (status, body["code"], body["timeoutMs"]) == (504, "agent_request_timeout", 300)
        srv.bridge.options = patient
        with anyio.fail_after(15):
            assert await _post(srv, sid, "approval-mode", {"mode": "yolo"}) == (200, {
                "sessionId": sid, "mode": "yolo", "previous": "default", "persisted": False})
