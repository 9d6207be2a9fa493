"""The web console against a live ``acp-server serve``, in Debian's chromium: sessions,
the streamed transcript and its replay, permissions, the queue against the cap, the
503, LMSP tasks, the token, and no console errors on any view."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.web.conftest import DESKTOP, PHONE, Console, open_page, running_console

SLEEP = "/sleep 60s hold"
MARKDOWN = ("Here is the plan:\n\n- one **bold** step\n- [a link](https://example.com/)\n\n"
            "```python\nprint('hi')\n```\n\n<img src=x onerror=alert(1)> "
            "<script>window.__pwned = 1</script> [js](javascript:window.__pwned=2)")
WRITE_SCREENSHOTS_ENV = "ACP_SERVER_SCREENSHOTS"   # a folder: the README's pictures


def open_session(page: Page, console: Console, sid: str) -> None:
    page.goto(console.url(f"/#/session/{sid}"))
    expect(page.get_by_test_id("stream-state")).to_have_text("live")


def send(page: Page, text: str) -> None:
    page.get_by_test_id("prompt-input").fill(text)
    page.get_by_test_id("send-prompt").click()


def test_new_session_takes_you_into_it_with_the_prompt_box_focused(console: Console,
                                                                     page: Page) -> None:
    page.goto(console.url("/"))
    expect(page.get_by_test_id("agent-select")).to_have_value("reference")
    page.get_by_test_id("new-session").click()
    expect(page).to_have_url(re.compile(r"/#/session/[0-9a-f-]{36}$"))
    sid = page.url.rsplit("/", 1)[1]
    assert console.client.get(f"/session/{sid}/status").status_code == 200
    expect(page.get_by_test_id("prompt-input")).to_be_focused()
    expect(page.get_by_test_id("queue-depth")).to_have_text("0 / 5")
    page.keyboard.type("typed straight away")
    page.keyboard.press("Control+Enter")
    expect(page.get_by_test_id("transcript").get_by_test_id("msg-agent")).to_have_text(
        "AgentEcho: typed straight away")
    page.get_by_test_id("nav-sessions").click()
    expect(page.locator(f'[data-testid=session-row][data-session-id="{sid}"]')).to_have_count(1)
    console.client.delete(f"/session/{sid}")


def test_delete_asks_first(console: Console, page: Page) -> None:
    sid = console.session()
    page.goto(console.url("/"))
    row = page.locator(f'[data-testid=session-row][data-session-id="{sid}"]')
    row.get_by_test_id("delete-session").click()
    dialog = page.get_by_test_id("confirm")
    expect(dialog).to_be_visible()
    expect(page.get_by_test_id("confirm-text")).to_contain_text(f"Delete session {sid[:8]}")
    expect(page.get_by_test_id("confirm-cancel")).to_be_focused()   # Enter does not delete
    page.get_by_test_id("confirm-cancel").click()
    expect(dialog).to_be_hidden()
    expect(row).to_have_count(1)
    assert console.client.get(f"/session/{sid}/status").status_code == 200
    row.get_by_test_id("delete-session").click()
    page.get_by_test_id("confirm-ok").click()
    expect(row).to_have_count(0)
    assert console.client.get(f"/session/{sid}/status").status_code == 404


def test_sessions_made_by_programs_are_marked_and_hidden_by_default(console: Console,
                                                                    page: Page) -> None:
    mine = console.session()
    robot = console.client.post("/session", json={
        "sessionScope": "thread", "_meta": {"acp-server/origin": "conformance"}}).json()["sessionId"]
    task = console.client.post("/lmsp/v1/tasks", json={
        "type": "response", "input": {"model": "reference", "input": "/sleep 60s held"}}).json()
    page.goto(console.url("/"))
    expect(page.locator(f'[data-session-id="{mine}"]')).to_have_count(1)
    expect(page.locator(f'[data-session-id="{robot}"]')).to_have_count(0)
    expect(page.get_by_test_id("hidden-sessions")).to_contain_text("hidden")
    origins = {s["origin"] for s in console.client.get(
        f"/workspace/{console.workspace_id()}/sessions?size=100").json()["sessions"]}
    assert {"conformance", "lmsp"} <= origins
    page.get_by_test_id("show-all-sessions").check()
    expect(page.locator(f'[data-session-id="{robot}"]').get_by_test_id("row-origin")).to_have_text(
        "conformance")
    expect(page.locator("[data-testid=row-origin]", has_text="lmsp")).to_have_count(1)
    page.reload()   # the choice is kept for the tab
    expect(page.locator(f'[data-session-id="{robot}"]')).to_have_count(1)
    page.get_by_test_id("show-all-sessions").uncheck()
    expect(page.locator(f'[data-session-id="{robot}"]')).to_have_count(0)
    console.client.post(f"/lmsp/v1/tasks/{task['id']}/cancel")
    for sid in (mine, robot):
        console.client.delete(f"/session/{sid}")


def test_a_reply_streams_into_the_transcript(console: Console, page: Page) -> None:
    sid = console.session()
    open_session(page, console, sid)
    words = " ".join(f"word{i}" for i in range(40))
    send(page, f"/chunks 40 {words}")
    transcript = page.get_by_test_id("transcript")
    expect(transcript.get_by_test_id("msg-user")).to_have_text(f"You/chunks 40 {words}")
    # 40 agent_message_chunk updates join one agent message, in order, under the prompt.
    expect(transcript.get_by_test_id("msg-agent")).to_have_text(f"AgentEcho: {words}")
    expect(transcript.get_by_text("turn ended: end_turn")).to_be_visible()
    expect(page.get_by_test_id("prompt-input")).to_have_value("")


def test_a_permission_is_answered_from_the_page(console: Console, page: Page) -> None:
    sid = console.session()
    open_session(page, console, sid)
    send(page, "/permission may I")
    request = page.get_by_test_id("permission-request")
    expect(request).to_have_count(1)
    # The reference agent's kind is "other": said in words, not as a bare badge.
    expect(request.get_by_test_id("permission-kind")).to_have_text("unclassified tool")
    expect(request.get_by_test_id("permission-kind-explain")).to_contain_text(
        "the agent did not say what kind of tool this is")
    options = request.get_by_test_id("permission-option")
    assert [o.get_attribute("data-option-id") for o in options.all()] == [
        "allow_once", "allow_always", "reject_once"]
    assert console.client.get(f"/session/{sid}/status").json()["isWaitingForPermission"]
    request.locator('[data-option-id="allow_always"]').click()
    expect(request).to_have_count(0)
    transcript = page.get_by_test_id("transcript")
    expect(transcript.get_by_text("permission allow_always")).to_be_visible()
    # The agent itself says which option reached it.
    expect(transcript.get_by_test_id("msg-agent")).to_contain_text(
        "Permission allowed (allow_always).")
    expect(transcript.get_by_test_id("msg-agent")).to_contain_text("Echo: may I")
    assert not console.client.get(f"/session/{sid}/status").json()["isWaitingForPermission"]


def test_a_dropped_prompt_is_shown_as_dropped_under_itself(console: Console, page: Page) -> None:
    sid = console.session()
    open_session(page, console, sid)
    cancel = page.get_by_test_id("cancel-prompt")
    expect(cancel).to_be_disabled()                       # nothing runs
    for i in range(3):
        send(page, f"{SLEEP} {i}")
    expect(page.get_by_test_id("queue-depth")).to_have_text("3 / 5")
    queued = page.locator("[data-testid=pending-prompt][data-state=queued]")
    expect(queued).to_have_count(2)
    running = page.locator("[data-testid=pending-prompt][data-state=running]")
    expect(running).to_have_count(1)
    running_id = running.get_attribute("data-prompt-id")
    dropped = queued.first.get_attribute("data-prompt-id")
    queued.first.get_by_test_id("drop-prompt").click()
    expect(page.get_by_test_id("queue-depth")).to_have_text("2 / 5")
    pending = console.client.get(f"/session/{sid}/pending-prompts").json()["pendingPrompts"]
    assert len(pending) == 2 and dropped not in {p["promptId"] for p in pending}
    # The drop is shown under the dropped prompt, as a drop; the running one is untouched.
    dropped_turn = page.locator(f'[data-testid=turn][data-prompt-id="{dropped}"]')
    expect(dropped_turn).to_have_attribute("data-state", "dropped")
    expect(dropped_turn.get_by_test_id("turn-dropped")).to_have_text(
        "dropped from the queue before it ran")
    expect(dropped_turn).not_to_contain_text("turn ended")
    running_turn = page.locator(f'[data-testid=turn][data-prompt-id="{running_id}"]')
    expect(running_turn).to_have_attribute("data-state", "running")
    expect(running_turn).not_to_contain_text("cancel")
    # Cancel running: enabled now, says what it did, acts on the running prompt only.
    expect(cancel).to_be_enabled()
    cancel.click()
    expect(page.get_by_test_id("cancel-feedback")).to_have_text("The prompt was cancelled.")
    expect(running_turn).to_have_attribute("data-state", "cancelled")
    expect(running_turn.get_by_text("turn ended: cancelled")).to_be_visible()
    expect(page.get_by_test_id("transcript").get_by_text("turn ended: cancelled")).to_have_count(1)
    expect(page.get_by_test_id("queue-depth")).to_have_text("1 / 5")   # the last one runs
    console.client.delete(f"/session/{sid}")


def test_a_refused_prompt_is_said_once_above_the_fold_and_clears_itself(console: Console,
                                                                         page: Page) -> None:
    sid = console.session()
    for i in range(5):
        assert console.prompt(sid, f"{SLEEP} {i}").status_code == 202
    open_session(page, console, sid)
    expect(page.get_by_test_id("queue-depth")).to_have_text("5 / 5")
    send(page, "one too many")
    error = page.get_by_test_id("prompt-error")
    expect(error).to_have_text("Queue full — 5 of 5 prompts pending (503 prompt_queue_full). "
                               "Retry in 5 s, or when a prompt ends; your prompt is still in the box.")
    expect(error).to_be_in_viewport(ratio=1.0)            # 1280 × 800: no scrolling to see it
    expect(page.get_by_test_id("prompt-input")).to_be_in_viewport(ratio=1.0)
    expect(page.get_by_test_id("prompt-input")).to_have_value("one too many")   # kept to retry
    queued = console.client.get(f"/session/{sid}/pending-prompts").json()["pendingPrompts"][-1]
    console.client.delete(f"/session/{sid}/pending-prompts/{queued['promptId']}")
    expect(page.get_by_test_id("queue-depth")).to_have_text("4 / 5")
    expect(error).to_be_hidden()                          # room again: the notice is gone
    page.get_by_test_id("send-prompt").click()            # and the kept prompt goes in
    expect(page.get_by_test_id("queue-depth")).to_have_text("5 / 5")
    expect(page.get_by_test_id("prompt-input")).to_have_value("")
    console.client.delete(f"/session/{sid}")


def test_agent_messages_are_markdown_sanitized_and_only_the_streaming_one_rerenders(
        console: Console, browser: Browser) -> None:
    page = open_page(browser)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    try:
        sid = console.session()
        open_session(page, console, sid)
        send(page, MARKDOWN)
        message = page.get_by_test_id("transcript").get_by_test_id("msg-agent")
        expect(message.locator("li")).to_have_count(2)
        expect(message.locator("strong")).to_have_text("bold")
        link = message.locator("a", has_text="a link")
        expect(link).to_have_attribute("href", "https://example.com/")
        expect(link).to_have_attribute("target", "_blank")
        expect(link).to_have_attribute("rel", "noopener noreferrer")
        expect(message.locator("pre code")).to_have_text("print('hi')\n")
        message.get_by_test_id("copy-code").click()
        expect(message.get_by_test_id("copy-code")).to_have_text("Copied")
        assert page.evaluate("navigator.clipboard.readText()") == "print('hi')\n"
        # Nothing an agent writes becomes script or a handler; raw HTML is text.
        assert message.locator("script, img, iframe, [onerror], [onclick], a[href^=javascript]").count() == 0
        expect(message).to_contain_text("<img src=x onerror=alert(1)>")
        assert page.evaluate("window.__pwned === undefined")
        csp = console.client.get("/").headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        # Streaming re-renders only the message being streamed: the first one's nodes stay.
        page.evaluate("document.querySelector('[data-testid=msg-agent] li').dataset.mark = 'kept'")
        send(page, "/chunks 30 " + " ".join(f"**w{i}**" for i in range(30)))
        expect(message).to_have_count(2)
        expect(message.nth(1).locator("strong")).to_have_count(30)
        assert page.evaluate("document.querySelector('[data-testid=msg-agent] li').dataset.mark") == "kept"
        assert page.page_errors == []  # type: ignore[attr-defined]
        console.client.delete(f"/session/{sid}")
    finally:
        page.context.close()


def test_a_task_created_over_http_appears_and_succeeds_live(console: Console, page: Page) -> None:
    page.goto(console.url("/#/tasks"))
    blocker = console.client.post("/lmsp/v1/tasks", json={
        "type": "response", "input": {"model": "reference", "input": "/sleep 60s block"}}).json()
    task = console.client.post("/lmsp/v1/tasks", json={
        "type": "response", "input": {"model": "reference", "input": "/chunks 5 hello from a task"}}).json()
    row = page.locator(f'[data-testid=task-row][data-task-id="{task["id"]}"]')
    # One task runs at a time on this daemon: it waits behind the blocker.
    expect(row).to_have_attribute("data-status", "queued")
    blocking = page.locator(f'[data-testid=task-row][data-task-id="{blocker["id"]}"]')
    expect(blocking).to_have_attribute("data-status", "running")
    blocking.get_by_test_id("cancel-task").click()
    expect(blocking).to_have_attribute("data-status", "cancelled")
    expect(row).to_have_attribute("data-status", "succeeded")
    usage = console.client.get(f"/lmsp/v1/tasks/{task['id']}").json()["response"]["usage"]
    expect(row).to_contain_text(f"{usage['total_tokens']} ({usage['input_tokens']} in, "
                                f"{usage['output_tokens']} out)")
    expect(row).to_contain_text("reference")
    row.get_by_role("link").first.click()
    expect(page.get_by_test_id("task-status")).to_have_text("succeeded")
    expect(page.get_by_test_id("task-output")).to_have_text("Echo: hello from a task")
    expect(page.get_by_test_id("task-events")).to_contain_text("response.completed")


def test_a_task_streams_live_in_its_view_and_is_cancelled(console: Console, page: Page) -> None:
    task = console.client.post("/lmsp/v1/tasks", json={
        "type": "response", "input": {"model": "reference", "input": "/sleep 60s wait"}}).json()
    page.goto(console.url(f"/#/task/{task['id']}"))
    expect(page.get_by_test_id("task-status")).to_have_text("running")
    page.get_by_test_id("cancel-task").click()
    expect(page.get_by_test_id("task-status")).to_have_text("cancelled")
    expect(page.get_by_test_id("task-events")).to_contain_text("response.cancelled")
    expect(page.get_by_test_id("cancel-task")).to_be_disabled()


def test_reloading_replays_the_transcript(console: Console, page: Page) -> None:
    sid = console.session()
    open_session(page, console, sid)
    send(page, "/tool write notes.txt")
    page.get_by_test_id("permission-option").first.click()
    transcript = page.get_by_test_id("transcript")
    expect(transcript.get_by_text("turn ended: end_turn")).to_be_visible()
    expect(transcript.get_by_test_id("msg-agent")).to_contain_text("Echo:")   # rendered
    before = transcript.inner_text()
    page.reload()
    expect(page.get_by_test_id("stream-state")).to_have_text("live")
    expect(transcript.get_by_text("turn ended: end_turn")).to_be_visible()
    expect(transcript.get_by_test_id("msg-agent")).to_contain_text("Echo:")
    assert transcript.inner_text() == before
    expect(transcript.get_by_test_id("tool-call")).to_have_attribute("data-status", "completed")
    expect(transcript.get_by_test_id("msg-agent")).to_have_count(1)
    expect(page.get_by_test_id("permission-request")).to_have_count(0)   # resolved: not offered again


def test_a_lost_history_is_said_on_reload(browser: Browser, tmp_path: Path) -> None:
    with running_console(tmp_path, "--event-ring-size", "4") as small:
        sid = small.session()
        assert small.prompt(sid, "/chunks 8 one two three four five six seven eight").status_code == 202
        page = open_page(browser)
        try:
            page.goto(small.url(f"/#/session/{sid}"))
            notice = page.get_by_test_id("resync-notice")
            expect(notice).to_contain_text("ring_evicted")
            transcript = page.get_by_test_id("transcript")
            expect(transcript.get_by_text("turn ended: end_turn")).to_be_visible()
            expect(transcript.get_by_test_id("msg-user")).to_have_count(0)   # evicted
            assert page.page_errors == []  # type: ignore[attr-defined]
        finally:
            page.context.close()


def test_with_a_token_nothing_works_until_it_is_entered(browser: Browser, tmp_path: Path) -> None:
    with running_console(tmp_path, token="s3cret-token") as guarded:
        page = open_page(browser)
        try:
            page.goto(guarded.url("/"))
            dialog = page.locator("#token-dialog")
            expect(dialog).to_be_visible()
            expect(page.get_by_test_id("session-row")).to_have_count(0)
            assert page.evaluate("fetch('/capabilities').then(r => r.status)") == 401
            page.get_by_test_id("token-input").fill("wrong")
            page.get_by_test_id("token-submit").click()
            expect(page.get_by_test_id("token-error")).to_have_text("That token was refused.")
            page.get_by_test_id("token-input").fill("s3cret-token")
            page.get_by_test_id("token-submit").click()
            expect(dialog).to_be_hidden()
            page.get_by_test_id("new-session").click()
            expect(page.get_by_test_id("stream-state")).to_have_text("live")   # in the session
            page.get_by_test_id("nav-sessions").click()
            expect(page.get_by_test_id("session-row")).to_have_count(1)
            assert "s3cret" not in page.url
            assert page.evaluate("sessionStorage.getItem('acp-server.token')") == "s3cret-token"
            page.reload()   # same tab: not asked again
            expect(page.get_by_test_id("session-row")).to_have_count(1)
            expect(dialog).to_be_hidden()
        finally:
            page.context.close()
        fresh = open_page(browser)   # another tab asks again
        try:
            fresh.goto(guarded.url("/"))
            expect(fresh.locator("#token-dialog")).to_be_visible()
        finally:
            fresh.context.close()


def _visit_every_view(page: Page, console: Console, shots: Path, suffix: str) -> None:
    """Every view with something in it; a screenshot of each (only the session view
    for the dark variant, the session and sessions views for the phone)."""
    def shot(name: str) -> None:
        # Usable at this width: nothing wider than the window (tables scroll inside).
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= page.viewport_size["width"], name  # type: ignore[index]
        if not suffix or name == "session" or (suffix == "-phone" and name == "sessions"):
            page.screenshot(path=str(shots / f"{name}{suffix}.png"))

    idle = console.session()
    sid = console.session()
    console.prompt(sid, "/chunks 6 Here is the answer, **streamed** in six chunks:\n\n"
                        "- a list item\n- a [link](https://example.com/)\n\n"
                        "```sh\nmake test\n```")
    console.prompt(sid, "/tool write report.md")
    for i in range(2):
        console.prompt(sid, f"{SLEEP} {i}")
    task = console.client.post("/lmsp/v1/tasks", json={
        "type": "response", "input": {"model": "reference",
                                      "input": "/chunks 8 A task's output, streamed live."}}).json()
    console.client.post("/session", json={"sessionScope": "thread",
                                          "_meta": {"acp-server/origin": "conformance"}})
    page.goto(console.url("/"))
    expect(page.locator(f'[data-testid=session-row][data-session-id="{sid}"]')).to_contain_text("approval")
    shot("sessions")
    page.goto(console.url(f"/#/session/{sid}"))
    expect(page.get_by_test_id("permission-request")).to_have_count(1)
    expect(page.get_by_test_id("queue-depth")).to_have_text("3 / 5")
    expect(page.get_by_test_id("copy-code")).to_have_count(1)
    shot("session")
    page.goto(console.url("/#/tasks"))
    expect(page.locator(f'[data-task-id="{task["id"]}"]')).to_have_attribute("data-status", "succeeded")
    shot("tasks")
    page.goto(console.url(f"/#/task/{task['id']}"))
    expect(page.get_by_test_id("task-output")).to_have_text("Echo: A task's output, streamed live.")
    expect(page.get_by_test_id("task-events")).to_contain_text("response.completed")
    shot("task")
    page.goto(console.url("/#/daemon"))
    expect(page.locator("[data-testid=agent-row][data-state=running]")).to_have_count(1)
    shot("daemon")
    for session_id in (sid, idle):
        console.client.delete(f"/session/{session_id}")


@pytest.mark.parametrize(("viewport", "scheme", "suffix"), [
    (DESKTOP, "light", ""), (DESKTOP, "dark", "-dark"), (PHONE, "light", "-phone")])
def test_no_console_errors_on_any_view(browser: Browser, console: Console, tmp_path: Path,
                                       viewport: dict[str, int], scheme: str, suffix: str) -> None:
    page = open_page(browser, viewport=viewport, color_scheme=scheme)
    shots = Path(os.environ.get(WRITE_SCREENSHOTS_ENV) or tmp_path)
    try:
        _visit_every_view(page, console, shots, suffix)
        assert page.console_errors == []  # type: ignore[attr-defined]
        assert page.page_errors == []  # type: ignore[attr-defined]
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        red = int(background.split("(")[1].split(",")[0])
        assert (red < 64) if scheme == "dark" else (red > 192), background
    finally:
        page.context.close()
