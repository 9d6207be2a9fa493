"""Going from view to view in the console, as a browser and a screen reader see it, in
Debian's chromium against a live ``acp-server serve``: the tab's title, where the focus
lands, what is announced, and the browser's back and forward."""

from __future__ import annotations

import re

from playwright.sync_api import Page, Route, expect

from tests.web.conftest import Console

FOCUSED = "() => { const e = document.activeElement; return [e.tagName, e.textContent]; }"


def arrived(page: Page, name: str) -> None:
    """The view called name is shown: the tab says so, its heading has the focus, and
    the page's one live region has said its name."""
    expect(page).to_have_title(f"{name} — acp-server")
    heading = page.get_by_role("heading", level=1)
    expect(heading).to_be_focused()
    assert page.evaluate(FOCUSED) == ["H1", name]
    expect(page.get_by_test_id("view-announcer")).to_have_text(name)


def test_the_title_names_the_view_and_the_session(console: Console, page: Page) -> None:
    """Every tab and history entry was "acp-server console"."""
    sid = console.session()
    task = console.client.post("/lmsp/v1/tasks", json={
        "type": "response", "input": {"model": "reference", "input": "hello"}}).json()["id"]
    for path, title in [
            ("/#/", "Sessions"), (f"/#/session/{sid}", f"Session {sid[:8]}…{sid[-4:]}"),
            ("/#/tasks", "Tasks"), (f"/#/task/{task}", f"Task {task[:8]}…{task[-4:]}"),
            ("/#/daemon", "Daemon"), ("/#/nowhere", "No such page")]:
        page.goto(console.url(path))
        expect(page).to_have_title(f"{title} — acp-server")
    console.client.delete(f"/session/{sid}")


def test_a_view_change_moves_the_focus_to_its_heading_and_is_announced(
        console: Console, page: Page) -> None:
    """A click on "Tasks" left the focus on the link (or on nothing, once the view was
    replaced) and said nothing: a screen reader did not know the page had changed. The
    focus is on the new view's heading, the next Tab goes into the view, and the name is
    said in one polite live region (not the page: the lists refresh every second)."""
    sid = console.session()
    page.goto(console.url("/#/"))
    expect(page).to_have_title("Sessions — acp-server")
    expect(page.get_by_test_id("view-announcer")).to_have_text("")   # a first load: the title is read
    page.get_by_test_id("nav-tasks").click()
    arrived(page, "Tasks")
    page.keyboard.press("Tab")
    expect(page.get_by_test_id("task-model")).to_be_focused()
    live = page.locator("[aria-live]")
    expect(live).to_have_count(1)
    expect(live).to_have_attribute("aria-live", "polite")
    assert live.evaluate("e => e.closest('main') === null && e.id") == "announcer"
    assert page.get_by_test_id("view-announcer").aria_snapshot() == "- status: Tasks"

    page.get_by_test_id("nav-sessions").click()
    arrived(page, "Sessions")
    page.locator(f'[data-testid=session-row][data-session-id="{sid}"]').get_by_test_id("open-session").click()
    arrived(page, f"Session {sid[:8]}…{sid[-4:]}")   # opened to read: the heading, not the prompt box
    console.client.delete(f"/session/{sid}")


def test_a_view_chosen_before_the_console_has_started_gets_the_focus(
        console: Console, page: Page) -> None:
    """The nav used while the console still waits for its first ``/capabilities`` (a
    slow server, a loaded machine): once it answers, the view chosen is shown with its
    heading focused, as any move between views. Was the first load's (no focus: the
    hash changed before the console listened for changes; found as a CI flake of the
    test below). The first request may be routed after ``goto`` returns (CI: 0 held
    at once)."""
    held: list[Route] = []
    page.route("**/capabilities", lambda route: held.append(route))
    page.goto(console.url("/#/"))
    # the console's first request, held: it may reach the route after goto's "load"
    for _ in range(600):   # a hang bound (30 s), not a duration to beat
        if held:
            break
        page.wait_for_timeout(50)   # lets Playwright dispatch the route to its handler
    assert len(held) == 1
    page.get_by_test_id("nav-daemon").click()
    held[0].continue_()
    page.unroute("**/capabilities")
    arrived(page, "Daemon")


def test_back_and_forward_restore_the_view(console: Console, page: Page) -> None:
    sid = console.session()
    short = f"{sid[:8]}…{sid[-4:]}"
    page.goto(console.url("/#/"))
    page.get_by_test_id("nav-daemon").click()
    arrived(page, "Daemon")
    page.goto(console.url(f"/#/session/{sid}"))
    expect(page.get_by_test_id("stream-state")).to_have_text("live")
    page.get_by_test_id("nav-tasks").click()
    arrived(page, "Tasks")
    page.go_back()
    arrived(page, f"Session {short}")
    expect(page.get_by_test_id("stream-state")).to_have_text("live")
    page.go_back()
    arrived(page, "Daemon")
    expect(page.get_by_test_id("agent-row")).not_to_have_count(0)
    page.go_forward()
    arrived(page, f"Session {short}")
    page.go_forward()
    arrived(page, "Tasks")
    expect(page).to_have_url(re.compile(r"#/tasks$"))
    console.client.delete(f"/session/{sid}")


def test_an_id_that_does_not_decode_is_no_such_page(console: Console, page: Page) -> None:
    """``#/session/%E0%A4%A`` (a link cut short, typed by hand): decodeURIComponent threw,
    the page error left the view unmounted (its lists no longer refreshed) under the
    previous title and heading. It is the "No such page" view, as an unknown path is,
    and no nav link says it is the current page."""
    page.goto(console.url("/#/"))
    expect(page.get_by_test_id("nav-sessions")).to_have_attribute("aria-current", "page")
    for bad in ("#/session/%E0%A4%A", "#/task/%"):
        page.evaluate("hash => { location.hash = hash; }", bad)
        arrived(page, "No such page")
        expect(page.locator("[data-nav][aria-current]")).to_have_count(0)
        page.get_by_role("link", name="Sessions", exact=True).last.click()
        arrived(page, "Sessions")
    assert page.page_errors == []  # type: ignore[attr-defined]
