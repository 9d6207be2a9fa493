"""What a careful person finds using the console, in Debian's chromium against a live
``acp-server serve``: a server that stops answering, right-to-left text, what a
screen reader is told, and the cancel note."""

from __future__ import annotations

from pathlib import Path

import pytest

from playwright.sync_api import Browser, Page, Route, expect

from tests.web.conftest import Console, open_page, running_console


# Each ``/sessions?`` fetch the page starts, at the page's clock (Playwright's fake
# one: the moment its timer fired), and how many of the page's fetches (all of them)
# have started and settled. Every fetch is waited for, not only those logged: after a
# failure a tick reads the ended sessions first (unlogged) and the live list once that
# one has failed, and a loaded machine let the clock step on meanwhile (a poll logged
# 200 ms late: "[2000, 4000, 8200, 8000]" in a CI run).
POLL_LOG = """(() => {
  window.__polls = []; window.__started = 0; window.__settled = 0;
  const real = window.fetch;
  window.fetch = function (resource, init) {
    const url = String(resource && resource.url ? resource.url : resource);
    if (url.includes("/sessions?")) window.__polls.push(Date.now());
    window.__started += 1;
    const settled = () => { window.__settled += 1; };
    const answer = real.call(this, resource, init);
    answer.then(settled, settled);
    return answer;
  };
})();"""
STEP_MS = 100   # the fake clock's step: a poll's moment is known within one


def test_lists_say_the_server_is_not_answering_keep_rows_inert_and_ask_less_often(
        browser: Browser, tmp_path: Path) -> None:
    """Server stopped under the Sessions page: not "Failed to fetch" over rows that
    still offer Delete, and not one request a second for ever: the page says the server
    is not answering, keeps the rows to read but inert, and waits longer each time:
    measured on the page's own clock (Playwright's, stepped), not the machine's."""
    page = open_page(browser)
    page.add_init_script(POLL_LOG)
    page.clock.install()   # runs as a real clock until paused
    settled = "() => window.__started === window.__settled"
    try:
        with running_console(tmp_path) as server:
            sid = server.session()
            page.goto(server.url("/#/"))
            row = page.get_by_test_id("session-row")
            expect(row).to_have_attribute("data-session-id", sid)
            expect(page.get_by_test_id("live-sessions").locator("xpath=..")).not_to_have_attribute(
                "inert", "")
            # time stands still from here: every later poll is one the page's timer
            # started as the clock is stepped
            page.wait_for_function(settled)
            page.clock.pause_at(page.evaluate("Date.now()") + 1)
            page.wait_for_function(settled)
        start = len(page.evaluate("window.__polls"))   # the server has stopped
        for _ in range(40_000 // STEP_MS):
            page.clock.run_for(STEP_MS)
            # a fetch started settles (refused at once) before the clock moves on, so
            # its failure's wait is timed from within one step of its start
            page.wait_for_function(settled)
            if len(page.evaluate("window.__polls")) >= start + 5:
                break
        polls = page.evaluate("window.__polls")[start:]
        gaps = [b - a for a, b in zip(polls, polls[1:])]
        # backing off: twice the wait after each failure, up to POLL_MAX_MS (8 s)
        assert len(gaps) == 4, polls
        assert all(want <= gap <= want + STEP_MS
                   for gap, want in zip(gaps, [2000, 4000, 8000, 8000])), gaps
        error = page.get_by_test_id("list-error")
        expect(error).to_contain_text("The server is not answering")
        expect(error).to_contain_text("the list below is from")
        expect(row).to_be_visible()   # kept to read
        expect(page.get_by_test_id("live-sessions").locator("xpath=..")).to_have_attribute("inert", "")
        expect(page.get_by_test_id("ended-sessions").locator("xpath=..")).to_have_attribute("inert", "")
        assert page.page_errors == []  # type: ignore[attr-defined]
    finally:
        page.context.close()


def test_right_to_left_text_reads_right_to_left(console: Console, page: Page) -> None:
    """Hebrew typed and echoed: the box, the prompt and the reply's Hebrew paragraph
    run right to left; the reply's "Echo: …" paragraph (Latin first) stays left to
    right."""
    sid = console.session()
    page.goto(console.url(f"/#/session/{sid}"))
    expect(page.get_by_test_id("stream-state")).to_have_text("live")
    box = page.get_by_test_id("prompt-input")
    box.fill("שלום\n\nעולם טוב")
    direction = "e => getComputedStyle(e).direction"
    assert box.evaluate(direction) == "rtl"
    page.get_by_test_id("send-prompt").click()
    turn = page.get_by_test_id("turn").first
    expect(turn).to_have_attribute("data-state", "completed")
    assert turn.get_by_test_id("msg-user").locator(".text").evaluate(direction) == "rtl"
    paragraphs = turn.get_by_test_id("msg-agent").locator("p")
    expect(paragraphs).to_have_count(2)
    assert paragraphs.nth(0).evaluate(direction) == "ltr"
    assert paragraphs.nth(1).evaluate(direction) == "rtl"
    console.client.delete(f"/session/{sid}")


STREAMING = (
    "retry: 3600000\n\n"
    'id: 1\nevent: pending_prompt_started\ndata: {"promptId":"p1","data":{"promptId":"p1"}}\n\n'
    'id: 2\nevent: session_update\ndata: {"promptId":"p1","data":{"update":'
    '{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"Hal"}}}}\n\n'
)


def test_a_screen_reader_hears_the_streamed_reply_once_and_whole(console: Console,
                                                                  page: Page) -> None:
    """The transcript is the one log: the page is no live region (the lists refresh
    every second: the whole page was read again and again; the only other live region
    is the view announcer, silent until the person goes to another view); the agent's message is
    aria-busy while it streams, not once its turn has ended; the nav says which page
    is current."""
    sid = console.session()
    page.route(f"**/session/{sid}/events", lambda route: route.fulfill(
        status=200, headers={"content-type": "text/event-stream"}, body=STREAMING))
    page.goto(console.url(f"/#/session/{sid}"))
    expect(page.get_by_test_id("msg-agent")).to_have_text("AgentHal")
    expect(page.get_by_test_id("msg-agent")).to_have_attribute("aria-busy", "true")
    assert page.locator("[aria-live]").count() == 1   # the view announcer only, empty on a first load
    expect(page.get_by_test_id("view-announcer")).to_have_text("")
    expect(page.get_by_test_id("transcript")).to_have_attribute("role", "log")
    expect(page.get_by_test_id("nav-sessions")).to_have_attribute("aria-current", "page")
    expect(page.get_by_test_id("nav-tasks")).not_to_have_attribute("aria-current", "page")
    page.unroute(f"**/session/{sid}/events")

    page.goto(console.url("/#/"))   # the real stream
    page.goto(console.url(f"/#/session/{sid}"))
    expect(page.get_by_test_id("stream-state")).to_have_text("live")
    assert console.prompt(sid, "/chunks 20 a reply in twenty pieces").status_code == 202
    turn = page.get_by_test_id("turn").first
    expect(turn).to_have_attribute("data-state", "completed")
    expect(turn.get_by_test_id("msg-agent")).to_have_attribute("aria-busy", "false")
    assert console.prompt(sid, "/crash").status_code == 202
    failed = page.get_by_test_id("turn").nth(1)
    expect(failed).to_have_attribute("data-state", "failed")
    expect(failed.get_by_test_id("msg-agent")).to_have_attribute("aria-busy", "false")


def test_the_cancel_note_is_not_left_on_the_next_prompt(console: Console, page: Page) -> None:
    sid = console.session()
    page.goto(console.url(f"/#/session/{sid}"))
    expect(page.get_by_test_id("stream-state")).to_have_text("live")
    box = page.get_by_test_id("prompt-input")
    box.fill("/sleep 60s first")
    page.get_by_test_id("send-prompt").click()
    cancel = page.get_by_test_id("cancel-prompt")
    expect(cancel).to_be_enabled()
    cancel.click()
    note = page.get_by_test_id("cancel-feedback")
    expect(note).to_have_text("The prompt was cancelled.")
    box.fill("/sleep 60s second")
    page.get_by_test_id("send-prompt").click()
    expect(page.get_by_test_id("pending-prompt")).to_contain_text("/sleep 60s second")
    expect(cancel).to_be_enabled()
    expect(note).to_have_text("")   # not "cancelled" beside a button for a prompt that runs
    console.client.delete(f"/session/{sid}")


def test_change_token_can_be_dismissed_and_keeps_the_token(browser: Browser,
                                                           tmp_path: Path) -> None:
    """"Change token" clicked by mistake: Escape (or Cancel) closes the question and
    the tab goes on with its token; it used to drop the token first and allow no way
    out but typing one. On a daemon with no token, there is no Change token at all."""
    page = open_page(browser)
    try:
        with running_console(tmp_path, token="s3cret-token") as server:
            sid = server.session()
            page.goto(server.url("/#/"))
            page.get_by_test_id("token-input").fill("s3cret-token")
            page.get_by_test_id("token-submit").click()
            expect(page.get_by_test_id("session-row")).to_have_attribute("data-session-id", sid)
            expect(page.get_by_test_id("token-cancel")).to_be_hidden()   # the first ask
            dialog = page.locator("#token-dialog")
            change = page.get_by_test_id("change-token")
            change.click()
            expect(dialog).to_be_visible()
            page.keyboard.press("Escape")
            expect(dialog).to_be_hidden()
            assert page.evaluate("sessionStorage.getItem('acp-server.token')") == "s3cret-token"
            change.click()
            page.get_by_test_id("token-cancel").click()
            expect(dialog).to_be_hidden()
            page.get_by_test_id("session-row").get_by_test_id("open-session").click()
            expect(page.get_by_test_id("stream-state")).to_have_text("live")
            assert page.page_errors == []  # type: ignore[attr-defined]
    finally:
        page.context.close()


def test_no_change_token_without_a_token(console: Console, page: Page) -> None:
    page.goto(console.url("/#/"))
    expect(page.get_by_test_id("principal")).to_contain_text("local")
    expect(page.get_by_test_id("change-token")).to_be_hidden()


def test_a_page_that_came_up_while_the_server_did_not_answer_goes_on_by_itself(
        console: Console, page: Page) -> None:
    """The page's files came, /capabilities did not (the server restarting under it):
    the page says so and tries again, and shows the sessions once the server answers;
    it used to stay on "Failed to fetch" until reloaded by hand."""
    refused = {"n": 0}

    def down_twice(route: Route) -> None:
        if refused["n"] < 2:
            refused["n"] += 1
            route.abort("connectionrefused")
        else:
            route.continue_()

    page.route("**/capabilities", down_twice)
    page.goto(console.url("/#/"))
    expect(page.get_by_test_id("boot-error")).to_contain_text("The server is not answering")
    expect(page.get_by_test_id("new-session")).to_be_visible()
    assert refused["n"] == 2


def test_row_buttons_say_what_they_act_on(console: Console, page: Page) -> None:
    """A screen reader listing the buttons heard "Delete, Delete, Drop, Drop": each now
    names its session, task or queued prompt (the visible word first)."""
    sid = console.session()
    short = f"{sid[:8]}…{sid[-4:]}"
    for i in range(2):
        assert console.prompt(sid, f"/sleep 60s hold {i}").status_code == 202
    page.goto(console.url("/#/"))
    expect(page.get_by_role("button", name=f"Delete session {short}")).to_be_visible()
    expect(page.get_by_role("link", name=f"Open session {short}")).to_be_visible()
    page.goto(console.url(f"/#/session/{sid}"))
    expect(page.get_by_role("button", name="Drop queued prompt: /sleep 60s hold 1")).to_be_visible()
    console.client.delete(f"/session/{sid}")


def test_when_the_session_ends_the_focus_goes_to_what_can_be_done(console: Console,
                                                                   page: Page) -> None:
    """Typing in the prompt box when the agent dies: the box is disabled and the focus
    fell to the page's top; it goes to "Load it again", so Enter loads it."""
    sid = console.session()
    page.goto(console.url(f"/#/session/{sid}"))
    expect(page.get_by_test_id("stream-state")).to_have_text("live")
    box = page.get_by_test_id("prompt-input")
    box.fill("/crash")
    page.keyboard.press("Control+Enter")
    again = page.get_by_test_id("load-again")
    expect(again).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_test_id("stream-state")).to_have_text("live")
    expect(box).to_be_focused()   # loaded again: back to the prompt box
    console.client.delete(f"/session/{sid}")
