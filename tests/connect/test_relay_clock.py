"""The relay's reconnecting on a fake clock and a scripted server (``tests.connect.fakes``):
when it gives up, when it starts counting again, and what it does with a message the
server refuses for its size. No sleeps, no timing assertions."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from acp_server.connect.link import TOO_BIG, MessageTooLarge
from acp_server.connect.relay import HEALTHY_AFTER_S, MAX_ATTEMPTS, Backoff, Relay
from tests.connect.fakes import (
    FakeClock,
    FakeEditor,
    FakeLink,
    FakeServer,
    echo_result,
    editor_and_relay,
)

pytestmark = pytest.mark.anyio


async def _open_session(editor: FakeEditor) -> dict[str, Any]:
    """``initialize`` (id 1), then ``session/new`` (id 2): its answer."""
    await editor.request("initialize", {}, 1)
    await editor.response(1)
    await editor.request("session/new", {"cwd": "/w", "mcpServers": []}, 2)
    return await editor.response(2)


def kind(message: dict[str, Any]) -> Any:
    return message["error"]["data"]["errorKind"]


async def test_a_server_that_accepts_then_drops_is_given_up_on() -> None:
    """review7 #2: every link is dropped right after initialize; the give-up window opened
    at the first loss is not reset by the links that come up, and the backoff grows."""
    clock = FakeClock()
    server = FakeServer(answer=lambda link, message: _nothing())
    async with editor_and_relay(server, clock, give_up_after_s=10) as (editor, relay):
        await editor.request("initialize", {}, 1)
        assert "result" in await editor.response(1)
        server.on_connect = lambda link: link.lose()
        server.lose_all()
        await editor.request("session/list", {}, 2)
        answer = await editor.response(2)
        assert kind(answer) == "server_unreachable" and "gave up" in answer["error"]["message"]
    assert relay.exit_code == 1
    assert 3 <= server.connects <= 8, server.connects     # a bounded number of tries
    assert clock.slept[:-1] == sorted(clock.slept[:-1])
    assert sum(clock.slept) == pytest.approx(10)


async def _nothing() -> None:
    return None


async def test_a_healthy_link_starts_the_window_again() -> None:
    """Down for most of the window, up and answering the editor, down again: the second
    outage gets a window of its own; a link up ``HEALTHY_AFTER_S`` counts as healthy."""
    clock = FakeClock()
    server = FakeServer()
    async with editor_and_relay(server, clock, give_up_after_s=10,
                                backoff=Backoff(0.5, 1.0)) as (editor, relay):
        await editor.request("initialize", {}, 1)
        await editor.response(1)
        server.refusing = "server_unreachable"
        server.lose_all()
        lost_at = clock.now()
        while clock.now() - lost_at < 7:
            await _tick(server)
        server.refusing = None
        await editor.request("session/list", {}, 2)
        assert (await editor.response(2))["result"] == {"method": "session/list"}
        server.refusing = "server_unreachable"
        server.lose_all()
        second = clock.now()
        while clock.now() - second < 7:   # 14 s after the first loss: not given up
            await _tick(server)
        server.refusing = None
        await editor.request("session/list", {}, 3)
        assert (await editor.response(3))["result"] == {"method": "session/list"}
        assert relay.exit_code == 0
        # up HEALTHY_AFTER_S without answering anything: healthy too
        server.answer = lambda link, message: _nothing()
        server.lose_all()
        await _until_connected(server, relay)
        clock.t += HEALTHY_AFTER_S + 1   # (+1: no float rounding below it)
        server.refusing = "server_unreachable"
        server.lose_all()
        third = clock.now()
        while clock.now() - third < 7:
            await _tick(server)
        assert relay.exit_code == 0
        server.refusing = None
        server.answer = echo_result
        await _until_connected(server, relay)
    assert relay.exit_code == 0


async def _tick(server: FakeServer) -> None:
    """Let the relay make one more attempt."""
    before = server.refused + server.connects
    for _ in range(1000):
        await anyio.lowlevel.checkpoint()
        if server.refused + server.connects > before:
            return


async def _until_connected(server: FakeServer, relay: Relay) -> None:
    """Until the relay serves a new link (``relay.link`` is set once it is up)."""
    before = server.connects
    with anyio.fail_after(10):
        while server.connects == before or server.links[-1].lost \
                or relay.link is not server.links[-1]:
            await anyio.lowlevel.checkpoint()


async def test_a_request_in_flight_on_links_that_keep_dropping_fails() -> None:
    """A repeatable request the server drops the link on, every time, fails after
    ``MAX_ATTEMPTS`` and the relay goes on with the next one."""
    clock = FakeClock()

    async def answer(link: FakeLink, message: dict[str, Any]) -> None:
        if message.get("params", {}).get("prompt") == "poison":
            link.lose("crashed")
        else:
            await echo_result(link, message)

    server = FakeServer(answer=answer)
    async with editor_and_relay(server, clock, give_up_after_s=600) as (editor, relay):
        await editor.request("initialize", {}, 1)
        await editor.response(1)
        await editor.request("session/prompt", {"sessionId": "s", "prompt": "poison"}, 2)
        await editor.request("session/list", {}, 3)
        failed = await editor.response(2)
        assert kind(failed) == "connection_lost" and str(MAX_ATTEMPTS) in \
            failed["error"]["message"]
        assert (await editor.response(3))["result"] == {"method": "session/list"}
    tries = [m for m in server.received if m.get("params", {}).get("prompt") == "poison"]
    assert len(tries) == MAX_ATTEMPTS
    assert relay.exit_code == 0


@pytest.mark.parametrize("how", ["http-413", "websocket-1009"])
async def test_a_message_too_large_for_the_server_fails_alone(how: str) -> None:
    """review7 #1: refused for its size (HTTP 413, or the WebSocket closed with 1009),
    that message fails with ``message_too_large``, nothing as large is sent again, and
    the rest goes through; no reconnect loop."""
    clock = FakeClock()

    async def answer(link: FakeLink, message: dict[str, Any]) -> None:
        if len(str(message)) > 10_000:
            if how == "http-413":
                raise MessageTooLarge("refused a message as too large (HTTP 413)")
            link.lose("closed (1009)", code=TOO_BIG)
            return
        await echo_result(link, message)

    server = FakeServer(answer=answer)
    async with editor_and_relay(server, clock) as (editor, relay):
        await editor.request("initialize", {}, 1)
        await editor.response(1)
        await editor.request("session/prompt", {"sessionId": "s", "prompt": "x" * 20_000}, 2)
        await editor.request("session/list", {}, 3)
        refused = await editor.response(2)
        assert kind(refused) == "message_too_large"
        assert (await editor.response(3))["result"] == {"method": "session/list"}
        await editor.request("session/prompt", {"sessionId": "s", "prompt": "y" * 30_000}, 4)
        assert kind(await editor.response(4)) == "message_too_large"
        await editor.send({"jsonrpc": "2.0", "method": "big/note", "params": "z" * 30_000})
        await editor.request("session/list", {}, 5)
        assert "result" in await editor.response(5)
    sizes = [len(str(m)) for m in server.received]
    assert len([s for s in sizes if s > 10_000]) == 1      # tried once, never again
    assert server.connects == (1 if how == "http-413" else 2)
    assert relay.exit_code == 0


async def test_an_unexpected_failure_on_one_line_is_answered_and_survived(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """review7 #3, the catch-all: whatever fails while relaying one editor line, that
    request gets -32603 and the next line is relayed."""
    real = Relay._to_server

    async def flaky(self: Relay, msg: Any) -> None:
        if msg.method == "explode":
            raise RuntimeError("a bug")
        await real(self, msg)

    monkeypatch.setattr(Relay, "_to_server", flaky)
    async with editor_and_relay(FakeServer(), FakeClock()) as (editor, relay):
        await editor.request("initialize", {}, 1)
        await editor.response(1)
        await editor.request("explode", {}, 2)
        failed = await editor.response(2)
        assert failed["error"]["code"] == -32603 and "RuntimeError" in \
            failed["error"]["message"]
        await editor.request("session/list", {}, 3)
        assert (await editor.response(3))["result"] == {"method": "session/list"}
    assert relay.exit_code == 0


def session_server(load_errors: list[dict[str, Any]]) -> FakeServer:
    """session/new makes "s1"; the re-attaching session/load is answered with the errors
    of ``load_errors`` in turn, then succeeds; a prompt is answered on the link after
    the first (it was running when the first was lost)."""

    async def answer(link: FakeLink, message: dict[str, Any]) -> None:
        method, rpc_id = message.get("method"), message.get("id")
        if method == "session/new":
            link.push({"jsonrpc": "2.0", "id": rpc_id, "result": {"sessionId": "s1"}})
        elif method == "session/load" and load_errors:
            link.push({"jsonrpc": "2.0", "id": rpc_id, "error": load_errors.pop(0)})
        elif method == "session/prompt" and server.connects == 1:
            return
        elif rpc_id is not None:
            await echo_result(link, message)

    server = FakeServer(answer=answer)
    return server


async def test_a_reattach_refused_for_now_is_retried_not_a_lost_session() -> None:
    """review7 #5: the server answers the re-attach with a temporary error (a store
    outage) more times than ``MAX_ATTEMPTS``: the link is made again until the re-attach
    succeeds, and the prompt in flight is answered, not failed with session_lost."""
    outage = {"code": -32603, "message": "journal unavailable",
              "data": {"errorKind": "store_unavailable"}}
    server = session_server([outage] * (MAX_ATTEMPTS + 1))
    async with editor_and_relay(server, FakeClock()) as (editor, relay):
        assert (await _open_session(editor))["result"] == {"sessionId": "s1"}
        await editor.request("session/prompt", {"sessionId": "s1", "prompt": "hi"}, 3)
        await _until(lambda: any(m.get("method") == "session/prompt"
                                 for m in server.received))
        server.lose_all()
        assert (await editor.response(3))["result"] == {"method": "session/prompt"}
    loads = [m for m in server.received if m.get("method") == "session/load"]
    assert len(loads) == MAX_ATTEMPTS + 2
    assert server.connects == MAX_ATTEMPTS + 3


async def test_a_reattach_refused_by_the_rate_limit_waits_on_the_same_link() -> None:
    """The principal's rate limit refuses the re-attach (each ``session/load`` is a
    mutation) more times than ``MAX_ATTEMPTS``: the adapter waits the server's
    ``retryAfterMs`` and asks again on the same link, never dropping it (a new link
    re-attached every session again, which a bucket refilled slower than the backoff
    never paid for: the adapter gave up on a server that was up)."""
    limited = {"code": -32600, "message": "Rate limit exceeded",
               "data": {"errorKind": "rate_limit_exceeded", "tier": "mutation",
                        "retryAfterMs": 2500}}
    server = session_server([limited] * (MAX_ATTEMPTS + 1))
    clock = FakeClock()
    async with editor_and_relay(server, clock, give_up_after_s=5) as (editor, relay):
        assert (await _open_session(editor))["result"] == {"sessionId": "s1"}
        await editor.request("session/prompt", {"sessionId": "s1", "prompt": "hi"}, 3)
        await _until(lambda: any(m.get("method") == "session/prompt"
                                 for m in server.received))
        server.lose_all()
        assert (await editor.response(3))["result"] == {"method": "session/prompt"}
    loads = [m for m in server.received if m.get("method") == "session/load"]
    assert len(loads) == MAX_ATTEMPTS + 2
    assert server.connects == 2                       # the link made again once
    assert clock.slept.count(2.5) == MAX_ATTEMPTS + 1   # the server's retryAfterMs
    assert relay.exit_code == 0


async def test_a_close_while_the_rate_limit_refuses_the_reattach_ends_the_waiting() -> None:
    """The editor closes a session whose re-attach the rate limit keeps refusing: the
    adapter stops asking (the session is being ended) and the close goes, answered.
    Before, it went on asking on the same link, with the close waiting behind it."""
    limited = {"code": -32600, "message": "Rate limit exceeded",
               "data": {"errorKind": "rate_limit_exceeded", "tier": "mutation",
                        "retryAfterMs": 2500}}
    server = session_server([limited] * 1_000_000)

    def loads() -> int:
        return sum(m.get("method") == "session/load" for m in server.received)

    async with editor_and_relay(server, FakeClock(), give_up_after_s=5) as (editor, relay):
        assert (await _open_session(editor))["result"] == {"sessionId": "s1"}
        server.lose_all()
        await _until(lambda: loads() >= 3)
        await editor.request("session/close", {"sessionId": "s1"}, 3)
        assert (await editor.response(3))["result"] == {"method": "session/close"}
        asked = loads()
        assert "s1" not in relay.book.sessions
        assert relay.exit_code == 0
    assert loads() == asked   # nothing more after the close
    assert [m.get("method") for m in server.received].count("session/close") == 1


async def test_a_reattach_answered_no_such_session_loses_the_session() -> None:
    server = session_server([{"code": -32602, "message": "Session not found: s1"}])
    async with editor_and_relay(server, FakeClock()) as (editor, relay):
        await _open_session(editor)
        await editor.request("session/prompt", {"sessionId": "s1", "prompt": "hi"}, 3)
        await _until(lambda: any(m.get("method") == "session/prompt"
                                 for m in server.received))
        server.lose_all()
        assert kind(await editor.response(3)) == "session_lost"
        assert "s1" not in relay.book.sessions


@pytest.mark.parametrize("method", ["session/close", "session/delete"])
async def test_a_close_sent_while_down_is_not_reattached_and_no_session_is_done(
        method: str) -> None:
    """review7 #14: a ``session/close`` (or ``session/delete``) the editor sends while
    the link is down does not re-attach the session it ends once the link is back; and
    the server's "no such session" to it (the session ended meanwhile: reaped, or the
    request's first copy took effect before the link dropped) is a success for the
    editor, whose session is gone either way."""
    ended: list[str] = []

    async def answer(link: FakeLink, message: dict[str, Any]) -> None:
        name, rpc_id = message.get("method"), message.get("id")
        if name == "session/new":
            link.push({"jsonrpc": "2.0", "id": rpc_id, "result": {"sessionId": "s1"}})
        elif name in ("session/close", "session/delete"):
            ended.append(name)
            link.push({"jsonrpc": "2.0", "id": rpc_id,
                       "error": {"code": -32602, "message": "Session not found: s1"}})
        elif rpc_id is not None:
            await echo_result(link, message)

    server = FakeServer(answer=answer)
    async with editor_and_relay(server, FakeClock(), give_up_after_s=10**9) as (editor, relay):
        await _open_session(editor)
        server.refusing = "server_unreachable"
        server.lose_all()
        await _until(lambda: server.refused > 0)
        await editor.request(method, {"sessionId": "s1"}, 3)
        await _until(lambda: any(c.method == method for c in relay.book.calls.values()))
        server.refusing = None
        assert (await editor.response(3))["result"] == {}
        assert ended == [method]
        assert "s1" not in relay.book.sessions
    assert not [m for m in server.received if m.get("method") in ("session/load",
                                                                   "session/resume")]


async def test_a_request_left_waiting_when_its_session_closes_is_answered() -> None:
    """A server that answers ``session/close`` without answering a prompt of that
    session first (ours answers them first): the prompt gets ``session_closed``, not
    silence for ever."""
    async def answer(link: FakeLink, message: dict[str, Any]) -> None:
        name, rpc_id = message.get("method"), message.get("id")
        if name == "session/new":
            link.push({"jsonrpc": "2.0", "id": rpc_id, "result": {"sessionId": "s1"}})
        elif name == "session/prompt":
            return   # never answered
        elif rpc_id is not None:
            link.push({"jsonrpc": "2.0", "id": rpc_id, "result": {}})

    server = FakeServer(answer=answer)
    async with editor_and_relay(server, FakeClock()) as (editor, relay):
        await _open_session(editor)
        await editor.request("session/prompt", {"sessionId": "s1", "prompt": "hi"}, 3)
        await _until(lambda: any(m.get("method") == "session/prompt"
                                 for m in server.received))
        await editor.request("session/close", {"sessionId": "s1"}, 4)
        assert (await editor.response(4))["result"] == {}
        assert kind(await editor.response(3)) == "session_closed"
        assert "s1" not in relay.book.sessions and not relay.book.calls


async def _until(condition: Any) -> None:
    with anyio.fail_after(10):
        while not condition():
            await anyio.lowlevel.checkpoint()


async def test_notifications_while_down_are_bounded_too(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """review7 #7: notifications and answers of the editor count against the bytes
    waiting for the link: past it they are dropped (one stderr line), a request is
    refused; what was queued goes out when the server is back."""
    from acp_server.connect import relay as relay_module

    monkeypatch.setattr(relay_module, "OUTBOX_BYTES", 10_000)
    server = FakeServer()
    async with editor_and_relay(server, FakeClock(), give_up_after_s=1e9) as (editor, relay):
        await editor.request("initialize", {}, 1)
        await editor.response(1)
        server.refusing = "server_unreachable"
        server.lose_all()
        for n in range(40):
            await editor.send({"jsonrpc": "2.0", "method": "note", "params": {
                "n": n, "text": "x" * 1000}})
            await editor.send({"jsonrpc": "2.0", "id": f"q{n}", "result": {"n": n}})
        await editor.request("session/list", {}, 2)
        assert kind(await editor.response(2)) == "queue_full"
        assert relay.outbox_bytes <= 10_000
        server.refusing = None
        await _until(lambda: not relay.outbox)
        await editor.request("session/list", {}, 3)
        assert "result" in await editor.response(3)
    notes = [m["params"]["n"] for m in server.received if m.get("method") == "note"]
    assert notes == list(range(len(notes))) and 5 <= len(notes) < 40
    dropped = [r for r in caplog.records if "dropping the editor's notifications" in r.message]
    assert len(dropped) == 1


async def test_a_session_whose_reattach_hangs_holds_no_other(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """review7 #12: after a reconnect the re-attach of one session is never answered:
    its prompt fails (reattach_timeout) and the session is kept; the other session is
    re-attached meanwhile and its prompt answered; the link stays."""
    from acp_server.connect import reattach

    monkeypatch.setattr(reattach, "REATTACH_TIMEOUT_S", 0.2)   # real seconds: the
    made = iter(["s1", "s2"])                                       # hang never ends

    async def answer(link: FakeLink, message: dict[str, Any]) -> None:
        method, rpc_id = message.get("method"), message.get("id")
        params = message.get("params", {})
        if method == "session/new":
            link.push({"jsonrpc": "2.0", "id": rpc_id, "result": {"sessionId": next(made)}})
        elif method == "session/load" and params["sessionId"] == "s1":
            return   # hangs
        elif method == "session/prompt" and server.connects == 1:
            return
        elif rpc_id is not None:
            await echo_result(link, message)

    server = FakeServer(answer=answer)
    async with editor_and_relay(server, FakeClock()) as (editor, relay):
        await editor.request("initialize", {}, 1)
        await editor.response(1)
        for rpc_id in (2, 3):
            await editor.request("session/new", {"cwd": "/w", "mcpServers": []}, rpc_id)
            await editor.response(rpc_id)
        await editor.request("session/prompt", {"sessionId": "s1", "prompt": "a"}, 4)
        await editor.request("session/prompt", {"sessionId": "s2", "prompt": "b"}, 5)
        await _until(lambda: len([m for m in server.received
                                  if m.get("method") == "session/prompt"]) == 2)
        server.lose_all()
        assert (await editor.response(5))["result"] == {"method": "session/prompt"}
        failed = await editor.response(4)
        assert kind(failed) == "reattach_timeout" and failed["error"]["data"]["sessionId"] == "s1"
        assert "s1" in relay.book.sessions
        await editor.request("session/list", {}, 6)
        assert "result" in await editor.response(6)
    assert server.connects == 2


@pytest.mark.parametrize("how", ["reattach", "event"])
async def test_a_question_of_an_epoch_the_server_lost_is_withdrawn(how: str) -> None:
    """The editor was asked a permission and has not answered; the link drops and the
    server comes back under a new event epoch for the session (it lost that history,
    e.g. a restart on a journal with a gap): told by the re-attach's ``resync`` or by
    an event of the new epoch, the adapter withdraws the question
    (``$/cancel_request``), once, and leaves the resume cursor alone."""

    def asked_under(epoch: str, event_id: int) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": "q1", "method": "session/request_permission",
                "params": {"sessionId": "s1", "options": [], "_meta": {"acp-server/event": {
                    "sessionId": "s1", "id": event_id, "epoch": epoch}}}}

    async def answer(link: FakeLink, message: dict[str, Any]) -> None:
        method, rpc_id = message.get("method"), message.get("id")
        if method == "session/new":
            link.push({"jsonrpc": "2.0", "id": rpc_id, "result": {"sessionId": "s1"}})
            link.push(asked_under("e1", 3))
        elif method == "session/load":
            events = {"eventEpoch": "e2", "lastEventId": 0}
            if how == "reattach":
                events["resync"] = "epoch_reset"
            link.push({"jsonrpc": "2.0", "id": rpc_id,
                       "result": {"_meta": {"acp-server/events": events}}})
            if how == "event":
                link.push({"jsonrpc": "2.0", "method": "session/update", "params": {
                    "sessionId": "s1", "update": {"sessionUpdate": "agent_message_chunk"},
                    "_meta": {"acp-server/event": {"sessionId": "s1", "id": 1,
                                                   "epoch": "e2"}}}})
        elif rpc_id is not None and method is not None:
            await echo_result(link, message)

    server = FakeServer(answer=answer)
    async with editor_and_relay(server, FakeClock()) as (editor, relay):
        await _open_session(editor)
        asked = await editor.until(lambda m: m.get("method") == "session/request_permission")
        assert asked["id"] == "q1" and "_meta" not in asked["params"]
        assert relay.book.cursor("s1") == (2, "e1")   # before the unanswered question
        server.lose_all()
        withdrawn = await editor.until(lambda m: m.get("method") == "$/cancel_request")
        assert withdrawn["params"] == {"requestId": "q1"}
        # the editor answers it, as ACP asks: passed on, harmlessly
        await editor.send({"jsonrpc": "2.0", "id": "q1", "error": {"code": -32800,
                                                                   "message": "cancelled"}})
        await editor.request("session/list", {}, 3)
        await editor.response(3)
        assert not relay.book.asked
        assert relay.book.cursor("s1")[1] == "e2"
        assert [m for m in editor.got if m.get("method") == "$/cancel_request"] == [withdrawn]


def _session_server(load_finds_it: bool) -> FakeServer:
    """``session/new`` makes ``s``; the first ``session/prompt`` of it is answered "no
    such session" (its agent died, the notice of it not sent yet); ``session/load``
    then finds it (``load_finds_it``) or not; a prompt after a load ends its turn."""
    state = {"loaded": False}

    async def answer(link: FakeLink, message: dict[str, Any]) -> None:
        method, rpc_id = message.get("method"), message.get("id")
        if method == "session/new":
            link.push({"jsonrpc": "2.0", "id": rpc_id, "result": {"sessionId": "s"}})
        elif method == "session/load":
            state["loaded"] = load_finds_it
            link.push({"jsonrpc": "2.0", "id": rpc_id, "result": {}} if load_finds_it else
                      {"jsonrpc": "2.0", "id": rpc_id,
                       "error": {"code": -32602, "message": 'No session with id "s"'}})
        elif method == "session/prompt" and not state["loaded"]:
            link.push({"jsonrpc": "2.0", "id": rpc_id,
                       "error": {"code": -32602, "message": 'No session with id "s"'}})
        elif method == "session/prompt":
            link.push({"jsonrpc": "2.0", "id": rpc_id, "result": {"stopReason": "end_turn"}})
        else:
            await echo_result(link, message)

    return FakeServer(answer=answer)


async def test_a_session_the_server_ended_is_loaded_again_and_the_request_sent_once_more(
        ) -> None:
    """Its agent died: the editor's next prompt of the session reached the server before
    the notice of the death reached the adapter, and was answered "no such session".
    The adapter loads the session (the server reseeds it) and sends the prompt once
    more; the editor gets its turn's end, never the refusal."""
    server = _session_server(load_finds_it=True)
    async with editor_and_relay(server, FakeClock()) as (editor, relay):
        await _open_session(editor)
        await editor.request("session/prompt", {"sessionId": "s", "prompt": []}, 3)
        assert (await editor.response(3))["result"] == {"stopReason": "end_turn"}
    methods = [m.get("method") for m in server.received if "method" in m]
    assert methods[-3:] == ["session/prompt", "session/load", "session/prompt"]
    assert relay.exit_code == 0


async def test_a_session_the_server_no_longer_has_is_lost_after_one_load() -> None:
    """The load finds nothing either: the prompt fails with ``session_lost`` (once: no
    loop), the session is forgotten, and a later request gets the server's own
    "no such session"."""
    server = _session_server(load_finds_it=False)
    async with editor_and_relay(server, FakeClock()) as (editor, relay):
        await _open_session(editor)
        await editor.request("session/prompt", {"sessionId": "s", "prompt": []}, 3)
        assert kind(await editor.response(3)) == "session_lost"
        await editor.request("session/prompt", {"sessionId": "s", "prompt": []}, 4)
        assert (await editor.response(4))["error"]["code"] == -32602
    methods = [m.get("method") for m in server.received if "method" in m]
    assert methods.count("session/load") == 1
    assert relay.exit_code == 0


async def test_invalid_params_of_a_session_are_not_taken_for_its_end() -> None:
    """``-32602`` for params that are merely invalid (not "No session …"): the editor
    gets it as it is, with no load and nothing sent twice."""
    async def answer(link: FakeLink, message: dict[str, Any]) -> None:
        if message.get("method") == "session/prompt":
            link.push({"jsonrpc": "2.0", "id": message["id"],
                       "error": {"code": -32602, "message": "Invalid params: prompt"}})
        elif message.get("method") == "session/new":
            link.push({"jsonrpc": "2.0", "id": message["id"], "result": {"sessionId": "s"}})
        else:
            await echo_result(link, message)

    server = FakeServer(answer=answer)
    async with editor_and_relay(server, FakeClock()) as (editor, relay):
        await _open_session(editor)
        await editor.request("session/prompt", {"sessionId": "s", "prompt": 3}, 3)
        assert (await editor.response(3))["error"]["message"] == "Invalid params: prompt"
    methods = [m.get("method") for m in server.received if "method" in m]
    assert methods.count("session/prompt") == 1 and "session/load" not in methods
    assert relay.exit_code == 0
