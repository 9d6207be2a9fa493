"""A conformance runner for any server: prompt-queue backpressure, ACP over HTTP, LMSP.

    from acp_server.conformance import Options, run_conformance

    report = await run_conformance("http://127.0.0.1:4170",
                                   options=Options(hold_prompt="SLOW story please"))
    print(report.summary(), report.exit_status())   # 0: checks ran, no MUST failed
    # RunStopped (TargetUnreachable, NothingToCheck, RateLimited): no verdict, exit 2

It talks only HTTP and WebSocket to the target and imports nothing of the server.
Modules: ``catalog`` (the checks), ``context`` (results, bounded waits, SSE),
``backpressure`` / ``acp_http`` / ``lmsp`` (the suites), ``runner``, ``report`` (JSON,
JUnit), ``display`` (the live table), ``cli`` (``acp-server conformance``).
"""

from __future__ import annotations

from acp_server.conformance.catalog import CHECKS, SUITES, Check
from acp_server.conformance.context import Options, RateLimited, Result, RunStopped
from acp_server.conformance.report import Report
from acp_server.conformance.runner import NothingToCheck, TargetUnreachable, run_conformance

__all__ = ["CHECKS", "SUITES", "Check", "NothingToCheck", "Options", "RateLimited", "Report",
           "Result", "RunStopped", "TargetUnreachable", "run_conformance"]
