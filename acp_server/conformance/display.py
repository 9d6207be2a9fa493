"""What ``acp-server conformance`` shows while it runs: a live table in a terminal,
one line per check otherwise.

    display = display_for(Console(), "conformance: http://127.0.0.1:4170")
    with display:
        display.plan(check_ids)      # the table appears, rows "…" until their result
        display.add(result)
    display.print_summary(report)

Contracts:

* Without a terminal (a pipe, a file, CI), or in one too narrow for the table
  (``TABLE_MIN_WIDTH``), each result is one line as it arrives,
  ``FAIL  MUST    backpressure.release.dropped  detail`` (outcome, level, id, the
  whole detail on one line), and the summary is a line of its own.
* In a terminal the table redraws in place. The id column is as wide as the longest
  id and never wraps; the detail column takes what is left and is cut with an
  ellipsis (the JSON and JUnit reports keep details whole).
* Nothing is drawn before ``plan``: a target that cannot be reached shows no table.
"""

from __future__ import annotations

from types import TracebackType
from typing import Protocol

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from acp_server.conformance.catalog import CHECKS
from acp_server.conformance.context import Result
from acp_server.conformance.report import Report

STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow", "…": "dim"}
LEVEL_WIDTH = max(len("SHOULD"), len("MUST"))


class Display(Protocol):
    def __enter__(self) -> Display: ...
    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...
    def plan(self, check_ids: list[str]) -> None: ...
    def add(self, result: Result) -> None: ...
    def print_summary(self, report: Report) -> None: ...


# The narrowest terminal that shows every id whole next to its level and outcome (plus
# 5 borders, 2 of padding per column and a sliver of detail); narrower ones get lines.
TABLE_MIN_WIDTH = max(len(i) for i in CHECKS) + LEVEL_WIDTH + len("outcome") + 5 + 8 + 10


def display_for(console: Console, title: str) -> Display:
    if console.is_terminal and console.width >= TABLE_MIN_WIDTH:
        return LiveTable(console, title)
    return LineReport(console)


def summary_line(report: Report) -> Text:
    summary = report.summary()
    verdict = Text("FAIL", style="bold red") if summary["must_failed"] or not report.checked \
        else Text("PASS", style="bold green")
    return Text.assemble(verdict, f"  {summary['pass']} passed, {summary['fail']} failed "
                         f"({summary['must_failed']} MUST), {summary['skip']} skipped "
                         f"— {report.target}{'' if report.checked else ': nothing checked'}")


def _one_line(detail: str) -> str:
    return " ".join(detail.split())


class LineReport:
    """One line per result, as it arrives; nothing redrawn."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __enter__(self) -> LineReport:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        pass

    def plan(self, check_ids: list[str]) -> None:
        pass

    def add(self, result: Result) -> None:
        line = f"{result.outcome.upper():<4}  {result.level:<{LEVEL_WIDTH}}  {result.id}"
        if result.detail:
            line += f"  {_one_line(result.detail)}"
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def print_summary(self, report: Report) -> None:
        self.console.print(summary_line(report), soft_wrap=True)


class LiveTable:
    """The results as a table redrawn in place."""

    def __init__(self, console: Console, title: str) -> None:
        self.console = console
        self.title = title
        self.ids: list[str] = []
        self.results: dict[str, Result] = {}
        self._live: Live | None = None

    def __enter__(self) -> LiveTable:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.update(self._render(), refresh=True)
            self._live.__exit__(kind, exc, tb)

    def plan(self, check_ids: list[str]) -> None:
        self.ids = list(check_ids)
        if self._live is None:
            self._live = Live(self._render(), console=self.console, auto_refresh=False)
            self._live.__enter__()
        self._refresh()

    def add(self, result: Result) -> None:
        self.results[result.id] = result
        if result.id not in self.ids:
            self.ids.append(result.id)
        self._refresh()

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render(), refresh=True)

    def _render(self) -> Table:
        widest = max((len(check_id) for check_id in self.ids), default=10)
        fixed = (widest, LEVEL_WIDTH, len("outcome"))
        # What is left of the width for the detail: 5 borders and 2 of padding per column.
        detail = max(self.console.width - sum(fixed) - 5 - 2 * 4, len("detail"))
        table = Table(title=self.title, expand=False)
        for name, width in zip(("check", "level", "outcome"), fixed, strict=True):
            table.add_column(name, no_wrap=True, width=width)
        table.add_column("detail", no_wrap=True, overflow="ellipsis", max_width=detail)
        for check_id in self.ids:
            result = self.results.get(check_id)
            outcome = result.outcome if result else "…"
            text = _one_line(result.detail) if result else ""
            if len(text) > detail:
                text = text[:detail - 1] + "…"
            table.add_row(check_id, CHECKS[check_id].level, Text(outcome, style=STYLE[outcome]),
                          text)
        return table

    def print_summary(self, report: Report) -> None:
        self.console.print(summary_line(report))
