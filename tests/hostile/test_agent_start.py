"""Agents that cannot start, or cannot speak ACP, against a real ``acp-server serve``
(``docs/operations.md``, "Faults of the machine"; ``docs/agents.md``).

Real programs as the agents: ``sh -c '…; exit 3'`` (exits at once, a line on stderr),
``cat`` (echoes what it gets: its ``initialize`` is answered with our own "method not
found" echoed back), ``sh -c 'echo …'`` (prints a line that is no JSON-RPC and exits),
and a ``sh`` script that answers ``initialize`` with a string. Whatever the program,
a new session is a 503 ``agent_unavailable`` (``reason: initialize_failed``) with
``Retry-After: 5`` and a message naming the agent and what it said, in REST; the same
code as a JSON-RPC error with ``data.errorKind`` on ``/acp``; an LMSP task for it fails
with it; the server and its other agents go on.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import httpx
import pytest

from tests.harness import ServeProcess
from tests.hostile.test_machine_faults import acp_session_new, lmsp_outcome

pytestmark = pytest.mark.anyio

QUITTER = "sh -c 'echo no model configured >&2; exit 3'"
CHATTY = "sh -c 'echo Hello, I am not an ACP agent'"
# Answers our first request (id 0: ``initialize``) with a string, then reads on.
STRING = ("sh -c 'read line; echo \"{\\\"jsonrpc\\\":\\\"2.0\\\",\\\"id\\\":0,"
          "\\\"result\\\":\\\"hello\\\"}\"; exec cat >/dev/null'")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only; the server is its own process


def refused(response: httpx.Response, agent: str) -> str:
    """The REST answer is the 503 of an agent that did not start: its message."""
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "5"
    body = response.json()
    assert (body["code"], body["agent"], body["reason"]) == (
        "agent_unavailable", agent, "initialize_failed"), body
    assert body["error"].startswith(f"Agent {agent!r} did not complete ACP initialize: ")
    assert len(body["error"]) <= 800
    return body["error"]  # type: ignore[no-any-return]


async def test_an_agent_that_exits_at_once_is_503_in_each_door(tmp_path: Path) -> None:
    """The agent's program exits before answering ``initialize``: REST 503 naming the
    agent, its exit status and its last stderr line; ``/acp`` the same code in
    ``data.errorKind`` (not "Internal error"); an LMSP task fails with it; the
    reference agent still works and the server is alive."""
    async with ServeProcess(tmp_path, "--agent", f"quitter={QUITTER}",
                            "--agent", "reference") as daemon:
        rest = await daemon.client.post("/session", json={"agent": "quitter",
                                                           "sessionScope": "thread"})
        message = refused(rest, "quitter")
        assert "exit code 3" in message and "no model configured" in message, message
        assert rest.json()["exitCode"] == 3
        answer = await acp_session_new(daemon.client, tmp_path, "quitter")
        assert answer["id"] == 1 and answer["error"]["code"] == -32603, answer
        assert answer["error"]["message"].startswith(
            "Agent 'quitter' did not complete ACP initialize: "), answer
        assert answer["error"]["data"] == {"errorKind": "agent_unavailable", "agent": "quitter",
                                           "reason": "initialize_failed", "exitCode": 3,
                                           "retryable": True}
        made = await daemon.client.post("/lmsp/v1/tasks", json={
            "type": "response", "input": {"model": "quitter", "input": "hello"}})
        assert made.status_code == 202, made.text
        failed = await lmsp_outcome(daemon.client, made.json()["id"])
        assert failed["status"] == "failed", failed
        assert failed["error"]["code"] == "agent_unavailable", failed
        assert "did not complete ACP initialize" in failed["error"]["detail"], failed
        ok = await daemon.client.post("/session", json={"sessionScope": "thread"})
        assert ok.status_code == 200, ok.text
        status = (await daemon.client.get("/daemon/status")).json()
        assert {a["name"]: a["state"] for a in status["agents"]}["quitter"] == "exited"
        again = await daemon.client.post("/session", json={"agent": "quitter",
                                                            "sessionScope": "thread"})
        refused(again, "quitter")   # tried again, refused again: no 500, no hang
        assert daemon.returncode is None


@pytest.mark.parametrize(("command", "said"), [
    ("cat", "-32601"),                          # echoes: our own "Method not found" back
    (CHATTY, "Hello, I am not an ACP agent"),   # a line that is no JSON-RPC, then exit 0
    (STRING, '"hello"'),                        # a result that is no InitializeResponse
])
async def test_an_agent_that_does_not_speak_acp_is_503(tmp_path: Path, command: str,
                                                        said: str) -> None:
    """A program that answers ``initialize`` wrong, or says something else and exits:
    REST 503 ``agent_unavailable`` saying what it said (bounded), ``/acp`` the same."""
    async with ServeProcess(tmp_path, "--agent", command) as daemon:
        name = shlex.split(command)[0]
        rest = await daemon.client.post("/session", json={"sessionScope": "thread"})
        message = refused(rest, name)
        assert said in message, message
        answer = await acp_session_new(daemon.client, tmp_path, name)
        assert answer["error"]["data"]["errorKind"] == "agent_unavailable", answer
        assert said in answer["error"]["message"], answer
        assert daemon.returncode is None


async def test_an_agent_that_floods_stdout_with_no_json_rpc_does_not_flood_the_log(
        tmp_path: Path) -> None:
    """``yes`` as the agent: lines that are no JSON-RPC, as fast as the pipe takes them,
    and never an answer. Every such line was logged (a warning each: hundreds of
    thousands of lines, the event loop busy writing them, the ``initialize`` timeout's
    answer a minute late); they are now logged at a bounded rate, the rest counted.
    The client gets the documented 504 ``init_timeout`` and the server goes on."""
    async with ServeProcess(tmp_path, "--agent", "yes", "--initialize-timeout-ms", "1000"
                            ) as daemon:
        async with httpx.AsyncClient(base_url=daemon.base_url, timeout=None) as client:
            made = await client.post("/session", json={"sessionScope": "thread"})
            assert made.status_code == 504, made.text
            assert (made.json()["code"], made.json()["phase"]) == ("init_timeout", "initialize")
            assert (await client.get("/health")).status_code == 200
        assert daemon.returncode is None
    log = daemon.stderr_text()
    logged = log.count("ignoring invalid message")
    counted = sum(int(n) for n in re.findall(r"(\d+) invalid stdout line\(s\) not logged", log))
    assert 0 < logged < counted, (logged, counted)   # a pipe's worth of lines is 32K of them


async def test_an_agent_that_talks_but_never_answers_is_504_saying_what_it_said(
        tmp_path: Path) -> None:
    """A program started without its ACP flag (a greeting, then it waits for a person):
    the documented 504 ``init_timeout``, its message now naming the last line it wrote
    that was no JSON-RPC, the hint a person needs."""
    command = "sh -c 'echo Welcome to the interactive mode; exec cat >/dev/null'"
    async with ServeProcess(tmp_path, "--agent", command,
                            "--initialize-timeout-ms", "1000") as daemon:
        made = await daemon.client.post("/session", json={"sessionScope": "thread"})
        assert made.status_code == 504, made.text
        body = made.json()
        assert (body["code"], body["phase"], body["timeoutMs"]) == (
            "init_timeout", "initialize", 1000)
        assert body["error"].startswith("Agent did not answer initialize within 1000ms"), body
        assert "Welcome to the interactive mode" in body["error"], body
        assert daemon.returncode is None


# Completes ``initialize``, then answers every other request with an empty object.
NO_SESSION_ID = '''import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if "id" in msg and "method" in msg:
        result = {"protocolVersion": 1} if msg["method"] == "initialize" else {}
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
'''


async def test_an_agent_that_makes_no_session_id_is_a_protocol_error(tmp_path: Path) -> None:
    """An agent that is up but answers ``session/new`` without a ``sessionId`` breaks
    the protocol every time: REST 502 ``agent_protocol_error`` with no ``Retry-After``
    (a 503 would have a client retry a failure that does not pass), ``/acp`` an error;
    the agent is not restarted for it and the server goes on."""
    script = tmp_path / "no_session_id.py"
    script.write_text(NO_SESSION_ID)
    command = f"{sys.executable} {script}"
    async with ServeProcess(tmp_path, "--agent", f"mute={command}") as daemon:
        made = await daemon.client.post("/session", json={"agent": "mute",
                                                           "sessionScope": "thread"})
        assert made.status_code == 502, made.text
        assert made.json()["code"] == "agent_protocol_error", made.text
        assert "without a sessionId" in made.json()["error"], made.text
        assert "retry-after" not in made.headers
        answer = await acp_session_new(daemon.client, tmp_path, "mute")
        assert "without a sessionId" in answer["error"]["message"], answer
        status = (await daemon.client.get("/daemon/status")).json()
        assert {a["name"]: a["state"] for a in status["agents"]}["mute"] == "running"
        ok = await daemon.client.post("/session", json={"sessionScope": "thread"})
        assert ok.status_code == 200, ok.text
        assert daemon.returncode is None
