"""The issue's targets, collected from one ``make bench`` run and printed as one table.

    from bench.targets import record
    record("REST prompts accepted and completed / bare route", 0.52, 0.5)        # ≥ target
    record("event-loop lag p99 (ms)", 3.1, 10.0, lower_is_better=True)          # < target

``python -m bench`` prints ``summary()`` after every section: each figure with its
target, the ratio figure / target (target / figure when lower is better, so ≥ 1.00
always means met) and whether it is met.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str
    figure: float | None   # None: not measured in this run (say why in ``note``)
    target: float
    lower_is_better: bool = False
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.figure is None or self.figure == 0:
            return None
        return self.target / self.figure if self.lower_is_better else self.figure / self.target


RESULTS: list[Target] = []


def record(name: str, figure: float | None, target: float, *, lower_is_better: bool = False,
           note: str = "") -> None:
    RESULTS.append(Target(name, figure, target, lower_is_better, note))


def _num(value: float) -> str:
    return f"{value:.2f}" if abs(value) < 100 else f"{value:,.0f}"


def summary() -> list[str]:
    if not RESULTS:
        return []
    lines = ["## Targets (issue #17), this run", "",
             "| what | figure | target | ratio to target | met |", "|---|---|---|---|---|"]
    for t in RESULTS:
        figure = "n/a" if t.figure is None else _num(t.figure)
        ratio = "n/a" if t.ratio is None else f"{t.ratio:.2f}"
        met = "n/a" if t.ratio is None else ("yes" if t.ratio >= 1 else "**no**")
        sign = "≤" if t.lower_is_better else "≥"
        note = f" ({t.note})" if t.note else ""
        lines.append(f"| {t.name}{note} | {figure} | {sign} {_num(t.target)} | {ratio} | {met} |")
    return lines
