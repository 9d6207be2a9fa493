"""Bounds of the fuzz suite: examples per test and a wall-clock budget per test.

    FUZZ_EXAMPLES=5000 FUZZ_SECONDS=120 pytest tests/fuzz      # a longer local run

Past its budget a test's remaining examples return at once (hypothesis still counts
them), so one backend's whole suite stays well inside CI's budget (~20 s here).
"""

from __future__ import annotations

import os
import time

from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "1000"))
SECONDS = float(os.environ.get("FUZZ_SECONDS", "15"))


def fuzz_settings(share: float = 1.0) -> settings:
    """``share`` of ``EXAMPLES`` (WebSocket examples cost a handshake each)."""
    return settings(max_examples=max(10, int(EXAMPLES * share)), deadline=None,
                    database=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


class Budget:
    def __init__(self, seconds: float = SECONDS) -> None:
        self.ends = time.monotonic() + seconds

    @property
    def spent(self) -> bool:
        return time.monotonic() > self.ends
