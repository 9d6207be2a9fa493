"""The console when the server goes away and comes back, and the small things of the
Tasks and Daemon pages, in Debian's chromium against live ``acp-server serve``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Route, expect

from tests.harness import free_port
from tests.web.conftest import Console, open_page, running_console

SLEEP = "/sleep 60s hold"


def test_a_stopped_server_leaves_nothing_stale_and_a_restart_says_the_session_ended(
        browser: Browser, tmp_path: Path) -> None:
    port = free_port()
    page = open_page(browser)
    try:
        with running_console(tmp_path, "--port", str(port)) as first:
            sid = first.session()
            for i in range(3):
                assert first.prompt(sid, f"{SLEEP} {i}").status_code == 202
            page.goto(first.url(f"/#/session/{sid}"))
            expect(page.get_by_test_id("queue-depth")).to_have_text("3 / 5")
            expect(page.get_by_test_id("drop-prompt")).to_have_count(2)
        # Stopped: no counts, no rows, no buttons that would act on nothing.
        expect(page.get_by_test_id("queue-depth")).to_have_text("– / 5")
        expect(page.get_by_test_id("pending-prompt")).to_have_count(0)
        expect(page.get_by_test_id("drop-prompt")).to_have_count(0)
        expect(page.get_by_test_id("pending-queue")).to_have_text("Not connected.")
        expect(page.get_by_test_id("cancel-prompt")).to_be_disabled()
        expect(page.get_by_test_id("send-prompt")).to_be_disabled()
        expect(page.get_by_test_id("session-banner")).to_be_visible()
        expect(page.get_by_test_id("transcript")).to_contain_text(f"{SLEEP} 0")   # kept to read
        # Restarted on the same address: the page tries to load the session, and says
        # plainly that it ended (the reference agent keeps nothing across a restart).
        with running_console(tmp_path / "again", "--port", str(port)) as second:
            banner = page.get_by_test_id("session-banner")
            expect(banner).to_contain_text("This session has ended")
            expect(page.get_by_test_id("stream-state")).to_have_text("ended")
            expect(page.get_by_test_id("prompt-input")).to_be_disabled()
            expect(page.get_by_test_id("queue-depth")).to_have_text("– / 5")
            page.get_by_test_id("back-to-list").click()
            expect(page).to_have_url(second.url("/#/"))
            expect(page.get_by_test_id("session-row")).to_have_count(0)
        assert page.page_errors == []  # type: ignore[attr-defined]
    finally:
        page.context.close()


def test_a_session_the_server_has_again_is_loaded_and_goes_on(console: Console, page: Page) -> None:
    """The stream finds the session gone (404, as after a restart); the page loads it
    (POST /load) and, the server having it, replays it and goes on live. (The first
    stream request is answered 404 by the browser, standing in for the restart.)"""
    sid = console.session()
    assert console.prompt(sid, "before the restart").status_code == 202
    answered = {"404": 0}
    loads: list[str] = []

    def gone_once(route: Route) -> None:
        if answered["404"] == 0:
            answered["404"] += 1
            route.fulfill(status=404, content_type="application/json",
                          body='{"error":"Session not found","code":"session_not_found"}')
        else:
            route.continue_()

    page.route(re.compile(r".*/session/[^/]+/events$"), gone_once)
    page.on("request", lambda r: r.url.endswith("/load") and loads.append(r.method))
    page.goto(console.url(f"/#/session/{sid}"))
    expect(page.get_by_test_id("stream-state")).to_have_text("live")
    assert loads == ["POST"]
    transcript = page.get_by_test_id("transcript")
    expect(transcript.get_by_test_id("msg-agent")).to_have_text("AgentEcho: before the restart")
    expect(page.get_by_test_id("session-banner")).to_be_hidden()
    page.get_by_test_id("prompt-input").fill("after it")
    page.get_by_test_id("send-prompt").click()
    expect(transcript.get_by_test_id("msg-agent").nth(1)).to_have_text("AgentEcho: after it")
    console.client.delete(f"/session/{sid}")


def test_a_deleted_session_says_it_ended_and_offers_the_list(console: Console, page: Page) -> None:
    sid = console.session()
    page.goto(console.url(f"/#/session/{sid}"))
    expect(page.get_by_test_id("stream-state")).to_have_text("live")
    console.client.delete(f"/session/{sid}")
    banner = page.get_by_test_id("session-banner")
    expect(banner).to_contain_text("This session has ended")
    expect(banner).not_to_contain_text("do not outlive")   # they do, on the default journal
    expect(page.get_by_test_id("back-to-list")).to_be_visible()
    expect(page.get_by_test_id("load-again")).to_have_count(0)   # nothing kept to load


def test_a_session_whose_agent_died_is_loaded_again_on_request(console: Console,
                                                                page: Page) -> None:
    """The agent dies mid-turn: the page says so and offers "Load it again", which
    loads the session (the agent started again, with the conversation) and goes on."""
    sid = console.session()
    assert console.prompt(sid, "before it died").status_code == 202
    page.goto(console.url(f"/#/session/{sid}"))
    transcript = page.get_by_test_id("transcript")
    expect(transcript.get_by_test_id("msg-agent")).to_have_text("AgentEcho: before it died")
    page.get_by_test_id("prompt-input").fill("/crash")
    page.get_by_test_id("send-prompt").click()
    banner = page.get_by_test_id("session-banner")
    expect(banner).to_contain_text("This session has ended: its agent died")
    expect(page.get_by_test_id("stream-state")).to_have_text("ended")
    expect(page.get_by_test_id("prompt-input")).to_be_disabled()
    page.get_by_test_id("load-again").click()
    expect(page.get_by_test_id("stream-state")).to_have_text("live")
    expect(banner).to_be_hidden()
    expect(transcript.get_by_test_id("msg-agent").first).to_have_text(
        "AgentEcho: before it died")
    page.get_by_test_id("prompt-input").fill("/history")
    page.get_by_test_id("send-prompt").click()
    expect(transcript).to_contain_text("user: before it died")
    assert page.page_errors == []  # type: ignore[attr-defined]
    console.client.delete(f"/session/{sid}")


def test_a_session_whose_agent_died_is_listed_under_ended_and_opens_live(
        console: Console, page: Page) -> None:
    """The list leaves a session whose agent died, which a person would lose with the
    tab: "Ended" lists it, and opening it loads it again with its conversation."""
    sid = console.session()
    assert console.prompt(sid, "worth keeping").status_code == 202
    assert console.prompt(sid, "/crash").status_code == 202
    page.goto(console.url("/#/"))
    row = page.get_by_test_id("ended-sessions").locator(f'tr[data-session-id="{sid}"]')
    expect(row).to_contain_text("reference", timeout=30_000)
    live = page.get_by_test_id("session-row").and_(page.locator(f'[data-session-id="{sid}"]'))
    expect(live).to_have_count(0)
    row.get_by_test_id("load-ended").click()
    expect(page).to_have_url(re.compile(f"#/session/{sid}$"))
    expect(page.get_by_test_id("stream-state")).to_have_text("live")
    expect(page.get_by_test_id("transcript").get_by_test_id("msg-agent").first).to_have_text(
        "AgentEcho: worth keeping")
    page.goto(console.url("/#/"))
    expect(live).to_have_count(1)
    expect(row).to_have_count(0, timeout=30_000)   # live again: not ended (read every 5 s)
    console.client.delete(f"/session/{sid}")


def test_an_ended_session_is_deleted_from_the_list_after_a_yes(console: Console,
                                                                page: Page) -> None:
    sid = console.session()
    assert console.prompt(sid, "/crash").status_code == 202
    page.goto(console.url("/#/"))
    row = page.get_by_test_id("ended-sessions").locator(f'tr[data-session-id="{sid}"]')
    expect(row).to_contain_text("reference", timeout=30_000)
    row.get_by_test_id("delete-ended").click()
    page.get_by_test_id("confirm-ok").click()   # the yes
    expect(row).to_have_count(0)
    wid = console.workspace_id()
    kept = console.client.get(f"/workspace/{wid}/ended-sessions").json()["sessions"]
    assert sid not in [s["sessionId"] for s in kept]


def test_an_empty_task_is_refused_in_the_form_and_tasks_show_their_input(console: Console,
                                                                          page: Page) -> None:
    page.goto(console.url("/#/tasks"))
    before = len(console.client.get("/lmsp/v1/tasks?limit=100").json()["data"])
    page.get_by_test_id("new-task").click()
    expect(page.get_by_test_id("tasks-error")).to_have_text("Write the task's input first.")
    expect(page.get_by_test_id("task-input")).to_be_focused()
    assert len(console.client.get("/lmsp/v1/tasks?limit=100").json()["data"]) == before
    page.get_by_test_id("task-input").fill("/chunks 3 summarise the day")
    page.get_by_test_id("new-task").click()
    row = page.get_by_test_id("task-row").first
    expect(row.get_by_test_id("task-input-text")).to_have_text("/chunks 3 summarise the day")
    expect(row).to_have_attribute("data-status", "succeeded")
    expect(page.get_by_test_id("tasks-error")).to_be_hidden()
    row.get_by_role("link").first.click()
    expect(page.get_by_test_id("task-input")).to_have_text("/chunks 3 summarise the day")
    expect(page.get_by_test_id("task-output")).to_have_text("Echo: summarise the day")


def test_the_daemon_page_speaks_in_human_units(console: Console, page: Page) -> None:
    page.goto(console.url("/#/daemon"))
    cards = page.locator(".card")
    expect(cards.filter(has_text="Idle sessions closed after")).to_contain_text("30 min")
    expect(cards.filter(has_text="Permission timeout")).to_contain_text("wait forever")
    expect(cards.filter(has_text="Request body")).to_contain_text("10 MiB")
    up = page.get_by_test_id("daemon-activity").locator("tr", has_text="Up for")
    expect(up).to_have_text(re.compile(r"Up for\s*\d+(\.\d)? (ms|s)$|Up for\s*\d+ min( \d+ s)?$"))
    assert "(ms)" not in page.locator("main").inner_text()


@pytest.mark.parametrize("clean", [False, True], ids=["kill-9", "SIGTERM"])
def test_a_killed_server_restarted_on_its_state_restores_the_session(
        browser: Browser, tmp_path: Path, clean: bool) -> None:
    """``kill -9`` (or SIGTERM: its drain shows the page nothing, the stream just
    ends), then the server again on the same state folder and address: the page finds
    the session restored (issue #23), the history as it was, the prompt that was
    running failed with ``server_restarted``, and the session goes on."""
    port = free_port()
    page = open_page(browser)
    try:
        with running_console(tmp_path, "--port", str(port)) as first:
            sid = first.session()
            assert first.prompt(sid, "before the kill").status_code == 202
            page.goto(first.url(f"/#/session/{sid}"))
            transcript = page.get_by_test_id("transcript")
            expect(transcript.get_by_test_id("msg-agent")).to_have_text("AgentEcho: before the kill")
            assert first.prompt(sid, SLEEP).status_code == 202
            expect(transcript).to_contain_text(SLEEP)   # its echo: the turn runs
            if clean:
                first.process.terminate()   # SIGTERM: the drain
            else:
                first.process.kill()   # SIGKILL: no drain
            first.process.wait()
        with running_console(tmp_path, "--port", str(port)):
            expect(page.get_by_test_id("stream-state")).to_have_text("live")
            expect(page.get_by_test_id("session-banner")).to_be_hidden()
            expect(transcript).to_contain_text("turn failed: server_restarted")
            page.get_by_test_id("prompt-input").fill("after it")
            page.get_by_test_id("send-prompt").click()
            expect(transcript.get_by_test_id("msg-agent").last).to_have_text("AgentEcho: after it")
        assert page.page_errors == []  # type: ignore[attr-defined]
    finally:
        page.context.close()
