"""The console with stored tokens, in Debian's chromium against a live ``acp-server
serve``: two principals sign in with their tokens, each sees its own sessions, tasks
and permission requests and never the other's; an admin sees all, marked with their
owners; a token that may only read gets a console that offers nothing it may not do."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.web.conftest import Console, open_page, running_console

BOOT = "boot-s3cret-token"
HOLD = "/permission please"   # the reference agent asks before it answers


@pytest.fixture(scope="module")
def team(browser: Browser, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[Console, dict[str, str]]]:
    """One daemon with a bootstrap token and three stored ones: alice and bob (prompt,
    read), viewer (read)."""
    with running_console(tmp_path_factory.mktemp("team"), token=BOOT) as console:
        tokens = {}
        for name, scopes in (("alice", []), ("bob", []), ("viewer", ["read"])):
            made = console.client.post("/tokens", json={"name": name, "scopes": scopes,
                                                        "rateClass": "unlimited"})
            assert made.status_code == 201, made.text
            tokens[name] = made.json()["token"]
        yield console, tokens


def sign_in(browser: Browser, console: Console, token: str, path: str = "/") -> Page:
    page = open_page(browser)
    page.goto(console.url(path))
    expect(page.locator("#token-dialog")).to_be_visible()
    page.get_by_test_id("token-input").fill(token)
    page.get_by_test_id("token-submit").click()
    expect(page.locator("#token-dialog")).to_be_hidden()
    return page


def new_session(page: Page) -> str:
    page.get_by_test_id("nav-sessions").click()
    page.get_by_test_id("new-session").click()
    expect(page.get_by_test_id("stream-state")).to_have_text("live")
    return page.url.rsplit("/", 1)[1]


def row(page: Page, sid: str):  # noqa: ANN201 - a Locator
    return page.locator(f'[data-testid=session-row][data-session-id="{sid}"]')


def test_two_principals_never_see_each_others_work_and_an_admin_sees_all(
        browser: Browser, team: tuple[Console, dict[str, str]]) -> None:
    console, tokens = team
    alice = sign_in(browser, console, tokens["alice"])
    bob = sign_in(browser, console, tokens["bob"])
    admin = sign_in(browser, console, BOOT)
    try:
        expect(alice.get_by_test_id("principal")).to_have_text("alice (prompt, read)")
        expect(admin.get_by_test_id("principal")).to_have_text("bootstrap (admin, prompt, read)")
        a, b = new_session(alice), new_session(bob)
        # alice's agent asks for a permission: on her page only
        alice.get_by_test_id("prompt-input").fill(HOLD)
        alice.get_by_test_id("send-prompt").click()
        expect(alice.get_by_test_id("permission-request")).to_have_count(1)
        # the lists: each its own; the admin both, each marked with its owner
        for page, mine, other in ((alice, a, b), (bob, b, a)):
            page.get_by_test_id("nav-sessions").click()
            expect(row(page, mine)).to_have_count(1)
            expect(row(page, mine).get_by_test_id("row-owner")).to_have_count(0)
            expect(row(page, other)).to_have_count(0)
        admin.get_by_test_id("nav-sessions").click()
        expect(row(admin, a).get_by_test_id("row-owner")).to_have_text("alice")
        expect(row(admin, b).get_by_test_id("row-owner")).to_have_text("bob")
        expect(row(admin, a)).to_contain_text("approval")
        # bob at alice's session's address: not here, nothing of hers shown
        bob.goto(console.url(f"/#/session/{a}"))
        expect(bob.get_by_test_id("session-banner")).to_contain_text("another principal made it")
        expect(bob.get_by_test_id("permission-request")).to_have_count(0)
        expect(bob.get_by_test_id("transcript").get_by_test_id("msg-user")).to_have_count(0)
        # the admin sees alice's request and answers it; alice's page sees it go
        admin.goto(console.url(f"/#/session/{a}"))
        expect(admin.get_by_test_id("permission-request")).to_have_count(1)
        admin.locator('[data-testid=permission-option][data-option-id="allow_once"]').click()
        expect(alice.get_by_test_id("permission-request")).to_have_count(0)
        # tasks: alice's task is in her list and the admin's, never in bob's
        task = alice.evaluate("""async () => {
            const r = await fetch('/lmsp/v1/tasks', {method: 'POST', headers: {
                'Authorization': 'Bearer ' + sessionStorage.getItem('acp-server.token'),
                'Content-Type': 'application/json'},
              body: JSON.stringify({type: 'response', input: {model: 'reference', input: 'hi'}})});
            return (await r.json()).id; }""")
        for page, shown in ((alice, 1), (admin, 1), (bob, 0)):
            page.goto(console.url("/#/tasks"))
            expect(page.locator(f'[data-task-id="{task}"]')).to_have_count(shown)
        for page in (alice, bob, admin):
            assert page.page_errors == []  # type: ignore[attr-defined]
    finally:
        for page in (alice, bob, admin):
            page.context.close()


def test_a_token_that_may_only_read_is_offered_nothing_else(
        browser: Browser, team: tuple[Console, dict[str, str]], tmp_path: Path) -> None:
    console, tokens = team
    shared = console.session()   # the bootstrap admin's: the viewer does not see it
    viewer = sign_in(browser, console, tokens["viewer"])
    try:
        expect(viewer.get_by_test_id("principal")).to_have_text("viewer (read)")
        expect(viewer.get_by_test_id("new-session")).to_be_disabled()
        expect(viewer.get_by_test_id("scope-hint")).to_contain_text('"prompt" scope')
        # the lists loaded: empty
        expect(viewer.get_by_test_id("live-sessions").locator(".empty-row")).to_have_count(1)
        expect(viewer.get_by_test_id("ended-sessions").locator(".empty-row")).to_have_count(1)
        expect(viewer.get_by_test_id("session-row")).to_have_count(0)
        expect(row(viewer, shared)).to_have_count(0)
        expect(viewer.get_by_test_id("list-error")).to_have_text("")
        # a refusal says what to do: the viewer's token cannot make a task
        status = viewer.evaluate("""async () => (await fetch('/session', {method: 'POST',
            headers: {'Authorization': 'Bearer ' + sessionStorage.getItem('acp-server.token'),
                      'Content-Type': 'application/json'}, body: '{}'})).status""")
        assert status == 403
        # Change token: the same tab becomes alice, who may prompt
        viewer.get_by_test_id("change-token").click()
        viewer.get_by_test_id("token-input").fill(tokens["alice"])
        viewer.get_by_test_id("token-submit").click()
        expect(viewer.get_by_test_id("principal")).to_have_text("alice (prompt, read)")
        expect(viewer.get_by_test_id("new-session")).to_be_enabled()
        expect(viewer.get_by_test_id("scope-hint")).to_have_count(0)
        assert viewer.page_errors == []  # type: ignore[attr-defined]
    finally:
        viewer.context.close()
        console.client.delete(f"/session/{shared}")
