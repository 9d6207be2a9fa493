"""The console for a person on a phone, at 200 % zoom, in dark mode or with motion
reduced, in Debian's chromium against a live ``acp-server serve``: what the browser
reports (scrollWidth against clientWidth, each control's box, each text's colours)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.web.checks import CONTRAST, MOTION, SIDEWAYS, TARGETS
from tests.web.conftest import DESKTOP, Console, open_page

PHONE_360 = {"viewport": {"width": 360, "height": 740}}
# 1280 x 800 at 200 % zoom: the page lays out in 640 x 400 CSS px, each drawn twice as big.
ZOOM_200 = {"viewport": {"width": 640, "height": 400}, "device_scale_factor": 2}
# WCAG 1.4.10 (reflow): 320 CSS px wide, 1280 px at 400 %.
REFLOW_320 = {"viewport": {"width": 320, "height": 640}}


@pytest.fixture(scope="module")
def filled(console: Console) -> Iterator[dict[str, str]]:
    """Something in every view: a session waiting for an approval with two prompts
    queued and a code block, a session made by a program, one whose agent died
    (Ended), a finished LMSP task."""
    dead = console.session()   # first: the crash ends every session of its agent process
    assert console.prompt(dead, "/crash").status_code == 202
    wid = console.workspace_id()
    ended: list[object] = []
    deadline = time.monotonic() + 30
    while not ended:   # the agent's death is noticed asynchronously
        assert time.monotonic() < deadline, "the crashed session was never listed as ended"
        listed = console.client.get(f"/workspace/{wid}/ended-sessions").json()
        ended = [s for s in listed["sessions"] if s["sessionId"] == dead]
    sid = console.session()
    assert console.prompt(sid, "/chunks 3 Run:\n\n```sh\nmake test-everything-with-a-long-line"
                               "-that-does-not-wrap --verbose\n```").status_code == 202
    assert console.prompt(sid, "/tool write report.md").status_code == 202
    for i in range(2):
        assert console.prompt(sid, f"/sleep 60s a long queued prompt that has to wrap {i}").status_code == 202
    console.client.post("/session", json={"sessionScope": "thread",
                                          "_meta": {"acp-server/origin": "conformance"}})
    task = console.client.post("/lmsp/v1/tasks", json={
        "type": "response", "input": {"model": "reference", "input": "/chunks 4 A task's output."}}).json()
    yield {"sid": sid, "dead": dead, "task": task["id"]}
    for session_id in (sid, dead):
        console.client.delete(f"/session/{session_id}")


def _views(page: Page, console: Console, filled: dict[str, str]) -> Iterator[str]:
    """Opens every view with something in it; yields each one's name once it is shown."""
    page.goto(console.url("/#/"))
    page.get_by_test_id("show-all-sessions").check()
    expect(page.get_by_test_id("row-origin")).not_to_have_count(0)
    expect(page.locator(f'[data-testid=session-row][data-session-id="{filled["sid"]}"]')).to_contain_text("approval")
    expect(page.locator(f'[data-testid=ended-row][data-session-id="{filled["dead"]}"]')).to_have_count(1)
    yield "sessions"
    page.goto(console.url(f"/#/session/{filled['sid']}"))
    expect(page.get_by_test_id("permission-request")).to_have_count(1)
    expect(page.get_by_test_id("copy-code")).to_have_count(1)
    expect(page.get_by_test_id("pending-prompt")).to_have_count(3)   # the running one too
    yield "session"
    page.goto(console.url("/#/tasks"))
    expect(page.locator(f'[data-task-id="{filled["task"]}"]')).to_have_attribute("data-status", "succeeded")
    yield "tasks"
    page.goto(console.url(f"/#/task/{filled['task']}"))
    expect(page.get_by_test_id("task-events")).to_contain_text("response.completed")
    yield "task"
    page.goto(console.url("/#/daemon"))
    expect(page.get_by_test_id("agent-row")).not_to_have_count(0)
    yield "daemon"


def _each_view(browser: Browser, console: Console, filled: dict[str, str],
               check: Callable[[Page, str], None], **context: Any) -> None:
    page = open_page(browser, **context)
    try:
        for name in _views(page, console, filled):
            check(page, name)
        assert page.page_errors == []  # type: ignore[attr-defined]
    finally:
        page.context.close()


@pytest.mark.parametrize("context", [PHONE_360, ZOOM_200, REFLOW_320],
                         ids=["phone-360", "zoom-200", "reflow-320"])
def test_every_view_fits_the_width_and_every_control_is_a_finger_wide(
        browser: Browser, console: Console, filled: dict[str, str], context: dict[str, Any]) -> None:
    """At 360 px (and at 200 % zoom) the sessions table scrolled sideways inside its
    box, its Open and Delete off-screen, and buttons were 20 px tall: nothing scrolls
    sideways now (rows are stacked cards), every control is inside the window and at
    least 44 x 44 px, and the rows are still a table's rows to a screen reader."""
    def check(page: Page, name: str) -> None:
        assert page.evaluate(SIDEWAYS) == [], name
        assert page.evaluate(TARGETS) == [], name
        if name == "sessions":
            snapshot = page.get_by_test_id("live-sessions").aria_snapshot()
            assert "- row " in snapshot and "- cell " in snapshot, snapshot
            delete = page.locator(f'[data-testid=session-row][data-session-id="{filled["sid"]}"]'
                                  ).get_by_test_id("delete-session")
            delete.click()   # reachable: a click lands on it, no scrolling needed
            page.get_by_test_id("confirm-cancel").click()

    _each_view(browser, console, filled, check, **context)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_an_ended_session_and_a_question_fit_a_phone(browser: Browser, console: Console,
                                                     scheme: str) -> None:
    """What comes and goes: the Delete question, and the banner of a session deleted
    under the page, whose "Back to the sessions" link was 16 px tall."""
    sid = console.session()
    page = open_page(browser, color_scheme=scheme, **PHONE_360)
    try:
        page.goto(console.url("/#/"))
        page.locator(f'[data-testid=session-row][data-session-id="{sid}"]').get_by_test_id("delete-session").click()
        expect(page.get_by_test_id("confirm")).to_be_visible()
        assert page.evaluate(TARGETS) == []
        assert page.evaluate(CONTRAST) == []
        page.get_by_test_id("confirm-cancel").click()
        page.goto(console.url(f"/#/session/{sid}"))
        expect(page.get_by_test_id("stream-state")).to_have_text("live")
        console.client.delete(f"/session/{sid}")
        expect(page.get_by_test_id("back-to-list")).to_be_visible()
        assert page.evaluate(SIDEWAYS) == []
        assert page.evaluate(TARGETS) == []
        assert page.evaluate(CONTRAST) == []
        assert page.page_errors == []  # type: ignore[attr-defined]
    finally:
        page.context.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_text_has_aa_contrast(browser: Browser, console: Console, filled: dict[str, str],
                                    scheme: str) -> None:
    """WCAG AA: 4.5:1 for every piece of text against what is under it, in light and
    in dark."""
    def check(page: Page, name: str) -> None:
        assert page.evaluate(CONTRAST) == [], f"{name} ({scheme})"

    _each_view(browser, console, filled, check, viewport=DESKTOP, color_scheme=scheme)


def test_nothing_moves_when_motion_is_reduced(browser: Browser, console: Console,
                                              filled: dict[str, str]) -> None:
    """prefers-reduced-motion: no transition, animation or smooth scrolling anywhere."""
    def check(page: Page, name: str) -> None:
        assert page.evaluate(MOTION) == [], name

    _each_view(browser, console, filled, check, viewport=DESKTOP, reduced_motion="reduce")
