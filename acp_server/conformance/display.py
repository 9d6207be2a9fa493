"""The live terminal table of results and its summary line (rich).

    with LiveTable(console) as table:
        table.plan(check_ids)        # rows appear as "…" until their result arrives
        table.add(result)
    table.print_summary(report)

Contracts: on a terminal the table redraws in place as results arrive; otherwise
(a pipe, CI) it prints once at the end. Details are cut to one line in the table
(the JSON and JUnit reports keep them whole).
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from acp_server.conformance.catalog import CHECKS
from acp_server.conformance.context import Result
from acp_server.conformance.report import Report

STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow", "…": "dim"}
DETAIL_WIDTH = 90


class LiveTable:
    def __init__(self, console: Console, title: str) -> None:
        self.console = console
        self.title = title
        self.ids: list[str] = []
        self.results: dict[str, Result] = {}
        self._live = Live(self._render(), console=console, auto_refresh=False,
                          transient=False)

    def __enter__(self) -> LiveTable:
        self._live.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._live.update(self._render(), refresh=True)
        self._live.__exit__(kind, exc, tb)

    def plan(self, check_ids: list[str]) -> None:
        self.ids = list(check_ids)
        self._live.update(self._render(), refresh=True)

    def add(self, result: Result) -> None:
        self.results[result.id] = result
        if result.id not in self.ids:
            self.ids.append(result.id)
        self._live.update(self._render(), refresh=True)

    def _render(self) -> Table:
        table = Table(title=self.title, expand=False)
        for column in ("check", "level", "outcome", "detail"):
            table.add_column(column, overflow="fold" if column == "check" else "ellipsis",
                             no_wrap=column == "detail")
        for check_id in self.ids:
            result = self.results.get(check_id)
            outcome = result.outcome if result else "…"
            detail = (result.detail if result else "").replace("\n", " ")
            if len(detail) > DETAIL_WIDTH:
                detail = detail[:DETAIL_WIDTH - 1] + "…"
            table.add_row(check_id, CHECKS[check_id].level,
                          Text(outcome, style=STYLE[outcome]), detail)
        return table

    def print_summary(self, report: Report) -> None:
        summary = report.summary()
        verdict = Text("FAIL", style="bold red") if summary["must_failed"] \
            else Text("PASS", style="bold green")
        line = Text.assemble(verdict, f"  {summary['pass']} passed, {summary['fail']} failed "
                             f"({summary['must_failed']} MUST), {summary['skip']} skipped "
                             f"— {report.target}")
        self.console.print(line)
