"""A run that checks nothing is no pass. ``acp-server conformance`` given our server's
``/acp`` endpoint (what ``acp-server connect`` takes) or a plain web server
(``python3 -m http.server``) printed ``PASS  0 passed, 0 failed (0 MUST), 0 skipped`` and
exited 0: a CI gate went green having tested nothing. Now such a run stops before it
begins with one line saying why (and, for ``…/acp``, the base URL to try), exit 2; a
run whose every check was skipped exits 2 too."""

from __future__ import annotations

import contextlib
import functools
import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from rich.console import Console

from acp_server.cli import build_parser
from acp_server.conformance import NothingToCheck, Report, Result, run_conformance
from acp_server.conformance.cli import run_conformance_args
from acp_server.conformance.display import summary_line
from tests.conformance.server import FAST, running_target

pytestmark = pytest.mark.anyio
FLAGS = ["--timeout", "5", "--settle-timeout", "15"]


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:   # noqa: A002
        pass


class _CatchAll(BaseHTTPRequestHandler):
    """A web server's catch-all (a single-page app): every GET is 200 ``text/html``."""

    def do_GET(self) -> None:   # noqa: N802
        body = b"<!doctype html><title>My app</title><div id=root></div>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:   # noqa: A002
        pass


@contextlib.contextmanager
def web_server(handler: Any) -> Iterator[str]:
    """The standard library's HTTP server (``python3 -m http.server``'s) on a loopback
    port, in a thread; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _cli(argv: list[str]) -> tuple[int, str]:
    parser, _ = build_parser()
    out = io.StringIO()
    status = run_conformance_args(parser.parse_args(argv),
                                  console=Console(file=out, width=220, force_terminal=False))
    return status, out.getvalue()


async def test_a_plain_http_server_is_nothing_to_check(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "index.html").write_text("<h1>files</h1>")
    with web_server(functools.partial(_Quiet, directory=str(tmp_path))) as url:
        with pytest.raises(NothingToCheck) as stopped:
            await run_conformance(url, options=FAST)
        status, out = await anyio.to_thread.run_sync(_cli, ["conformance", url, *FLAGS])
    assert str(stopped.value) == (
        f"nothing to check at {url}: no suite advertised (GET /capabilities answered 404 "
        "text/html, GET /lmsp/v1/capabilities answered 404 text/html, GET /acp answered 404 "
        "text/html); not an ACP server, or not its base URL (e.g. http://127.0.0.1:4170); "
        "--suite NAME runs a suite anyway")
    assert (status, out) == (2, "")          # no table, no PASS
    assert capsys.readouterr().err == f"acp-server conformance: {stopped.value}\n"


async def test_a_catch_all_web_page_is_no_acp_endpoint(tmp_path: Path) -> None:
    """``GET /acp`` answered 200 with a page is a web server's catch-all, not ``/acp``."""
    with web_server(_CatchAll) as url:
        with pytest.raises(NothingToCheck, match=r"GET /acp answered 200 text/html\)"):
            await run_conformance(url, options=FAST)


async def test_our_acp_endpoint_for_the_base_url_says_which_url_to_try(
        tmp_path: Path, capsys: Any) -> None:
    async with running_target(tmp_path) as url:
        with pytest.raises(NothingToCheck) as stopped:
            await run_conformance(f"{url}/acp", options=FAST)
        with pytest.raises(NothingToCheck):   # a suite named does not run at /acp/acp
            await run_conformance(f"{url}/acp/", options=FAST, suites=["acp-http"])
        status, out = await anyio.to_thread.run_sync(_cli, ["conformance", f"{url}/acp", *FLAGS])
    assert str(stopped.value) == (
        f"nothing to check at {url}/acp: no suite advertised (GET /acp/capabilities answered "
        "404 application/json, GET /acp/lmsp/v1/capabilities answered 404 application/json, "
        "GET /acp/acp answered 404 application/json); the runner takes the server's base URL, "
        f"not its /acp endpoint: try {url}")
    assert (status, out) == (2, "")
    # the last line (hypercorn, the server under trio, logs its start on stderr too)
    assert capsys.readouterr().err.splitlines()[-1] == f"acp-server conformance: {stopped.value}"


def test_a_run_whose_every_check_skipped_is_no_pass() -> None:
    skipped = Report("http://x", "2026-12-01T00:00:00Z",
                     [Result("backpressure.failure.no-poison", "skip", "no --fail-prompt")])
    assert not skipped.checked and skipped.exit_status() == 2
    assert skipped.summary() == {"pass": 0, "fail": 0, "skip": 1, "must_failed": 0}
    assert summary_line(skipped).plain == (
        "FAIL  0 passed, 0 failed (0 MUST), 1 skipped — http://x: nothing checked")
    empty = Report("http://x", "2026-12-01T00:00:00Z", [])
    assert empty.exit_status() == 2
    ran = Report("http://x", "2026-12-01T00:00:00Z",
                 [Result("backpressure.failure.no-poison", "skip", "n/a"),
                  Result("acp-http.status.409", "fail", "saw 200")])   # a SHOULD
    assert ran.checked and ran.exit_status() == 0
    assert summary_line(ran).plain.startswith("PASS  0 passed, 1 failed (0 MUST)")
