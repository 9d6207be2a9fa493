"""The console's transcript (``/web/transcript.js``) in chromium, fed the bus events an
agent may send that the reference agent does not: thoughts, plans, tool call updates,
non-text content; and agent text that looks like markup stays text."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import Page

from tests.web.conftest import Console

RENDER = """async (events) => {
  const { Transcript } = await import('/web/transcript.js');
  const t = new Transcript();
  document.body.replaceChildren(t.node);
  for (const [type, event] of events) t.add(type, event);
  return [...t.node.children].map((n) => [n.dataset.testid || n.className, n.innerText,
                                          n.dataset.status || null]);
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
        ("turn_error", {"type": "turn_error", "data": {"code": "-32603", "message": "boom"}}),
    ]
    blocks = page.evaluate(RENDER, events)
    assert blocks == [
        ["msg-user", "You\nfix it", None],
        ["msg-thought", "Thinking\nLet me think.", None],
        ["plan", "Plan\nread — completed\nwrite — pending", None],   # replaced in place
        ["tool-call", "ToolRead a.pyreadcompleted", "completed"],
        ["msg-agent", "Agent\n<img src=x onerror=alert(1)>[a.py]", None],
        ["note error", "turn failed: -32603: boom", None],
    ]
    assert page.locator("img").count() == 0   # agent text is never markup


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
        ["msg-agent", "Agent\nnew", None],
    ]
