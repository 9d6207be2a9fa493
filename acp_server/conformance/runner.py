"""Run the suites against a target and collect a ``Report``.

    report = await run_conformance("http://127.0.0.1:4170", options=Options(),
                                   suites=None, on_result=print)
    report.exit_status()

Contracts: with ``suites=None`` the suites the target advertises run (``backpressure``
when ``/capabilities`` has ``limits``, ``acp-http`` when ``/acp`` answers something
other than 404/405, ``lmsp`` when ``/lmsp/v1/capabilities`` answers 200 with
``capabilities.tasks``); named suites always run. Scenarios run one after another;
their clean-ups (sessions deleted, tasks cancelled, connections deleted) run after
each one. Every check of a suite that ran has exactly one result. A target that
answers nothing, or refuses the credentials (401 / 403 on ``/capabilities``), raises
``TargetUnreachable``; one that advertises no suite when none is named (a plain web
server; our server's ``/acp`` endpoint given for its base URL, which gets that hint),
or given as ``…/acp`` and advertising nothing, ``NothingToCheck``; a rate limit
(``context.is_rate_limit``) met anywhere stops the run after its clean-ups with
``context.RateLimited``. All
are ``RunStopped``: one line, exit status 2. A capabilities document the runner
cannot read (not JSON, nested too deep, over the cap) advertises nothing; a ``GET /acp``
answered 404, 405 or a 2xx web page (``text/html``) advertises no ``acp-http``.
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from acp_server.client.errors import DaemonProtocolError, redact, transport_reason
from acp_server.conformance import acp_http, backpressure, lmsp
from acp_server.conformance.catalog import SUITES, checks_of
from acp_server.conformance.context import Context, Options, Result, RunStopped, stopped
from acp_server.conformance.report import Report

Scenario = Callable[[Context], Awaitable[None]]
SCENARIOS: dict[str, Sequence[Scenario]] = {
    "backpressure": backpressure.SCENARIOS, "acp-http": acp_http.SCENARIOS,
    "lmsp": lmsp.SCENARIOS}


class TargetUnreachable(RunStopped):
    """The target answers nothing, or refuses the runner's credentials."""


class NothingToCheck(RunStopped):
    """No suite to run: the target advertises none (it is not such a server, or the
    address is not its base URL)."""


def _refused(ctx: Context, response: httpx.Response) -> TargetUnreachable | None:
    """A 401 / 403 before anything ran: the credentials, said in one line."""
    if response.status_code == 401:
        return TargetUnreachable(f"{redact(ctx.base_url)} refused the credentials (401): check "
                                 "--token / $ACP_SERVER_TOKEN (missing, wrong, revoked or "
                                 "expired)")
    if response.status_code == 403:
        try:
            why = str(response.json().get("error") or "")
        except (ValueError, AttributeError, RecursionError):
            why = ""
        return TargetUnreachable(f"{redact(ctx.base_url)} refused this client (403): {why} (the "
                                 "suites need the read and prompt scopes; a stored token "
                                 "also needs --unlimited, or the rate limits answer 429)")
    return None


def _seen(response: httpx.Response) -> str:
    """``404 text/html``: a probe's answer, for the line of a run with nothing to check."""
    kind = response.headers.get("content-type", "").split(";")[0].strip()
    return f"{response.status_code}{' ' + kind if kind else ''}"


def _probed(ctx: Context, path: str) -> str:
    """The path a probe of ``path`` asks for (under the base URL's own path)."""
    return urlsplit(ctx.base_url).path + path


async def _json(ctx: Context, path: str) -> dict[str, Any] | None:
    try:
        response = await ctx.request("GET", path)
    except DaemonProtocolError:   # over the cap, or a body that cannot be decoded
        ctx.probes[_probed(ctx, path)] = "an answer the runner cannot read"
        return None
    refused = _refused(ctx, response)
    if refused is not None:
        raise refused
    ctx.probes[_probed(ctx, path)] = _seen(response)
    if response.status_code != 200:
        return None
    try:
        body = response.json()
    except (ValueError, RecursionError):   # not JSON, or nested too deep
        return None
    return body if isinstance(body, dict) else None


def _web_page(response: httpx.Response) -> bool:
    """A 2xx HTML page: what a web server's catch-all answers, not an ACP endpoint."""
    return response.is_success and response.headers.get("content-type", "").startswith(
        "text/html")


async def discover(ctx: Context) -> list[str]:
    """Read the target's capabilities into ``ctx``; the suites it advertises."""
    try:
        ctx.capabilities = await _json(ctx, "/capabilities")
        ctx.lmsp_capabilities = await _json(ctx, "/lmsp/v1/capabilities")
        probe = await ctx.request("GET", acp_http.PATH, headers={"Accept": "text/event-stream"})
    except httpx.HTTPError as exc:
        raise TargetUnreachable(f"cannot reach {redact(ctx.base_url)}: "
                                f"{transport_reason(exc)}") from exc
    refused = _refused(ctx, probe)   # a stream needs the read scope
    if refused is not None and probe.headers.get("content-type", "").startswith(
            "application/json") and b"forbidden" in probe.content:
        raise refused
    ctx.probes[_probed(ctx, acp_http.PATH)] = _seen(probe)
    found = []
    if ctx.capabilities is not None and isinstance(ctx.capabilities.get("limits"), dict):
        found.append("backpressure")
    if probe.status_code not in (404, 405) and not _web_page(probe):
        found.append("acp-http")
    if ((ctx.lmsp_capabilities or {}).get("capabilities") or {}).get("tasks"):
        found.append("lmsp")
    return found


def _acp_endpoint(url: str) -> str | None:
    """The base URL when ``url`` is a server's ``/acp`` endpoint (``acp-server connect``
    takes that one), else None."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if not path.endswith(acp_http.PATH):
        return None
    return urlunsplit(parts._replace(path=path[:-len(acp_http.PATH)]))


def nothing_to_check(ctx: Context, url: str) -> NothingToCheck:
    seen = ", ".join(f"GET {path} answered {what}" for path, what in ctx.probes.items())
    base = _acp_endpoint(url)
    if base is not None:
        hint = (f"the runner takes the server's base URL, not its {acp_http.PATH} endpoint: "
                f"try {redact(base)}")
    else:
        hint = ("not an ACP server, or not its base URL (e.g. http://127.0.0.1:4170); "
                "--suite NAME runs a suite anyway")
    return NothingToCheck(f"nothing to check at {redact(url)}: no suite advertised ({seen}); "
                          f"{hint}")


async def run_conformance(url: str, *, options: Options | None = None,
                          suites: Sequence[str] | None = None,
                          on_result: Callable[[Result], None] | None = None,
                          on_plan: Callable[[list[str]], None] | None = None,
                          transport: httpx.AsyncBaseTransport | None = None) -> Report:
    options = options or Options()
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    async with Context.open(url, options, on_result, transport) as ctx:
        advertised = await discover(ctx)
        if not advertised and (not suites or _acp_endpoint(url) is not None):
            raise nothing_to_check(ctx, url)
        chosen = [s for s in SUITES if s in (suites or advertised)]
        if on_plan is not None:
            on_plan([check.id for suite in chosen for check in checks_of(suite)])
        for suite in chosen:
            for scenario in SCENARIOS[suite]:
                try:
                    await scenario(ctx)
                except BaseException as exc:
                    stop = stopped(exc)
                    if stop is None or stop is exc:
                        raise
                    raise stop from None   # out of the scenario's task groups
                finally:
                    await ctx.run_cleanups()
            for check in checks_of(suite):
                if check.id not in ctx.results:
                    ctx.failed(check.id, "the runner recorded no result (a runner bug)")
        order = [check.id for suite in chosen for check in checks_of(suite)]
        return Report(target=url, started_at=started,
                      results=[ctx.results[check_id] for check_id in order])
