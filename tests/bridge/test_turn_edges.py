"""The edges of a turn that a hostile review found (helper-53, 2026-12-03), each once a
bug: a branch whose session closes or whose agent dies, a cancel that lands as its
turn ends, a permission left open by a turn that ended, a prompt id given twice, and a
closed session kept alive by its URL elicitation."""

from __future__ import annotations

import gc
from collections import deque
import weakref
from typing import Any

import anyio
import pytest

from bridge import Bridge, BridgeOptions
from bridge.errors import AgentDiedError, PromptIdInUseError, SessionClosedError
from tests.bridge.helpers import drain, envelope, open_bridge, text, wait_until

pytestmark = pytest.mark.anyio


class TurnAgent:
    """Each ``session/prompt`` waits for ``finish()`` or a ``session/cancel`` (which, in
    ACP, names the session: its current turn); records the cancels each turn got."""

    name = "turn"

    def __init__(self) -> None:
        self.closed = False
        self.current: dict[str, Any] | None = None
        self.cancelled_turns: list[str] = []
        self.client: Any = None
        self.tg: Any = None
        self.ask_during_turn = False
        self.asked = anyio.Event()

    async def connect(self, client: Any, tg: Any) -> TurnAgent:
        self.client, self.tg = client, tg
        return self

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        if method == "initialize":
            return {"protocolVersion": 1, "agentCapabilities": {}}
        if method == "session/new":
            return {"sessionId": "s1"}
        if method == "session/prompt":
            turn: dict[str, Any] = {"text": params["prompt"][0]["text"], "done": anyio.Event(),
                                    "stop": None}
            self.current = turn
            if self.ask_during_turn:   # a tool call's permission still open as it ends
                self.tg.start_soon(self._ask, params["sessionId"])
                await self.asked.wait()
                return {"stopReason": "end_turn"}
            await turn["done"].wait()
            return {"stopReason": turn["stop"]}
        return {}

    async def _ask(self, sid: str) -> None:
        await self.client.request_permission(sid, {
            "sessionId": sid, "toolCall": {"toolCallId": "t"},
            "options": [{"optionId": "y", "name": "y", "kind": "allow_once"}]})

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        turn = self.current
        if method == "session/cancel" and turn is not None and turn["stop"] is None:
            self.cancelled_turns.append(turn["text"])
            turn["stop"] = "cancelled"
            turn["done"].set()

    def finish(self, stop: str = "end_turn") -> None:
        turn = self.current
        assert turn is not None
        if turn["stop"] is None:
            turn["stop"] = stop
            turn["done"].set()

    async def aclose(self) -> None:
        self.closed = True


@pytest.mark.parametrize("end", ["close", "agent_death"])
async def test_a_branch_running_and_one_queued_fail_when_the_session_ends(
        tmp_path: Any, end: str) -> None:
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        agent.hang_new = anyio.Event()   # session/fork hangs
        outcomes: dict[str, BaseException | object] = {}

        async def branch(tag: str) -> None:
            try:
                outcomes[tag] = await bridge.branch_session(sid)
            except Exception as exc:   # noqa: BLE001 - what the caller gets
                outcomes[tag] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(branch, "running")
            await wait_until(lambda: any(m == "session/fork" for m, _ in agent.calls))
            tg.start_soon(branch, "queued")
            await wait_until(lambda: len(bridge.get_session(sid)._work) == 1)
            if end == "close":
                await bridge.close_session(sid)
            else:
                agent.die()
            await wait_until(lambda: len(outcomes) == 2)
        expected = SessionClosedError if end == "close" else AgentDiedError
        assert all(isinstance(o, expected) for o in outcomes.values()), outcomes
        assert bridge.capacity.taken == 0


async def test_a_cancel_that_lands_as_its_turn_ends_never_cancels_the_next(
        anyio_backend: str) -> None:
    agent = TurnAgent()
    async with Bridge(agent, workspace_cwd="/tmp") as bridge:
        sid = (await bridge.create_session()).session_id
        for _ in range(5):
            a = bridge.send_prompt(sid, text("A"))
            await wait_until(lambda: agent.current is not None and agent.current["text"] == "A")
            b = bridge.send_prompt(sid, text("B"))
            agent.finish()   # A's answer, and in the same step the client's cancel of A
            a.cancel("client_cancel")
            await wait_until(lambda: agent.current is not None and agent.current["text"] == "B")
            await wait_until(lambda: bridge.get_session(sid).active is not None)
            agent.finish()
            assert (await b).stop_reason == "end_turn"
            assert (await a).stop_reason in ("end_turn", "cancelled")
            assert "B" not in agent.cancelled_turns


async def test_a_permission_left_open_by_its_turn_is_cancelled_when_the_turn_ends() -> None:
    agent = TurnAgent()
    agent.ask_during_turn = True
    options = BridgeOptions(session_idle_timeout_ms=1, session_reap_interval_ms=0)
    async with Bridge(agent, workspace_cwd="/tmp", options=options) as bridge:
        sid = (await bridge.create_session()).session_id
        sub = bridge.subscribe(sid)
        ticket = bridge.send_prompt(sid, text("go"))
        await wait_until(lambda: bridge.permissions.pending_count == 1)
        agent.asked.set()
        assert (await ticket).stop_reason == "end_turn"
        assert bridge.session_status(sid).pending_permissions == 0
        frames = drain(sub)
        [resolved] = [envelope(f).data for f in frames if f.type == "permission_resolved"]
        assert resolved["reason"] == "turn_ended"
        assert resolved["outcome"] == {"outcome": "cancelled"}
        kinds = [f.type for f in frames]   # resolved before the turn's end is published
        assert kinds.index("permission_resolved") < kinds.index("turn_complete")
        sub.close()   # nothing pins the idle session any more: the reaper takes it
        reaped: list[str] = []
        with anyio.fail_after(30):
            while not reaped:
                reaped = await bridge.reap_idle_sessions()
                await anyio.sleep(0.001)   # its idle time: 1 ms
        assert reaped == [sid]


async def test_a_prompt_id_still_pending_is_refused(tmp_path: Any) -> None:
    async with open_bridge(tmp_path, max_pending_prompts_per_session=2) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        first = bridge.send_prompt(sid, text("hold a"), prompt_id="p")
        with pytest.raises(PromptIdInUseError):
            bridge.send_prompt(sid, text("hold b"), prompt_id="p")
        assert bridge.session_status(sid).pending_prompts == 1
        agent.release("a")
        assert (await first).stop_reason == "end_turn"
        again = bridge.send_prompt(sid, text("hold c"), prompt_id="p")   # settled: free
        agent.release("c")
        assert (await again).stop_reason == "end_turn"
        assert bridge.session_status(sid).pending_prompts == 0


class _ElsewhereAgent:
    """An agent in another process as ``bridge.turn`` sees it (``out_of_process``):
    ``initialize`` and ``session/new`` answered (ids ``<PREFIX><n>``), a prompt by
    ``prompt`` (a subclass's), anything else ``{}``."""

    name = "elsewhere"
    out_of_process = True
    PREFIX = "s"

    def __init__(self) -> None:
        self.closed = False
        self.made = 0
        self.client: Any = None

    async def connect(self, client: Any, tg: Any) -> Any:
        self.client = client
        return self

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        if method == "initialize":
            return {"protocolVersion": 1, "agentCapabilities": {}}
        if method == "session/new":
            self.made += 1
            return {"sessionId": f"{self.PREFIX}{self.made}"}
        if method == "session/prompt":
            return await self.prompt(params)
        return {}

    async def prompt(self, params: dict[str, Any]) -> Any:
        return {"stopReason": "end_turn"}

    async def notify(self, method: str, params: Any) -> None:
        pass

    async def aclose(self) -> None:
        self.closed = True


class ElicitingAgent(_ElsewhereAgent):
    """Each turn asks a URL elicitation the user never finishes, then ends (in
    process)."""

    name = "e"
    out_of_process = False

    async def prompt(self, params: dict[str, Any]) -> Any:
        sid = params["sessionId"]
        with anyio.move_on_after(0):
            await self.client.create_elicitation(sid, {
                "sessionId": sid, "mode": "url", "elicitationId": f"el-{sid}",
                "url": "https://example.invalid", "message": "m"})
        return {"stopReason": "end_turn"}


async def test_a_closed_session_is_not_kept_alive_by_its_url_elicitation() -> None:
    async with Bridge(ElicitingAgent(), workspace_cwd="/tmp") as bridge:
        refs = []
        for _ in range(5):
            sid = (await bridge.create_session()).session_id
            await bridge.send_prompt(sid, text("go"))
            refs.append(weakref.ref(bridge.get_session(sid)))
            await bridge.close_session(sid)
        assert bridge.elicitations.session_of("el-s1") == "s1"   # still completes by id
        # each one's worker ends at its next checkpoint; then nothing holds it
        await wait_until(lambda: gc.collect() >= 0 and all(r() is None for r in refs))


@pytest.mark.parametrize("when", ["queued", "forking"])
async def test_a_branch_whose_caller_left_makes_no_session(tmp_path: Any, when: str) -> None:
    """helper-51: a client gone while its branch waited kept the fork anyway, a live
    session nobody knew of, holding a slot until the idle reaper."""
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        agent.hang_new = anyio.Event()   # session/fork waits for it
        async with anyio.create_task_group() as tg:
            if when == "queued":   # behind another branch of the session
                tg.start_soon(bridge.branch_session, sid)
                await wait_until(lambda: any(m == "session/fork" for m, _ in agent.calls))
            with anyio.CancelScope() as waiter:
                async def leaves() -> None:
                    await wait_until(lambda: len(bridge.get_session(sid)._work) == 1
                                     or sum(m == "session/fork" for m, _ in agent.calls) == 1)
                    waiter.cancel()

                tg.start_soon(leaves)
                await bridge.branch_session(sid)
            assert waiter.cancelled_caught
            agent.hang_new.set()   # the fork(s) the agent was making come back
        kept = 2 if when == "queued" else 1   # the first branch's caller still waits
        await wait_until(lambda: bridge._in_flight_spawns == 0
                         and bridge.get_session(sid)._work == deque()
                         and len(bridge.sessions()) == kept == bridge.capacity.taken)
        # the queued one never reached the agent; a fork made as its caller left is closed
        assert sum(m == "session/fork" for m, _ in agent.calls) == 1
        if when == "forking":   # told in the background (``close_session_soon``)
            await wait_until(lambda: any(m == "session/close" for m, _ in agent.calls))


class IgnoringAgent(_ElsewhereAgent):
    """It never answers a prompt and ignores every cancel; ``waiting`` counts the
    ``session/prompt`` requests still awaited from it."""

    name = "ignoring"

    def __init__(self) -> None:
        super().__init__()
        self.waiting = 0

    async def prompt(self, params: dict[str, Any]) -> Any:
        self.waiting += 1
        try:
            await anyio.sleep_forever()
        finally:
            self.waiting -= 1


@pytest.mark.parametrize("cancelled_first", [True, False])
async def test_a_closed_sessions_turn_is_not_awaited_for_ever(tmp_path: Any,
                                                              cancelled_first: bool) -> None:
    """A session closed with a turn its agent never ends (given up on after a cancel's
    grace, or running at the close): the agent gets ``cancel_grace_ms`` more to answer,
    then the prompt's request is given up. It was awaited until the agent answered or
    died, a task and a pending request per session closed, for ever."""
    agent = IgnoringAgent()
    options = BridgeOptions(cancel_grace_ms=50)
    async with Bridge(agent, workspace_cwd=str(tmp_path), options=options) as bridge:
        for _ in range(3):
            sid = (await bridge.create_session()).session_id
            ticket = bridge.send_prompt(sid, text("hello"))
            await wait_until(lambda: agent.waiting == 1)
            if cancelled_first:
                await bridge.cancel_session(sid)
                assert (await ticket).stop_reason == "cancelled"
                assert bridge.get_session(sid).straggler is not None
            await bridge.close_session(sid)
            if not cancelled_first:
                with pytest.raises(SessionClosedError):
                    await ticket
            await wait_until(lambda: agent.waiting == 0, timeout=10)


class OrderedAgent(_ElsewhereAgent):
    """``log`` is what it was sent, in order (``prompt <text>``, ``cancel``); the
    ``first`` prompt of a session is answered only once ``release`` is set, every other
    at once."""

    name = "ordered"
    PREFIX = "o"

    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []
        self.release = anyio.Event()

    async def prompt(self, params: dict[str, Any]) -> Any:
        said = params["prompt"][0]["text"]
        self.log.append(f"prompt {said}")
        if said == "first":
            await self.release.wait()
        return {"stopReason": "end_turn"}

    async def notify(self, method: str, params: Any) -> None:
        if method == "session/cancel":
            self.log.append("cancel")


async def _second_behind_a_straggler(bridge: Bridge, agent: OrderedAgent
                                     ) -> tuple[str, anyio.Event, Any]:
    """A new session whose ``first`` prompt was cancelled and given up on (the agent
    still holds it: the session's straggler) and whose ``second`` waits for it, its
    turn started: (the session's id, the straggler, the second prompt's ticket)."""
    agent.log.clear()
    agent.release = anyio.Event()
    sid = (await bridge.create_session()).session_id
    session = bridge.get_session(sid)
    first = bridge.send_prompt(sid, text("first"))
    await wait_until(lambda: agent.log == ["prompt first"])
    await bridge.cancel_session(sid)
    assert (await first).stop_reason == "cancelled"   # given up on: a straggler
    straggler = session.straggler
    assert straggler is not None
    second = bridge.send_prompt(sid, text("second"))   # waits for the straggler
    await wait_until(lambda: session.active is not None)
    return sid, straggler, second


async def test_a_cancel_never_reaches_the_agent_before_its_prompt(tmp_path: Any) -> None:
    """A cancel of the prompt that was waiting for a turn given up on, made as that
    prompt goes out: the agent gets ``session/prompt`` first, then ``session/cancel``
    (ACP: a cancel names the session's running turn). The prompt went out from a task of
    its own, so on trio (which runs a batch of tasks in random order) the cancel went
    first about one time in four, and the agent ran the whole turn it was never told to
    stop."""
    options = BridgeOptions(cancel_grace_ms=10)
    async with Bridge(agent := OrderedAgent(), workspace_cwd=str(tmp_path),
                      options=options) as bridge:
        for _ in range(40):
            sid, straggler, second = await _second_behind_a_straggler(bridge, agent)

            async def cancel_as_it_goes(ended: anyio.Event = straggler) -> None:
                await ended.wait()   # woken with the second prompt's turn
                await bridge.cancel_session(sid)

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_as_it_goes)
                await wait_until(lambda: len(agent.log) == 2)   # the first's cancel
                agent.release.set()
            await second
            await bridge.close_session(sid)
            sent = agent.log[2:]
            assert sent in ([], ["prompt second"], ["prompt second", "cancel"]), agent.log


async def test_a_prompt_whose_session_closed_as_it_went_out_is_not_sent(tmp_path: Any) -> None:
    """A session closed as its prompt goes out (the prompt's own task not run yet): the
    agent is not sent a prompt for a session that is gone (it was, and ran that turn
    with nobody to read it)."""
    agent = OrderedAgent()
    after_close: list[str] = []
    request = agent.request

    async def checked(method: str, params: dict[str, Any]) -> Any:
        if method == "session/prompt" and not bridge.has_session(params["sessionId"]):
            after_close.append(params["prompt"][0]["text"])
        return await request(method, params)

    agent.request = checked  # type: ignore[method-assign]
    async with Bridge(agent, workspace_cwd=str(tmp_path),
                      options=BridgeOptions(cancel_grace_ms=10)) as bridge:
        for _ in range(10):
            sid, straggler, second = await _second_behind_a_straggler(bridge, agent)

            async def close_as_it_goes(ended: anyio.Event = straggler) -> None:
                await ended.wait()   # woken with the second prompt's turn
                await bridge.close_session(sid)

            async with anyio.create_task_group() as tg:
                tg.start_soon(close_as_it_goes)
                await wait_until(lambda: len(agent.log) == 2)
                agent.release.set()
            with pytest.raises(SessionClosedError):
                await second
    assert after_close == []
