"""The web console against a live ``acp-server serve``, in Debian's chromium: sessions,
the streamed transcript and its replay, permissions, the queue against the cap, the
503, LMSP tasks, the token, and no console errors on any view."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.web.conftest import DESKTOP, PHONE, Console, open_page, running_console

SLEEP = "/sleep 60s hold"
WRITE_SCREENSHOTS_ENV = "ACP_SERVER_SCREENSHOTS"   # a folder: the README's pictures


def open_session(page: Page, console: Console, sid: str) -> None:
    page.goto(console.url(f"/#/session/{sid}"))
    expect(page.get_by_test_id("stream-state")).to_have_text("live")


def send(page: Page, text: str) -> None:
    page.get_by_test_id("prompt-input").fill(text)
    page.get_by_test_id("send-prompt").click()


def test_create_a_session_from_the_page(console: Console, page: Page) -> None:
    page.goto(console.url("/"))
    expect(page.get_by_test_id("agent-select")).to_have_value("reference")
    before = {r.get_attribute("data-session-id") for r in page.get_by_test_id("session-row").all()}
    page.get_by_test_id("new-session").click()
    rows = page.get_by_test_id("session-row")
    expect(rows).to_have_count(len(before) + 1)
    [sid] = {r.get_attribute("data-session-id") for r in rows.all()} - before
    status = console.client.get(f"/session/{sid}/status")
    assert status.status_code == 200
    row = page.locator(f'[data-testid=session-row][data-session-id="{sid}"]')
    expect(row.get_by_test_id("row-pending")).to_have_text("0 / 5")
    row.get_by_test_id("open-session").click()
    expect(page).to_have_url(console.url(f"/#/session/{sid}"))
    expect(page.get_by_test_id("queue-depth")).to_have_text("0 / 5")


def test_a_reply_streams_into_the_transcript(console: Console, page: Page) -> None:
    sid = console.session()
    open_session(page, console, sid)
    words = " ".join(f"word{i}" for i in range(40))
    send(page, f"/chunks 40 {words}")
    transcript = page.get_by_test_id("transcript")
    expect(transcript.get_by_test_id("msg-user")).to_have_text(f"You/chunks 40 {words}")
    # 40 agent_message_chunk updates join one agent message, in order.
    expect(transcript.get_by_test_id("msg-agent")).to_have_text(f"AgentEcho: {words}")
    expect(transcript.get_by_text("turn ended: end_turn")).to_be_visible()
    expect(page.get_by_test_id("prompt-input")).to_have_value("")


def test_a_permission_is_answered_from_the_page(console: Console, page: Page) -> None:
    sid = console.session()
    open_session(page, console, sid)
    send(page, "/permission may I")
    request = page.get_by_test_id("permission-request")
    expect(request).to_have_count(1)
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


def test_three_sleeps_show_3_of_5_and_a_queued_one_is_dropped(console: Console, page: Page) -> None:
    sid = console.session()
    open_session(page, console, sid)
    for i in range(3):
        send(page, f"{SLEEP} {i}")
    expect(page.get_by_test_id("queue-depth")).to_have_text("3 / 5")
    queued = page.locator("[data-testid=pending-prompt][data-state=queued]")
    expect(queued).to_have_count(2)
    expect(page.locator("[data-testid=pending-prompt][data-state=running]")).to_have_count(1)
    dropped = queued.first.get_attribute("data-prompt-id")
    queued.first.get_by_test_id("drop-prompt").click()
    expect(page.get_by_test_id("queue-depth")).to_have_text("2 / 5")
    expect(page.locator(f'[data-prompt-id="{dropped}"]')).to_have_count(0)
    pending = console.client.get(f"/session/{sid}/pending-prompts").json()["pendingPrompts"]
    assert len(pending) == 2 and dropped not in {p["promptId"] for p in pending}
    page.get_by_test_id("cancel-prompt").click()   # the running one; the queued one starts
    # Both the dropped prompt and the cancelled one end their turn as cancelled.
    expect(page.get_by_test_id("transcript").get_by_text("turn ended: cancelled")).to_have_count(2)
    expect(page.get_by_test_id("queue-depth")).to_have_text("1 / 5")
    console.client.delete(f"/session/{sid}")


def test_a_refused_prompt_shows_the_503(console: Console, page: Page) -> None:
    sid = console.session()
    for i in range(5):
        assert console.prompt(sid, f"{SLEEP} {i}").status_code == 202
    open_session(page, console, sid)
    expect(page.get_by_test_id("queue-depth")).to_have_text("5 / 5")
    send(page, "one too many")
    error = page.get_by_test_id("prompt-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("503 prompt_queue_full")
    expect(error).to_contain_text("(5 / 5 pending)")
    expect(error).to_contain_text("Retry after 5 s.")
    expect(page.get_by_test_id("prompt-input")).to_have_value("one too many")   # kept to retry
    expect(page.get_by_test_id("queue-depth")).to_have_text("5 / 5")
    console.client.delete(f"/session/{sid}")


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
    before = transcript.inner_text()
    page.reload()
    expect(page.get_by_test_id("stream-state")).to_have_text("live")
    expect(transcript.get_by_text("turn ended: end_turn")).to_be_visible()
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
    for the dark and phone variants)."""
    def shot(name: str) -> None:
        # Usable at this width: nothing wider than the window (tables scroll inside).
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= page.viewport_size["width"], name  # type: ignore[index]
        if not suffix or name == "session":
            page.screenshot(path=str(shots / f"{name}{suffix}.png"))

    idle = console.session()
    sid = console.session()
    console.prompt(sid, "/chunks 6 Here is the answer, streamed in six chunks.")
    console.prompt(sid, "/tool write report.md")
    for i in range(2):
        console.prompt(sid, f"{SLEEP} {i}")
    task = console.client.post("/lmsp/v1/tasks", json={
        "type": "response", "input": {"model": "reference",
                                      "input": "/chunks 8 A task's output, streamed live."}}).json()
    page.goto(console.url("/"))
    expect(page.locator(f'[data-testid=session-row][data-session-id="{sid}"]')).to_contain_text("approval")
    shot("sessions")
    page.goto(console.url(f"/#/session/{sid}"))
    expect(page.get_by_test_id("permission-request")).to_have_count(1)
    expect(page.get_by_test_id("queue-depth")).to_have_text("3 / 5")
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
