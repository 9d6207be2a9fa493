"""What a careful person finds using the console, in Debian's chromium against a live
``acp-server serve``: a server that stops answering, right-to-left text, what a
screen reader is told, and the cancel note."""

from __future__ import annotations

import time
from pathlib import Path

from playwright.sync_api import Browser, Page, Request, expect

from tests.web.conftest import Console, open_page, running_console


def test_lists_say_the_server_is_not_answering_keep_rows_inert_and_ask_less_often(
        browser: Browser, tmp_path: Path) -> None:
    """Server stopped under the Sessions page: not "Failed to fetch" over rows that
    still offer Delete, and not one request a second for ever: the page says the server
    is not answering, keeps the rows to read but inert, and waits longer each time."""
    page = open_page(browser)
    failed: list[float] = []

    def note(request: Request) -> None:
        if "/sessions?" in request.url:
            failed.append(time.monotonic())

    page.on("requestfailed", note)
    try:
        with running_console(tmp_path) as server:
            sid = server.session()
            page.goto(server.url("/#/"))
            row = page.get_by_test_id("session-row")
            expect(row).to_have_attribute("data-session-id", sid)
            expect(page.get_by_test_id("live-sessions").locator("xpath=..")).not_to_have_attribute(
                "inert", "")
        error = page.get_by_test_id("list-error")
        expect(error).to_contain_text("The server is not answering")
        expect(error).to_contain_text("the list below is from")
        expect(row).to_be_visible()   # kept to read
        expect(page.get_by_test_id("live-sessions").locator("xpath=..")).to_have_attribute("inert", "")
        expect(page.get_by_test_id("ended-sessions").locator("xpath=..")).to_have_attribute("inert", "")
        deadline = time.monotonic() + 30
        while len(failed) < 3 and time.monotonic() < deadline:
            page.wait_for_event("requestfailed", timeout=15_000)
        gaps = [b - a for a, b in zip(failed, failed[1:])]
        assert gaps[1] > 1.5 * gaps[0], gaps   # backing off, not every second
        assert page.page_errors == []  # type: ignore[attr-defined]
    finally:
        page.context.close()
