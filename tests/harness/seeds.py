"""The seeds a seeded test runs, from its environment variables::

    seeds("ACP_CRASH", (19, 20))   # ACP_CRASH_SEED=12: [12]; ACP_CRASH_SEEDS=40: 0..39;
                                   # ACP_CRASH_SEEDS=40:80: 40..79; else the CI seeds

``PREFIX_SEED`` (one seed, a replay) wins over ``PREFIX_SEEDS``.
"""

from __future__ import annotations

import os


def seeds(prefix: str, ci_seeds: tuple[int, ...]) -> list[int]:
    if os.environ.get(f"{prefix}_SEED"):
        return [int(os.environ[f"{prefix}_SEED"])]
    if os.environ.get(f"{prefix}_SEEDS"):   # N (0..N-1) or A:B (A..B-1)
        first, _, end = os.environ[f"{prefix}_SEEDS"].rpartition(":")
        return list(range(int(first or 0), int(end)))
    return list(ci_seeds)
