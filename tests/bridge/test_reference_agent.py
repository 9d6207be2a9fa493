"""The in-process reference agent: every directive, session management, cancel, crash."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import msgspec
import pytest

from bridge.agents.base import AgentConnection
from bridge.agents.reference import (
    ReferenceAgentFactory,
    SessionStore,
    parse_directives,
)
from bridge.agents.reference_agent import split_chunks
from bridge.agents.reference_settings import SessionSettings
from bridge.errors import AgentDiedError, AgentError
from tests.bridge.fake_agent_client import CANCELLED, REJECT, FakeClient, prompt

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def connected(
    client: FakeClient, factory: ReferenceAgentFactory | None = None
) -> AsyncIterator[AgentConnection]:
    # The task group must be able to exit once the connection is closed.
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            conn = await (factory or ReferenceAgentFactory()).connect(client, tg)
            assert isinstance(conn, AgentConnection) and not conn.closed
            try:
                yield conn
            finally:
                await conn.aclose()


async def new_session(conn: AgentConnection, cwd: str = "/work", **extra: object) -> str:
    result = await conn.request("session/new", {"cwd": cwd, "mcpServers": [], **extra})
    return result["sessionId"]


# --- pure helpers -----------------------------------------------------------------


def test_parse_directives_combined() -> None:
    d = parse_directives("/sleep 200ms /chunks 5\n/permission\t/tool write a/b.txt  hello /fail")
    assert d.sleep_s == pytest.approx(0.2)
    assert d.chunks == 5 and d.permission and d.write_path == "a/b.txt"
    assert d.message == "hello /fail" and not d.fail  # directives only at the start


def test_parse_directives_strict_syntax() -> None:
    assert parse_directives("/sleep 2s").sleep_s == 2.0
    assert parse_directives("/failing now").message == "/failing now"
    assert parse_directives("/sleep 2 s x").sleep_s == 0.0  # not the exact syntax
    flags = parse_directives("/fail /max_tokens /refuse /crash")
    assert flags.fail and flags.max_tokens and flags.refuse and flags.crash
    assert parse_directives("hello /permission").permission is False


def test_split_chunks_exact_count() -> None:
    assert split_chunks("abcdefg", 3) == ["abc", "de", "fg"]
    assert split_chunks("ab", 4) == ["a", "b", "", ""]


def test_session_store_is_bounded() -> None:
    store = SessionStore(max_sessions=2, max_messages=3)
    first = store.create("a", "/w")
    store.create("b", "/w")
    store.get("a")  # "a" becomes most recently used
    store.create("c", "/w")
    assert [s.session_id for s in store.all()] == ["a", "c"]
    first.history.extend([("user", str(i)) for i in range(5)])
    assert [text for _, text in first.history] == ["2", "3", "4"]


def _history_chars(store: SessionStore) -> int:
    return sum(len(text) for session in store.all() for _, text in session.history)


def test_session_history_is_bounded_in_characters() -> None:
    """One session keeps its newest messages within ``max_chars``; a message over it
    goes whole; all sessions together stay within ``max_total_chars``, the least
    recently used losing their oldest messages first."""
    store = SessionStore(max_chars=100, max_total_chars=250)
    a = store.create("a", "/w", [("user", "x" * 40), ("agent", "y" * 40)])
    a.history.append(("user", "z" * 40))                 # 120 > 100: the oldest goes
    assert [t[0] for _, t in a.history] == ["y", "z"] and a.history.chars == 80
    a.history.append(("user", "w" * 101))                # over the bound by itself
    assert [t[0] for _, t in a.history] == [] and a.history.chars == 0
    b = store.create("b", "/w", [("user", "b" * 90)])
    c = store.create("c", "/w", [("user", "c" * 90)])
    store.get("a")                                       # a is used: b is the oldest
    a.history.extend([("user", "a" * 60), ("agent", "a" * 30)])  # a: 90; b, c: 90 each
    assert store.chars == _history_chars(store) == 270 - 90   # b, least recently used, lost
    assert [len(s.history) for s in (a, b, c)] == [2, 0, 1]
    store.create("c", "/w")                              # replaced: its characters go
    assert store.chars == _history_chars(store) == 90


async def test_prompts_under_the_body_cap_keep_the_history_bounded() -> None:
    """Prompts of a mebibyte each, echoed: the session's history stays within the
    default 16 Mi characters (it grew by two mebibytes a prompt, without end)."""
    store = SessionStore()
    client = FakeClient()
    async with connected(client, ReferenceAgentFactory(store=store)) as conn:
        sid = await new_session(conn)
        for _ in range(12):
            await conn.request("session/prompt", prompt(sid, "m" * (1 << 20)))
    assert 14 * (1 << 20) < _history_chars(store) <= 16 * (1 << 20)


# --- protocol ---------------------------------------------------------------------


async def test_initialize_advertises_capabilities() -> None:
    async with connected(FakeClient()) as conn:
        info = await conn.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    assert info["protocolVersion"] == 1
    caps = info["agentCapabilities"]
    assert caps["loadSession"] is True
    assert caps["promptCapabilities"] == {"image": False, "audio": False, "embeddedContext": True}
    assert set(caps["sessionCapabilities"]) == {"resume", "close", "list", "fork"}
    assert info["agentInfo"] == {"name": "acp-server-reference", "version": "0.1.0"}
    assert info["authMethods"] == []


async def test_echo_in_three_chunks_delivered_before_the_answer() -> None:
    client = FakeClient()
    async with connected(client) as conn:
        sid = await new_session(conn)
        result = await conn.request("session/prompt", prompt(sid, "hello world"))
        assert result == {"stopReason": "end_turn"}
        assert len(client.chunks(sid)) == 3  # already there when the answer arrived
        assert client.texts(sid) == "Echo: hello world"


async def test_raw_params_and_requested_session_id() -> None:
    client = FakeClient()
    async with connected(client) as conn:
        meta = {"acp-server/requestedSessionId": "chosen-id"}
        assert await new_session(conn, _meta=meta) == "chosen-id"
        raw = msgspec.Raw(msgspec.json.encode(prompt("chosen-id", "/chunks 1 raw")))
        assert await conn.request("session/prompt", raw) == {"stopReason": "end_turn"}
        assert client.chunks("chosen-id") == ["Echo: raw"]


async def test_chunks_sleep_and_stop_reasons() -> None:
    client = FakeClient()
    async with connected(client) as conn:
        sid = await new_session(conn)
        await conn.request("session/prompt", prompt(sid, "/chunks 7 abcdefghijkl"))
        assert len(client.chunks(sid)) == 7 and client.texts(sid) == "Echo: abcdefghijkl"
        slept = await conn.request("session/prompt", prompt(sid, "/sleep 150ms x"))
        assert slept["stopReason"] == "end_turn" and client.texts(sid).endswith("Echo: x")
        assert (await conn.request("session/prompt", prompt(sid, "/max_tokens x")))["stopReason"] == "max_tokens"
        assert (await conn.request("session/prompt", prompt(sid, "/refuse x")))["stopReason"] == "refusal"


async def test_fail_raises_agent_error() -> None:
    async with connected(FakeClient()) as conn:
        sid = await new_session(conn)
        with pytest.raises(AgentError) as info:
            await conn.request("session/prompt", prompt(sid, "/fail"))
        assert info.value.rpc_code == -32603
        assert info.value.message == "Reference agent failure (/fail)"
        # The session still works afterwards.
        assert (await conn.request("session/prompt", prompt(sid, "ok")))["stopReason"] == "end_turn"


async def test_permission_allowed_and_rejected() -> None:
    client = FakeClient()
    async with connected(client) as conn:
        sid = await new_session(conn)
        await conn.request("session/prompt", prompt(sid, "/permission /chunks 1 go"))
        assert client.texts(sid) == "Permission allowed (allow_once).\nEcho: go"
        asked = client.permission_requests[0]
        assert asked["toolCall"]["title"] == "Reference permission check"
        assert asked["toolCall"]["kind"] == "other" and asked["toolCall"]["status"] == "pending"
        assert [o["optionId"] for o in asked["options"]] == ["allow_once", "allow_always", "reject_once"]
        client.clear()
        client.permission_answer = REJECT
        await conn.request("session/prompt", prompt(sid, "/permission go"))
        assert client.texts(sid).startswith("Permission rejected (reject_once).")


async def test_permission_outcome_cancelled_ends_turn() -> None:
    client = FakeClient(permission_answer=CANCELLED)
    async with connected(client) as conn:
        sid = await new_session(conn)
        result = await conn.request("session/prompt", prompt(sid, "/permission go"))
        assert result == {"stopReason": "cancelled"}
        assert client.chunks(sid) == []


async def test_tool_write_allowed(tmp_path: Path) -> None:
    client = FakeClient(root=tmp_path)
    async with connected(client) as conn:
        sid = await new_session(conn, cwd=str(tmp_path))
        await conn.request("session/prompt", prompt(sid, "/tool write sub/../notes.txt hello file"))
    target = tmp_path / "notes.txt"
    assert target.read_text() == "hello file\n"
    assert client.writes == [{"sessionId": sid, "path": str(target), "content": "hello file\n"}]
    kinds = [(u["sessionUpdate"], u.get("status")) for u in client.session_updates(sid)]
    assert kinds[0] == ("tool_call", "pending") and kinds[1] == ("tool_call_update", "completed")
    assert client.session_updates(sid)[0]["kind"] == "edit"
    assert client.permission_requests[0]["toolCall"]["toolCallId"] == client.session_updates(sid)[0]["toolCallId"]
    assert client.texts(sid) == f"Wrote {target}.\nEcho: hello file"


async def test_tool_write_rejected_and_confined(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    client = FakeClient(root=workspace, permission_answer=REJECT)
    async with connected(client) as conn:
        sid = await new_session(conn, cwd=str(workspace))
        await conn.request("session/prompt", prompt(sid, "/tool write a.txt"))
        assert client.session_updates(sid)[1]["status"] == "failed"
        assert "rejected" in client.texts(sid)
        client.clear()
        client.permission_answer = {"outcome": {"outcome": "selected", "optionId": "allow_always"}}
        await conn.request("session/prompt", prompt(sid, "/tool write ../escape.txt"))
        assert client.session_updates(sid)[1]["status"] == "failed"
        assert "failed: Path outside the workspace" in client.texts(sid)
    assert list(tmp_path.rglob("*.txt")) == []


async def test_load_replays_history_and_unknown_session() -> None:
    client = FakeClient()
    factory = ReferenceAgentFactory()
    async with connected(client, factory) as conn:
        sid = await new_session(conn)
        await conn.request("session/prompt", prompt(sid, "one"))
        await conn.request("session/prompt", prompt(sid, "/chunks 1 two"))
    # A new connection of the same factory sees the stored history (like a restart).
    client = FakeClient()
    async with connected(client, factory) as conn:
        assert await conn.request("session/load", {"sessionId": sid, "cwd": "/work", "mcpServers": []}) == \
            SessionSettings().state()
        replay = [(u["sessionUpdate"], u["content"]["text"]) for u in client.session_updates(sid)]
        assert replay == [
            ("user_message_chunk", "one"),
            ("agent_message_chunk", "Echo: one"),
            ("user_message_chunk", "/chunks 1 two"),
            ("agent_message_chunk", "Echo: two"),
        ]
        with pytest.raises(AgentError) as info:
            await conn.request("session/load", {"sessionId": "nope", "cwd": "/work", "mcpServers": []})
        assert info.value.rpc_code == -32002 and info.value.message == "Session not found"


async def test_resume_fork_list_close() -> None:
    client = FakeClient()
    async with connected(client) as conn:
        sid = await new_session(conn, cwd="/a")
        await conn.request("session/prompt", prompt(sid, "base"))
        client.clear()
        assert await conn.request("session/resume", {"sessionId": sid, "cwd": "/a"}) == \
            SessionSettings().state()
        assert client.updates == []  # no replay
        with pytest.raises(AgentError) as info:
            await conn.request("session/resume", {"sessionId": "missing", "cwd": "/a"})
        assert info.value.rpc_code == -32002

        fork = (await conn.request("session/fork", {"sessionId": sid, "cwd": "/b"}))["sessionId"]
        assert fork != sid
        await conn.request("session/prompt", prompt(fork, "forked"))
        client.clear()
        await conn.request("session/load", {"sessionId": fork, "cwd": "/b", "mcpServers": []})
        assert client.chunks(fork, "user_message_chunk") == ["base", "forked"]
        client.clear()
        await conn.request("session/load", {"sessionId": sid, "cwd": "/a", "mcpServers": []})
        assert client.chunks(sid, "user_message_chunk") == ["base"]  # original untouched

        listed = (await conn.request("session/list", {}))["sessions"]
        assert {"sessionId": sid, "cwd": "/a"} in listed and {"sessionId": fork, "cwd": "/b"} in listed
        assert (await conn.request("session/list", {"cwd": "/b"}))["sessions"] == [{"sessionId": fork, "cwd": "/b"}]
        assert await conn.request("session/close", {"sessionId": sid}) == {}


async def test_unknown_method_and_bad_params() -> None:
    async with connected(FakeClient()) as conn:
        with pytest.raises(AgentError) as info:
            await conn.request("session/teleport", {})
        assert info.value.rpc_code == -32601 and info.value.data == {"method": "session/teleport"}
        with pytest.raises(AgentError) as info:
            await conn.request("session/new", {"mcpServers": []})
        assert info.value.rpc_code == -32602
        await conn.notify("_unknown/notification", {})  # ignored


async def test_cancel_interrupts_sleep() -> None:
    client = FakeClient()
    async with connected(client) as conn:
        sid = await new_session(conn)
        results: list[dict] = []

        async def run() -> None:
            results.append(await conn.request("session/prompt", prompt(sid, "/sleep 120s late")))

        with anyio.fail_after(30):   # a hang guard: the cancel ends the 120 s sleep
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                # the cancel once the turn began (a cancel before it is ignored: on a
                # loaded machine a fixed 50 ms wait could end before the turn started)
                while sid not in conn._agent._turns:  # type: ignore[attr-defined]
                    await anyio.sleep(0.005)
                await conn.notify("session/cancel", {"sessionId": sid})
        assert results == [{"stopReason": "cancelled"}]
        assert client.chunks(sid) == []
        # The next turn is not affected by the earlier cancel.
        assert (await conn.request("session/prompt", prompt(sid, "again")))["stopReason"] == "end_turn"


async def test_cancel_interrupts_permission_wait_without_cancelling_the_client() -> None:
    client = FakeClient()
    client.hold_permission = True
    async with connected(client) as conn:
        sid = await new_session(conn)
        results: list[dict] = []

        async def run() -> None:
            results.append(await conn.request("session/prompt", prompt(sid, "/permission x")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await client.permission_started.wait()
            await conn.notify("session/cancel", {"sessionId": sid})
        assert results == [{"stopReason": "cancelled"}]
        # The client's handler still runs (a real client answers it "cancelled").
        client.release.set()
        await anyio.sleep(0.01)
        assert client.permission_finished == 1


async def test_second_prompt_while_running_is_rejected() -> None:
    async with connected(FakeClient()) as conn:
        sid = await new_session(conn)
        async with anyio.create_task_group() as tg:
            tg.start_soon(conn.request, "session/prompt", prompt(sid, "/sleep 10s"))
            await anyio.sleep(0.02)
            with pytest.raises(AgentError) as info:
                await conn.request("session/prompt", prompt(sid, "again"))
            assert info.value.rpc_code == -32602
            await conn.notify("session/cancel", {"sessionId": sid})


async def test_crash_in_process_loses_the_connection() -> None:
    client = FakeClient()
    errors: list[BaseException] = []
    async with connected(client) as conn:
        a = await new_session(conn)
        b = await new_session(conn)

        async def sleeper() -> None:
            try:
                await conn.request("session/prompt", prompt(b, "/sleep 10s"))
            except AgentDiedError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(sleeper)
            await anyio.sleep(0.02)
            with pytest.raises(AgentDiedError) as info:
                await conn.request("session/prompt", prompt(a, "/crash /chunks 4 boom"))
        assert info.value.exit_code == 3
        assert len(errors) == 1 and errors[0] is info.value
        assert len(client.lost) == 1 and client.lost[0] is info.value
        assert client.chunks(a) == ["Echo:"]  # the first half of "Echo: boom"
        assert conn.closed
        with pytest.raises(AgentDiedError):
            await conn.request("session/new", {"cwd": "/w", "mcpServers": []})
    assert len(client.lost) == 1  # aclose after a crash does not report again


async def test_aclose_fails_pending_calls_without_connection_lost() -> None:
    client = FakeClient()
    caught: list[BaseException] = []
    async with connected(client) as conn:
        sid = await new_session(conn)

        async def pending() -> None:
            try:
                await conn.request("session/prompt", prompt(sid, "/sleep 10s"))
            except AgentDiedError as exc:
                caught.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(pending)
            await anyio.sleep(0.02)
            await conn.aclose()
            await conn.aclose()  # idempotent
        assert len(caught) == 1 and conn.closed
        with pytest.raises(AgentDiedError):
            await conn.notify("session/cancel", {"sessionId": sid})
    assert client.lost == []


async def test_session_settings() -> None:
    """The reference agent's modes, models and ``reasoning_effort``: advertised by
    ``session/new``, set by their setters (a mode and an option reported by a
    ``session/update``), kept by ``session/load``; an id it does not have is -32602
    and changes nothing."""
    client = FakeClient()
    async with connected(client) as conn:
        created = await conn.request("session/new", {"cwd": "/w", "mcpServers": []})
        sid = created.pop("sessionId")
        assert created == SessionSettings().state()
        assert [m["id"] for m in created["modes"]["availableModes"]] == \
            ["default", "plan", "auto-edit", "yolo"]
        assert await conn.request("session/set_mode", {"sessionId": sid, "modeId": "plan"}) == {}
        assert await conn.request("session/set_model",
                                  {"sessionId": sid, "modelId": "reference-large"}) == {}
        options = await conn.request("session/set_config_option", {
            "sessionId": sid, "configId": "reasoning_effort", "value": "high"})
        assert options["configOptions"][0]["currentValue"] == "high"
        assert [u["sessionUpdate"] for u in client.session_updates(sid)] == \
            ["current_mode_update", "config_option_update"]
        for method, params in [("session/set_mode", {"modeId": "auto"}),
                               ("session/set_model", {"modelId": "gpt"}),
                               # not strings: -32602 too (an unhashable id was a
                               # TypeError, -32603 and a traceback in the log)
                               ("session/set_mode", {"modeId": ["plan"]}),
                               ("session/set_model", {"modelId": {"id": "reference"}}),
                               ("session/set_config_option", {"configId": "x", "value": "y"}),
                               ("session/set_config_option",
                                {"configId": "reasoning_effort", "value": 3})]:
            with pytest.raises(AgentError) as info:
                await conn.request(method, {"sessionId": sid, **params})
            assert info.value.rpc_code == -32602, method
        state = await conn.request("session/load", {"sessionId": sid, "cwd": "/w",
                                                    "mcpServers": []})
        assert (state["modes"]["currentModeId"], state["models"]["currentModelId"],
                state["configOptions"][0]["currentValue"]) == ("plan", "reference-large", "high")
