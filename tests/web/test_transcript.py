"""The console's transcript (``/web/transcript.js``) in chromium, fed the bus events an
agent may send that the reference agent does not: thoughts, plans, tool call updates,
non-text content; raw HTML in agent text stays text; each prompt's events in its own
block, a queued prompt dropped before it ran shown as dropped."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import Page

from tests.web.conftest import Console

RENDER = """async (events) => {
  const { Transcript } = await import('/web/transcript.js');
  const t = new Transcript();
  document.body.replaceChildren(t.node);
  for (const [type, event] of events) t.add(type, event);
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  const block = (n) => [n.dataset.testid || n.className, n.innerText, n.dataset.status || null];
  return [...t.node.children].map((n) => n.dataset.testid === 'turn'
    ? ['turn', n.dataset.promptId, n.dataset.state, [...n.children].map(block)] : block(n));
}"""


def update(prompt: str, **u: Any) -> tuple[str, dict[str, Any]]:
    return ("session_update", {"type": "session_update", "promptId": prompt,
                               "data": {"sessionId": "s", "update": u}})


def test_thoughts_plans_tools_and_content(console: Console, page: Page) -> None:
    page.goto(console.url("/web/transcript.js"))
    text = lambda t: {"type": "text", "text": t}  # noqa: E731
    events = [
        update("p1", sessionUpdate="user_message_chunk", content=text("fix it")),
        update("p1", sessionUpdate="agent_thought_chunk", content=text("Let me ")),
        update("p1", sessionUpdate="agent_thought_chunk", content=text("think.")),
        update("p1", sessionUpdate="plan", entries=[{"content": "read", "status": "pending"}]),
        update("p1", sessionUpdate="tool_call", toolCallId="t1", title="Read a.py", kind="read",
               status="pending"),
        update("p1", sessionUpdate="plan", entries=[{"content": "read", "status": "completed"},
                                                     {"content": "write", "status": "pending"}]),
        update("p1", sessionUpdate="tool_call_update", toolCallId="t1", status="completed"),
        update("p1", sessionUpdate="agent_message_chunk", content=text("<img src=x onerror=alert(1)>")),
        update("p1", sessionUpdate="agent_message_chunk",
               content={"type": "resource_link", "uri": "file:///a.py", "name": "a.py"}),
        update("p1", sessionUpdate="usage_update", used=10),
        ("turn_error", {"type": "turn_error", "promptId": "p1",
                        "data": {"code": "-32603", "message": "boom"}}),
    ]
    blocks = page.evaluate(RENDER, events)
    assert blocks == [["turn", "p1", "failed", [
        ["msg-user", "You\nfix it", None],
        ["msg-thought", "Thinking\nLet me think.", None],
        ["plan", "Plan\nread — completed\nwrite — pending", None],   # replaced in place
        ["tool-call", "ToolRead a.pyreadcompleted", "completed"],
        ["msg-agent", "Agent\n\n<img src=x onerror=alert(1)>[a.py]", None],
        ["note error", "turn failed: -32603: boom", None],
    ]]]
    assert page.locator("img").count() == 0   # raw HTML in agent text is shown as text


def test_resync_starts_over_with_a_notice(console: Console, page: Page) -> None:
    page.goto(console.url("/web/transcript.js"))
    blocks = page.evaluate(RENDER, [
        update("p1", sessionUpdate="agent_message_chunk", content={"type": "text", "text": "old"}),
        ("state_resync_required", {"type": "state_resync_required", "data": {
            "reason": "epoch_reset", "lastDeliveredId": 40, "earliestAvailableId": 1}}),
        update("p2", sessionUpdate="agent_message_chunk", content={"type": "text", "text": "new"}),
    ])
    assert blocks == [
        ["resync-notice", "Events before #1 are no longer available (epoch_reset); "
                          "the transcript starts there.", None],
        ["turn", "p2", "running", [["msg-agent", "Agent\n\nnew", None]]],
    ]


def _event(kind: str, prompt: str, **data: Any) -> tuple[str, dict[str, Any]]:
    return (kind, {"type": kind, "promptId": prompt, "data": {"sessionId": "s", **data}})


def test_each_event_goes_under_its_own_prompt_and_a_drop_is_a_drop(console: Console,
                                                                    page: Page) -> None:
    """The bus order of a running prompt r with q1, q2 queued behind it, q1 dropped: q1's
    cancel and turn end are q1's, shown as dropped; r goes on and completes."""
    page.goto(console.url("/web/transcript.js"))
    text = {"type": "text", "text": "slow one"}
    blocks = page.evaluate(RENDER, [
        update("r", sessionUpdate="user_message_chunk", content=text),
        _event("pending_prompt_added", "q1", promptId="q1", text="queued one", queuedAt=1),
        _event("pending_prompt_added", "q2", promptId="q2", text="queued two", queuedAt=2),
        _event("prompt_cancelled", "q1", reason="removed"),
        _event("turn_complete", "q1", stopReason="cancelled", promptId="q1"),
        _event("pending_prompt_completed", "q1", promptId="q1", state="removed"),
        update("r", sessionUpdate="agent_message_chunk", content={"type": "text", "text": "Done."}),
        _event("turn_complete", "r", stopReason="end_turn", promptId="r"),
        _event("pending_prompt_started", "q2", promptId="q2", text="queued two"),
        update("q2", sessionUpdate="user_message_chunk", content={"type": "text", "text": "queued two"}),
    ])
    assert blocks == [
        ["turn", "r", "completed", [["msg-user", "You\nslow one", None],
                                    ["msg-agent", "Agent\n\nDone.", None],
                                    ["note", "turn ended: end_turn", None]]],
        ["turn", "q1", "dropped", [["msg-dropped", "You dropped\nqueued one", None],
                                   ["turn-dropped", "dropped from the queue before it ran", None]]],
        ["turn", "q2", "running", [["msg-user", "You\nqueued two", None]]],
    ]


def test_a_drop_is_a_drop_when_the_page_never_saw_the_prompt_queued(console: Console,
                                                                     page: Page) -> None:
    """After a resync (or any start past a prompt's ``pending_prompt_added``), the
    cancel with reason ``removed`` still says the prompt was dropped before it ran,
    and its turn end does not turn it into a cancelled turn."""
    page.goto(console.url("/web/transcript.js"))
    blocks = page.evaluate(RENDER, [
        ("state_resync_required", {"type": "state_resync_required", "data": {
            "reason": "ring_evicted", "lastDeliveredId": 0, "earliestAvailableId": 7}}),
        _event("prompt_cancelled", "q1", reason="removed"),
        _event("turn_complete", "q1", stopReason="cancelled", promptId="q1"),
        _event("prompt_cancelled", "r", reason="client_cancel"),
        _event("turn_complete", "r", stopReason="cancelled", promptId="r"),
    ])
    assert blocks == [
        ["resync-notice", "Events before #7 are no longer available (ring_evicted); "
                          "the transcript starts there.", None],
        ["turn", "q1", "dropped", [["turn-dropped", "dropped from the queue before it ran",
                                    None]]],
        ["turn", "r", "cancelled", [["note", "cancel requested (client_cancel)", None],
                                    ["note", "turn ended: cancelled", None]]],
    ]


def test_an_agent_given_up_on_is_a_notice(console: Console, page: Page) -> None:
    """``agent_abandoned``: the server's message, as a notice of the session."""
    page.goto(console.url("/web/transcript.js"))
    message = ("agent 'gated' did not end the cancelled turn within 400 ms of its grace: "
               "its process was stopped; the next prompt runs on the session restored anew")
    blocks = page.evaluate(RENDER, [
        _event("turn_complete", "r", stopReason="cancelled", promptId="r"),
        _event("agent_abandoned", "r", action="agent_stopped", waitedMs=400, message=message,
               promptId="r"),
    ])
    assert blocks == [
        ["turn", "r", "cancelled", [["note", "turn ended: cancelled", None]]],
        ["abandoned-notice", message, None],
    ]
