"""The console in a real browser: Debian's chromium driven by Playwright for Python
(``executable_path``: Playwright's own browser download is not used), against a real
``acp-server serve`` process on a loopback port.

    def test_x(console: Console, page: Page) -> None:
        page.goto(console.url("/#/tasks"))

The browser tests skip, with the reason, only when no chromium executable is found
(``ACP_SERVER_CHROMIUM`` names one; default ``chromium`` on the PATH or
``/usr/bin/chromium``). Every page fixture fails its test on an uncaught page error;
console messages are kept on ``page.console_errors`` for the tests that check them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.harness import ServeProcess

CHROMIUM_ENV = "ACP_SERVER_CHROMIUM"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
# A loaded CI machine (2 cores, several runs) may take seconds for what takes
# milliseconds here; the waits are for conditions, so a long ceiling costs nothing.
expect.set_options(timeout=15_000)


def chromium_path() -> str | None:
    for candidate in (os.environ.get(CHROMIUM_ENV), shutil.which("chromium"),
                      "/usr/bin/chromium"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@dataclass
class Console:
    """A running daemon: its base URL, an HTTP client with its token, its process."""

    base_url: str
    client: httpx.Client
    process: subprocess.Popen[str]
    token: str | None = None

    def url(self, path: str = "/") -> str:
        return self.base_url + path

    def session(self) -> str:
        response = self.client.post("/session", json={"sessionScope": "thread"})
        assert response.status_code == 200, response.text
        return str(response.json()["sessionId"])

    def workspace_id(self) -> str:
        return str(self.client.get("/capabilities").json()["workspaces"][0]["id"])

    def prompt(self, session_id: str, text: str) -> httpx.Response:
        return self.client.post(f"/session/{session_id}/prompt",
                                json={"prompt": [{"type": "text", "text": text}]})


@contextlib.contextmanager
def running_console(tmp: Path, *flags: str, token: str | None = None) -> Iterator[Console]:
    """``acp-server serve`` (``tests.harness.ServeProcess``) in its own workspace and
    state folder, stopped (SIGTERM, then SIGKILL) at the end."""
    workspace = tmp / "ws"
    workspace.mkdir(parents=True, exist_ok=True)
    token_flags = ("--token", token) if token is not None else ()
    with ServeProcess(workspace, *flags, *token_flags, state_dir=tmp / "state") as child:
        assert child.process is not None
        yield Console(child.base_url, child.http, child.process, token)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One chromium per module. Not per session: Playwright's sync API keeps an asyncio
    loop running while it is open, and the anyio tests of other modules need none."""
    path = chromium_path()
    if path is None:
        pytest.skip(f"no chromium found (install Debian's chromium package or set {CHROMIUM_ENV})")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path, headless=True,
                                              args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def console(browser: Browser, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """One daemon for a module: default limits (5 pending prompts per session), one
    LMSP task at a time (so a second task stays ``queued`` until the first ends)."""
    with running_console(tmp_path_factory.mktemp("console"), "--max-running-tasks", "1") as c:
        yield c


def open_page(browser: Browser, **context: Any) -> Page:
    ctx = browser.new_context(viewport=context.pop("viewport", DESKTOP), **context)
    page = ctx.new_page()
    page.console_errors = []  # type: ignore[attr-defined]
    page.page_errors = []  # type: ignore[attr-defined]
    page.on("console", lambda m: m.type == "error" and page.console_errors.append(m.text))  # type: ignore[attr-defined]
    page.on("pageerror", lambda e: page.page_errors.append(str(e)))  # type: ignore[attr-defined]
    page.set_default_timeout(15_000)
    return page


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh tab (own sessionStorage) at 1280×800; fails the test on a page error."""
    tab = open_page(browser)
    try:
        yield tab
        assert tab.page_errors == []  # type: ignore[attr-defined]
    finally:
        tab.context.close()
