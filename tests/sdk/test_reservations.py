"""The local cap: limit normalisation, release-once reservations, the error's shape."""

from __future__ import annotations

import math
import pickle

import pytest

from acp_server.client import (DaemonClient, DaemonHttpError, DaemonPendingPromptLimitError,
                               PromptReservations, normalize_pending_prompt_limit)
from acp_server.client.errors import error_from_status


@pytest.mark.parametrize(("value", "expected"), [
    (None, None), (0, None), (math.inf, None), (1, 1), (5, 5), (12, 12)])
def test_normalize_valid(value: object, expected: int | None) -> None:
    assert normalize_pending_prompt_limit(value) == expected


@pytest.mark.parametrize("value", [-1, 1.5, math.nan, True, False, "5", -math.inf, 5.0, [5]])
def test_normalize_invalid(value: object) -> None:
    with pytest.raises(ValueError, match="max_pending_prompts_per_session"):
        normalize_pending_prompt_limit(value)


@pytest.mark.parametrize("value", [-1, 1.5, math.nan, True, "5"])
def test_client_rejects_invalid_limit(value: object) -> None:
    with pytest.raises(ValueError):
        DaemonClient("http://127.0.0.1:1", max_pending_prompts_per_session=value)  # type: ignore[arg-type]


def test_client_limit_default_and_disabled() -> None:
    assert DaemonClient("http://x").max_pending_prompts_per_session == 5
    for off in (None, 0, math.inf):
        assert DaemonClient("http://x", max_pending_prompts_per_session=off) \
            .max_pending_prompts_per_session is None


def test_reserve_release_once() -> None:
    table = PromptReservations()
    first = table.reserve("s-1", 2)
    second = table.reserve("s-1", 2)
    with pytest.raises(DaemonPendingPromptLimitError) as info:
        table.reserve("s-1", 2)
    assert (info.value.session_id, info.value.limit, info.value.pending_count) == ("s-1", 2, 2)
    assert str(info.value) == 'Pending prompts full: "s-1" (2/2)'
    first.release()
    first.release()  # no double decrement
    assert table.count("s-1") == 1
    with second:
        pass
    second.release()
    assert table.count("s-1") == 0 and table.total == 0
    for _ in range(10):
        table.reserve("s-2", None)
    assert table.count("s-2") == 10


def test_errors_pickle_and_map() -> None:
    error = DaemonPendingPromptLimitError("s", 5, 4, 2.5)
    again = pickle.loads(pickle.dumps(error))
    assert (again.session_id, again.limit, again.pending_count, again.retry_after_s) == \
        ("s", 5, 4, 2.5)
    mapped = error_from_status(503, {"code": "prompt_queue_full", "sessionId": "x", "limit": 7,
                                     "pendingCount": 7, "error": "full"})
    assert isinstance(mapped, DaemonPendingPromptLimitError) and mapped.limit == 7
    other = error_from_status(503, {"code": "session_limit_exceeded", "error": "too many"})
    assert isinstance(other, DaemonHttpError) and other.code == "session_limit_exceeded"
    assert other.message == "too many" and other.status == 503
    text = error_from_status(502, "bad gateway")
    assert isinstance(text, DaemonHttpError) and text.message == "bad gateway"
