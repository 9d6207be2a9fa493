"""Before/after pairs of ``bench.lmsp_inprocess`` run at the same moment: two code trees,
one process each, started together, so that whatever else the machine does weighs on
both alike.

    git worktree add --detach /tmp/before main       # or: git archive main | tar -x -C …
    python -m bench.paired /tmp/before .             # 4 pairs, best of 3 rounds each
    python -m bench.paired /tmp/before . 6           # 6 pairs
    BENCH_LMSP_STORE=postgresql://… python -m bench.paired /tmp/before .

Each round runs ``python -m bench.lmsp_inprocess 1`` in both trees at once (the one
started first alternates); a pair is the best (lowest) of 3 rounds of each side. Printed
per pair: the event loop's CPU µs per task before and after and their difference, and
the process's; then the differences. Run back to back, the same tree's best of 3 moved
by ±100 µs a task within minutes on the shared 2-core machine (its neighbours' load);
run together, two copies of one tree differed by at most 16 µs (2026-12-04). Both
processes share the 2 cores, so the absolute figures are those of a loaded machine:
compare within a pair.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

ROUNDS = 3


def _start(tree: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "bench.lmsp_inprocess", "1"], cwd=tree,
                            env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def pair(before: str, after: str, first: int) -> dict[str, list[dict[str, Any]]]:
    """``ROUNDS`` rounds of both trees run together; ``first``: which starts first."""
    got: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for r in range(ROUNDS):
        order = [("before", before), ("after", after)]
        if (first + r) % 2:
            order.reverse()
        running = [(side, _start(tree)) for side, tree in order]
        for side, process in running:
            out, _ = process.communicate()
            if process.returncode != 0:
                raise SystemExit(f"{side}: bench.lmsp_inprocess exited {process.returncode}")
            got[side].append(json.loads(out.strip().splitlines()[-1]))
    return got


def main(argv: list[str]) -> None:
    before, after = os.path.abspath(argv[0]), os.path.abspath(argv[1])
    pairs = int(argv[2]) if len(argv) > 2 else 4
    deltas = []
    for i in range(pairs):
        got = pair(before, after, i)
        b, a = (min(x["loop_us"] for x in got[s]) for s in ("before", "after"))
        bp, ap = (min(x["process_us"] for x in got[s]) for s in ("before", "after"))
        deltas.append(a - b)
        print(f"pair {i + 1}: loop {b:.0f} → {a:.0f} µs ({a - b:+.0f}, {(a / b - 1) * 100:+.1f} %);"
              f" process {bp:.0f} → {ap:.0f}", flush=True)
    print(f"loop µs a task, after − before: {' / '.join(f'{d:+.0f}' for d in deltas)}"
          f" (mean {sum(deltas) / len(deltas):+.0f})")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(sys.argv[1:])
