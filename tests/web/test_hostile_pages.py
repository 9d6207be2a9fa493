"""Hostile web pages in a real browser against the daemon on loopback, no credential
configured (every loopback client is the ``local`` admin, so the page is the attacker):
Debian's chromium, the shipped daemon on granian and on uvicorn.

* **DNS rebinding**: chromium resolves ``evil.test`` to 127.0.0.1
  (``--host-resolver-rules``), so a page at ``http://evil.test:PORT/`` reaches the daemon
  with ``Host: evil.test:PORT`` and its requests are same-origin, without an
  ``Origin`` to refuse: the page itself, its ``fetch`` and its WebSocket to ``/acp``
  are answered 421 (the WebSocket never opens);
* **a foreign site**, local (``http://localhost:OTHER``, a server of the test's own)
  or public (``http://attacker.test``, served by the browser's own request routing),
  posting to the daemon's loopback address: a JSON ``fetch`` (a CORS preflight), a
  "simple" ``no-cors`` post that needs no preflight (the CSRF case), and a WebSocket
  to ``/acp``: each refused by its ``Origin`` (403) when chromium sends it at all
  (from a public site its Private Network Access may block it first);
* and the daemon's own page (``http://127.0.0.1:PORT/``), the control: the same
  ``fetch`` and WebSocket work there (an ``initialize`` answered).

After the attacks nothing was made: no session, no token.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, Route, sync_playwright

from tests.web.conftest import Console, chromium_path, running_console

ATTACKER = "http://attacker.test"
REBOUND = "evil.test"

# what a page's script reports of a WebSocket: "open" with the first answer, else how
# it ended ("error" then "close"), never both
WEBSOCKET = """async (url) => await new Promise((resolve) => {
    const seen = [];
    const ws = new WebSocket(url);
    ws.onopen = () => { seen.push("open"); ws.send(JSON.stringify({jsonrpc: "2.0", id: 1,
        method: "initialize", params: {protocolVersion: 1, clientCapabilities: {}}})); };
    ws.onmessage = (m) => { seen.push("message:" + m.data); ws.close(); };
    ws.onerror = () => seen.push("error");
    ws.onclose = (e) => { seen.push("close:" + e.code); resolve(seen); };
})"""

FETCH_JSON = """async (url) => {
    try {
        const r = await fetch(url, {method: "POST", headers: {"Content-Type":
            "application/json"}, body: JSON.stringify({sessionScope: "thread"})});
        return {status: r.status, body: await r.text()};
    } catch (e) { return {failed: String(e)}; }
}"""

# a simple request: no preflight, the browser sends it and hides the answer
FETCH_SIMPLE = """async (url) => {
    try {
        await fetch(url, {method: "POST", mode: "no-cors", headers: {"Content-Type":
            "text/plain"}, body: JSON.stringify({sessionScope: "thread"})});
        return "sent";
    } catch (e) { return "failed: " + String(e); }
}"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """This module's chromium (``conftest.page`` opens its tabs): ``evil.test``
    resolved to 127.0.0.1, as a rebinding attack makes it."""
    path = chromium_path()
    if path is None:
        pytest.skip("no chromium found (install Debian's chromium package)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=path, headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage",
                  f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"])
        yield launched
        launched.close()


@pytest.fixture(scope="module", params=["granian", "uvicorn"])
def daemon(request: pytest.FixtureRequest, browser: Browser,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    with running_console(tmp_path_factory.mktemp(f"hostile-{request.param}"),
                         "--http-server", request.param) as console:
        yield console


def _made_nothing(daemon: Console) -> None:
    sessions = daemon.client.get(f"/workspace/{daemon.workspace_id()}/sessions").json()
    assert sessions["sessions"] == [], sessions
    assert daemon.client.get("/tokens").json()["tokens"] == []


def _ws_url(base_url: str) -> str:
    return "ws" + base_url.removeprefix("http") + "/acp"


def test_a_rebound_name_is_refused_page_fetch_and_websocket(daemon: Console,
                                                            page: Page) -> None:
    port = daemon.base_url.rsplit(":", 1)[1]
    rebound = f"http://{REBOUND}:{port}"
    landed = page.goto(rebound + "/")
    assert landed is not None and landed.status == 421, landed and landed.status
    posted = page.evaluate(FETCH_JSON, rebound + "/session")
    assert posted.get("status") == 421, posted
    tokens = page.evaluate(FETCH_JSON, rebound + "/tokens")
    assert tokens.get("status") == 421, tokens
    seen = page.evaluate(WEBSOCKET, _ws_url(rebound))
    assert "open" not in seen and seen[-1].startswith("close:"), seen
    _made_nothing(daemon)


@pytest.fixture(scope="module")
def local_site() -> Iterator[str]:
    """Another site on this machine (``http://localhost:PORT``, its own port): a page
    the browser counts as local, whose requests to the daemon chromium sends."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:   # noqa: N802 - the stdlib's name
            body = b"<html><body>another local site</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler) as site:
        thread = threading.Thread(target=site.serve_forever, daemon=True)
        thread.start()
        yield f"http://localhost:{site.server_address[1]}"
        site.shutdown()


def _routed_site(page: Page) -> str:
    """A page at ``ATTACKER``, served by the browser's routing (no server of its own)."""
    def serve(route: Route) -> None:
        route.fulfill(status=200, content_type="text/html",
                      body="<html><body>a page on another site</body></html>")

    page.route(f"{ATTACKER}/**", serve)
    return ATTACKER


@pytest.mark.parametrize("site", ["local", "public"])
def test_a_foreign_site_is_refused_fetch_form_post_and_websocket(
        daemon: Console, page: Page, local_site: str, site: str) -> None:
    """Whatever chromium lets through (to loopback from a public site it may block
    a request itself: Private Network Access) reaches the daemon and is refused 403."""
    origin = local_site if site == "local" else _routed_site(page)
    landed = page.goto(origin + "/")
    assert landed is not None and landed.status == 200
    posted = page.evaluate(FETCH_JSON, daemon.base_url + "/session")
    assert "failed" in posted, posted   # the preflight (or the answer) is refused
    if site == "local":   # a simple request is sent: the daemon refuses it
        with page.expect_response(lambda r: r.url == daemon.base_url + "/session"
                                 and r.request.method == "POST") as answered:
            simple = page.evaluate(FETCH_SIMPLE, daemon.base_url + "/session")
        assert simple == "sent", simple   # opaque to the page
        assert answered.value.status == 403, answered.value.status
    else:
        page.evaluate(FETCH_SIMPLE, daemon.base_url + "/session")
    seen = page.evaluate(WEBSOCKET, _ws_url(daemon.base_url))
    assert "open" not in seen and seen[-1].startswith("close:"), seen
    _made_nothing(daemon)


def test_the_daemons_own_page_may(daemon: Console, page: Page) -> None:
    """The control: the same script on the daemon's own page is served."""
    landed = page.goto(daemon.base_url + "/")
    assert landed is not None and landed.status == 200
    seen = page.evaluate(WEBSOCKET, _ws_url(daemon.base_url))
    assert seen[0] == "open" and seen[1].startswith("message:"), seen
    assert '"protocolVersion"' in seen[1], seen
    posted = page.evaluate(FETCH_JSON, daemon.base_url + "/session")
    assert posted.get("status") == 200, posted
    made = daemon.client.get(f"/workspace/{daemon.workspace_id()}/sessions").json()
    assert len(made["sessions"]) == 1
    daemon.client.delete(f"/session/{made['sessions'][0]['sessionId']}")

