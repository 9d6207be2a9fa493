"""Methods over ``/acp``: queue-full error frame, permissions, cancel, close, load,
resume, list, replay with ``Last-Event-ID``, error passthrough."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import pytest

from bridge.agents.reference_settings import SessionSettings
from tests.acp_http.server import RunningAcpServer, request, running_acp_server, said, text
from tests.rest.test_setters import _Silent

REFERENCE_STATE = SessionSettings().state()   # the reference agent's, unchanged

pytestmark = pytest.mark.anyio


async def test_prompt_queue_full_error_frame(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as session_stream:
            # the first holds at its permission ask until the test answers it, the
            # others queue behind it (a 400 ms sleep could end before the sixth arrives)
            for n in range(5):
                response = await server.prompt(conn_id, sid, 10 + n,
                                               f"/permission held {n}" if n == 0 else f"held {n}")
                assert response.status_code == 202
            response = await server.prompt(conn_id, sid, 99, "one too many")
            assert response.status_code == 202          # the POST itself is accepted
            reply = await session_stream.wait_for_id(99)
            assert reply == {"jsonrpc": "2.0", "id": 99, "error": {
                "code": -32603,
                "message": f'Prompt queue full for session "{sid}" (5/5 pending)',
                "data": {"errorKind": "prompt_queue_full", "sessionId": sid,
                         "limit": 5, "pendingCount": 5}}}
            ask = await session_stream.wait_for(
                lambda m: m.get("method") == "session/request_permission")
            option = ask["params"]["options"][0]["optionId"]
            response = await server.post(conn_id, {"jsonrpc": "2.0", "id": ask["id"], "result": {
                "outcome": {"outcome": "selected", "optionId": option}}}, sid)
            assert response.status_code == 202
            # A second prompt on the same connection queued (did not cancel the first).
            for n in range(5):
                reply = await session_stream.wait_for_id(10 + n, timeout=15)
                assert reply["result"]["stopReason"] == "end_turn"


async def test_permission_round_trip(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as session_stream:
            await server.prompt(conn_id, sid, 2, "/permission go")
            ask = await session_stream.wait_for(
                lambda m: m.get("method") == "session/request_permission")
            request_id = ask["id"]
            assert isinstance(request_id, str)
            assert ask["params"]["sessionId"] == sid
            assert ask["params"]["_meta"]["qwen"]["requestId"] == request_id
            option = ask["params"]["options"][0]["optionId"]
            answer = {"jsonrpc": "2.0", "id": request_id,
                      "result": {"outcome": {"outcome": "selected", "optionId": option}}}
            response = await server.post(conn_id, answer, sid)
            assert response.status_code == 202
            reply = await session_stream.wait_for_id(2)
            assert reply["result"]["stopReason"] == "end_turn"
            chunks = said(session_stream.messages)
            assert f"Permission allowed ({option})." in chunks
            assert not server.bridge.permissions.pending_count


async def test_cancel_mid_turn(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as session_stream:
            await server.prompt(conn_id, sid, 2, "/sleep 60s slow")   # ended by the cancel
            await session_stream.wait_for(
                lambda m: m.get("method") == "session/update"
                and m["params"]["update"]["sessionUpdate"] == "user_message_chunk")
            # As a notification (the ACP form) ...
            response = await server.post(conn_id, request(None, "session/cancel",
                                                          {"sessionId": sid}), sid)
            assert response.status_code == 202
            reply = await session_stream.wait_for_id(2, timeout=30)
            assert reply["result"]["stopReason"] == "cancelled"
            # ... or as a request, answered on the session stream.
            response = await server.post(conn_id, request(3, "session/cancel",
                                                          {"sessionId": sid}), sid)
            assert (await session_stream.wait_for_id(3))["result"] == {}


async def test_agent_error_passthrough_and_internal(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as session_stream:
            await server.prompt(conn_id, sid, 2, "/fail")
            reply = await session_stream.wait_for_id(2)
            assert reply["error"]["code"] == -32603
            assert reply["error"]["message"] == "Reference agent failure (/fail)"
            # A forwarded method's error passes through: a mode the agent does not have.
            await server.post(conn_id, request(3, "session/set_mode",
                                               {"sessionId": sid, "modeId": "x"}), sid)
            reply = await session_stream.wait_for_id(3)
            assert reply["error"] == {"code": -32602, "message": 'Unknown mode "x"',
                                      "data": {"modeId": "x"}}


async def test_bad_params_and_unknown_session(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        await server.post(conn_id, request(1, "session/load", {"cwd": server.workspace}))
        assert (await conn_stream.wait_for_id(1))["error"]["code"] == -32602
        await server.post(conn_id, request(2, "session/prompt",
                                           {"sessionId": "missing", "prompt": text("x")}),
                          "missing")
        assert (await conn_stream.wait_for_id(2))["error"]["code"] == -32602
        await server.post(conn_id, request(3, "session/new", {"cwd": "/elsewhere"}))
        assert (await conn_stream.wait_for_id(3))["error"]["code"] == -32602


async def test_a_live_session_loaded_without_its_stream_answers_behind_the_history(
        server: RunningAcpServer) -> None:
    """The ACP Python SDK opens a session stream only once a message names the
    session: a ``session/load`` of a session live here, from a fresh connection, gets
    the history on the connection stream and the answer right behind it there, never
    ahead of it on another stream."""
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as session_stream:
            await server.prompt(conn_id, sid, 2, "remember me")
            await session_stream.wait_for_id(2)
    other, _ = await server.initialize()
    async with server.stream(other) as other_stream:
        await server.post(other, request(3, "session/load",
                                         {"sessionId": sid, "cwd": server.workspace,
                                          "mcpServers": []}), sid)
        assert (await other_stream.wait_for_id(3))["result"] == REFERENCE_STATE
        before = other_stream.messages[:other_stream.messages.index(
            next(m for m in other_stream.messages if m.get("id") == 3))]
        assert said(before) == "Echo: remember me"


async def test_a_history_longer_than_the_stream_buffer_is_paced_not_cut(
        server: RunningAcpServer) -> None:
    """helper-52: a history of more than 2,048 frames pushed on the connection stream
    at once overflowed its buffer: the rest of the history and the answer were dropped,
    and the client waited for ever. Now it is paced by the reader."""
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as session_stream:
            await server.prompt(conn_id, sid, 2, "/chunks 3000 long")
            await session_stream.wait_for_id(2, timeout=60)
    other, _ = await server.initialize()
    async with server.stream(other) as other_stream:
        await server.post(other, request(3, "session/load",
                                         {"sessionId": sid, "cwd": server.workspace,
                                          "mcpServers": []}), sid)
        assert (await other_stream.wait_for_id(3, timeout=60))["result"] == REFERENCE_STATE
        chunks = [m for m in other_stream.messages if m.get("method") == "session/update"
                  and m["params"]["update"]["sessionUpdate"] == "agent_message_chunk"]
        assert len(chunks) == 3000


async def test_list_close_resume_load(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as session_stream:
            await server.prompt(conn_id, sid, 2, "remember me")
            await session_stream.wait_for_id(2)
            await server.post(conn_id, request(3, "session/list", {}))
            listed = (await conn_stream.wait_for_id(3))["result"]["sessions"]
            assert [(s["sessionId"], s["cwd"]) for s in listed] == [(sid, server.workspace)]
            await server.post(conn_id, request(4, "session/close", {"sessionId": sid}), sid)
            assert (await session_stream.wait_for_id(4))["result"] == {}
            await session_stream.wait_for_end()     # the channel retired
        # Restore it on a fresh connection: the history is replayed as session/update.
        other, _ = await server.initialize()
        async with server.stream(other) as other_stream:
            async with server.stream(other, sid) as restored:   # opened before load
                await server.post(other, request(5, "session/load",
                                                 {"sessionId": sid, "cwd": server.workspace,
                                                  "mcpServers": []}), sid)
                assert (await other_stream.wait_for_id(5))["result"] == REFERENCE_STATE
                update = await restored.wait_for(
                    lambda m: m.get("method") == "session/update"
                    and m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
                assert update["params"]["update"]["content"]["text"] == "Echo: remember me"
                await server.post(other, request(6, "session/resume",
                                                 {"sessionId": sid, "cwd": server.workspace}))
                assert (await other_stream.wait_for_id(6))["result"] == REFERENCE_STATE
        await server.post(other, request(7, "authenticate", {"methodId": "x"}))


async def test_last_event_id_replay(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as first:
            await server.prompt(conn_id, sid, 2, "/chunks 4 abcdefgh")
            await first.wait_for_id(2)
        ids = [int(i) for i, _m in first.frames if i is not None]
        assert ids == sorted(ids) and len(ids) >= 5
        cursor = ids[1]
        async with server.stream(conn_id, sid, **{"Last-Event-ID": str(cursor)}) as again:
            await again.wait_for(lambda m: m.get("method") == "_qwen/notify"
                                 and m["params"]["kind"] == "replay_complete")
        replayed = [int(i) for i, _m in again.frames if i is not None]
        assert replayed == [i for i in ids if i > cursor]
        assert again.response.headers["x-qwen-event-epoch"]


async def test_late_session_stream_gets_everything(server: RunningAcpServer) -> None:
    """More events than a bus subscriber may queue arrive before the session stream
    opens: the channel resubscribes from the ring and nothing is lost."""
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        await server.prompt(conn_id, sid, 2, "/chunks 400 " + "x" * 800)
        session = server.bridge.get_session(sid)
        with anyio.fail_after(30):
            while session.pending_count:
                await anyio.sleep(0.02)
        async with server.stream(conn_id, sid) as late:
            reply = await late.wait_for_id(2)
        assert reply["result"]["stopReason"] == "end_turn"
        chunks = [m for m in late.messages if m.get("method") == "session/update"
                  and m["params"]["update"]["sessionUpdate"] == "agent_message_chunk"]
        assert len(chunks) == 400
        # (SSE keeps the last id across frames without one, so look at updates only.)
        ids = [int(i) for i, m in late.frames if m.get("method") == "session/update"]
        assert ids == sorted(set(ids))


async def test_vendor_permission_vote(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as session_stream:
            await server.prompt(conn_id, sid, 2, "/permission vote")
            ask = await session_stream.wait_for(
                lambda m: m.get("method") == "session/request_permission")
            await server.post(conn_id, request(3, "session/permission", {
                "requestId": ask["id"], "sessionId": sid,
                "outcome": {"outcome": "selected", "optionId": "nope"}}))
            assert (await conn_stream.wait_for_id(3))["error"]["code"] == -32602
            await server.post(conn_id, request(4, "session/permission", {
                "requestId": ask["id"], "outcome": {"outcome": "cancelled"}}))
            assert (await conn_stream.wait_for_id(4))["result"] == {}
            assert (await session_stream.wait_for_id(2))["result"]["stopReason"] == "cancelled"


async def test_session_limit_error_data(tmp_path) -> None:
    from bridge import BridgeOptions
    from tests.acp_http.server import running_acp_server

    async with running_acp_server(tmp_path, options=BridgeOptions(max_sessions=1)) as srv:
        conn_id, _ = await srv.initialize()
        async with srv.stream(conn_id) as conn_stream:
            await srv.new_session(conn_id, conn_stream)
            await srv.post(conn_id, request(2, "session/new", {"cwd": srv.workspace}))
            error = (await conn_stream.wait_for_id(2))["error"]
            assert error == {"code": -32603, "message": "Session limit reached (1 live sessions)",
                             "data": {"errorKind": "session_limit_exceeded", "limit": 1,
                                      "scope": "workspace", "retryable": True}}


async def test_agent_crash_mid_turn(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as session_stream:
            await server.prompt(conn_id, sid, 2, "/crash boom")
            reply = await session_stream.wait_for_id(2)
            assert reply["error"]["code"] == -32603
            assert reply["error"]["data"]["errorKind"] == "agent_died"
            kinds = [m["params"]["kind"] for m in session_stream.messages
                     if m.get("method") == "_qwen/notify"]
            assert "session_died" in kinds


async def test_foreign_epoch_replays_everything(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as first:
            await server.prompt(conn_id, sid, 2, "hello")
            await first.wait_for_id(2)
        headers = {"Last-Event-ID": "2", "X-Qwen-Event-Epoch": "not-this-one"}
        async with server.stream(conn_id, sid, **headers) as again:
            await again.wait_for(lambda m: m.get("method") == "_qwen/notify"
                                 and m["params"]["kind"] == "replay_complete")
        resync = [m["params"]["data"] for m in again.messages
                  if m.get("method") == "_qwen/notify"
                  and m["params"]["kind"] == "state_resync_required"]
        assert resync and resync[0]["reason"] == "epoch_reset"
        first_ids = [i for i, m in first.frames if m.get("method") == "session/update"]
        again_ids = [i for i, m in again.frames if m.get("method") == "session/update"]
        assert again_ids == first_ids


async def test_set_model_without_session_header(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        response = await server.post(conn_id, request(3, "session/set_model",
                                                      {"sessionId": sid, "modelId": "m"}))
        assert response.status_code == 202
        async with server.stream(conn_id, sid) as session_stream:
            reply = await session_stream.wait_for_id(3)
            assert reply["error"]["code"] == -32602   # a model the reference agent lacks


async def test_a_question_resolved_elsewhere_is_withdrawn(server: RunningAcpServer) -> None:
    """A permission request this connection was sent and did not answer, answered by
    another client (a REST vote) or ended with its turn, is withdrawn with ACP's
    ``$/cancel_request``; the client's late answer is ignored."""
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as session_stream:
            def asked(m: dict[str, Any]) -> bool:
                return m.get("method") == "session/request_permission"

            def withdrawn(m: dict[str, Any]) -> bool:
                return m.get("method") == "$/cancel_request"

            await server.prompt(conn_id, sid, 2, "/permission vote elsewhere")
            ask = await session_stream.wait_for(asked)
            voted = await server.client.post(
                f"/session/{sid}/permission/{ask['id']}",
                json={"outcome": {"outcome": "selected", "optionId": "allow_once"}})
            assert voted.status_code == 200, voted.text
            cancel = await session_stream.wait_for(withdrawn)
            assert cancel == {"jsonrpc": "2.0", "method": "$/cancel_request",
                              "params": {"requestId": ask["id"]}}
            # the client answers it anyway (ACP: the original request is still
            # answered, here with -32800): ignored, the REST vote stands
            late = await server.post(conn_id, {"jsonrpc": "2.0", "id": ask["id"], "error": {
                "code": -32800, "message": "Request cancelled"}}, sid)
            assert late.status_code == 202
            reply = await session_stream.wait_for_id(2)
            assert reply["result"]["stopReason"] == "end_turn"
            assert "Permission allowed (allow_once)." in said(session_stream.messages)

            # the turn that asked is cancelled: its question is withdrawn too
            await server.prompt(conn_id, sid, 3, "/permission then cancel")
            ask = await session_stream.wait_for(
                lambda m: asked(m) and m["id"] != cancel["params"]["requestId"])
            await server.post(conn_id, request(None, "session/cancel", {"sessionId": sid}),
                              sid)
            second = await session_stream.wait_for(
                lambda m: withdrawn(m) and m["params"]["requestId"] == ask["id"])
            assert second["params"] == {"requestId": ask["id"]}
            assert (await session_stream.wait_for_id(3))["result"]["stopReason"] == "cancelled"

            # answered by this client: nothing is withdrawn
            await server.prompt(conn_id, sid, 4, "/permission answered here")
            ask = await session_stream.wait_for(
                lambda m: asked(m) and m["id"] not in (cancel["params"]["requestId"],
                                                       second["params"]["requestId"]))
            await server.post(conn_id, {"jsonrpc": "2.0", "id": ask["id"], "result": {
                "outcome": {"outcome": "selected", "optionId": "allow_once"}}}, sid)
            assert (await session_stream.wait_for_id(4))["result"]["stopReason"] == "end_turn"
            cancels = [m["params"]["requestId"] for m in session_stream.messages
                       if withdrawn(m)]
            assert cancels == [cancel["params"]["requestId"], second["params"]["requestId"]]
            assert not server.bridge.permissions.pending_count


async def test_an_agent_withdraws_its_permission_request(tmp_path: Any) -> None:
    """A stdio agent withdraws a permission request it sent (``$/cancel_request``): it
    is resolved as cancelled (reason ``request_cancelled``), the client that was asked
    gets ``$/cancel_request`` for it, and the agent's request is answered -32800."""
    from pathlib import Path

    from bridge.agents.stdio import StdioAgentFactory
    from tests.acp_http.server import running_acp_server
    from tests.agents import fixture_command

    repo = Path(__file__).resolve().parents[2]
    factory = StdioAgentFactory(fixture_command("fx"), cwd=str(repo), name="fx")
    gate = tmp_path / "gate"
    async with running_acp_server(tmp_path, agent_factory=factory) as srv:
        conn_id, _ = await srv.initialize()
        async with srv.stream(conn_id) as conn_stream:
            sid = await srv.new_session(conn_id, conn_stream)
            async with srv.stream(conn_id, sid) as session_stream:
                await srv.prompt(conn_id, sid, 2, f"withdraw {gate}")
                ask = await session_stream.wait_for(
                    lambda m: m.get("method") == "session/request_permission")
                assert ask["params"]["toolCall"]["title"] == "touch withdrawn"
                gate.touch()
                cancel = await session_stream.wait_for(
                    lambda m: m.get("method") == "$/cancel_request")
                assert cancel["params"] == {"requestId": ask["id"]}
                reply = await session_stream.wait_for_id(2, timeout=10)
                assert reply["result"]["stopReason"] == "end_turn"
                [resolved] = [m["params"]["data"] for m in session_stream.messages
                              if m.get("method") == "_qwen/notify"
                              and m["params"]["kind"] == "permission_resolved"]
                assert resolved["requestId"] == ask["id"]
                assert resolved["outcome"] == {"outcome": "cancelled"}
                assert resolved["reason"] == "request_cancelled"
                assert said(session_stream.messages) == \
                    'withdrawn: {"code": -32800, "message": "Request cancelled"}'
                assert not srv.bridge.permissions.pending_count


async def test_a_setter_the_agent_does_not_answer(tmp_path: Any) -> None:
    """``session/set_mode`` has the agent requests' deadline: -32603 ``errorKind:
    agent_request_timeout`` (it waited for ever), and the next setter is served. The
    short deadline is the bridge's only for the setter that meets it: ``session/new``
    and the next setter have it too, and a loaded machine may stall the process for
    300 ms while the agent answers them."""
    async with running_acp_server(tmp_path, agent_factory=_Silent()) as server:
        conn_id, _ = await server.initialize()
        async with server.stream(conn_id) as conn_stream:
            sid = await server.new_session(conn_id, conn_stream)
            patient = server.bridge.options
            server.bridge.options = dataclasses.replace(patient, agent_request_timeout_ms=300)
            async with server.stream(conn_id, sid) as session_stream:
                await server.post(conn_id, request(3, "session/set_mode",
                                                   {"sessionId": sid, "modeId": "plan"}), sid)
                with anyio.fail_after(15):
                    timed_out = await session_stream.wait_for_id(3)
                server.bridge.options = patient
                await server.post(conn_id, request(4, "session/set_mode",
                                                   {"sessionId": sid, "modeId": "yolo"}), sid)
                with anyio.fail_after(15):   # not held behind the one given up on
                    answered = await session_stream.wait_for_id(4)
    assert timed_out["error"]["code"] == -32603
    assert timed_out["error"]["data"]["errorKind"] == "agent_request_timeout"
    assert answered["result"] == {}
