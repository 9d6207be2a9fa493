"""The policy that answers permission requests asked during LMSP work.

    outcome, kind = decide("reject", params["options"])
    # ({"outcome": "selected", "optionId": "reject_once"}, "reject_once")

Nobody can answer a permission request over LMSP, so the runner answers it at once
(``--lmsp-permissions``): ``reject`` (default) selects the agent's first
``reject_once`` / ``reject_always`` option, ``allow`` its first ``allow_once`` /
``allow_always`` option, ``cancel`` answers ``cancelled``; with no option of the
wanted kind the answer is ``cancelled``. The decision is written to the task's
event stream as ``response.permission_decided`` (``request_id``, ``policy``,
``outcome``, ``option_kind``, ``tool_call``) and counted per decision in
``GET /daemon/status`` → ``runtime.permissions.lmspDecisions``.
"""

from __future__ import annotations

from typing import Any

POLICIES = ("reject", "allow", "cancel")
_KINDS = {"reject": ("reject_once", "reject_always"), "allow": ("allow_once", "allow_always")}
CANCELLED: dict[str, Any] = {"outcome": "cancelled"}


def decide(policy: str, options: Any) -> tuple[dict[str, Any], str | None]:
    """``(outcome, option kind)``; ``(cancelled, None)`` when nothing fits."""
    wanted = _KINDS.get(policy, ())
    offered = [o for o in options if isinstance(o, dict)] if isinstance(options, list) else []
    for kind in wanted:
        for option in offered:
            option_id = option.get("optionId")
            if option.get("kind") == kind and isinstance(option_id, str):
                return {"outcome": "selected", "optionId": option_id}, kind
    return dict(CANCELLED), None


def decision_label(outcome: dict[str, Any], kind: str | None) -> str:
    """The counter a decision goes to: ``reject``, ``allow`` or ``cancelled``."""
    if outcome.get("outcome") != "selected" or kind is None:
        return "cancelled"
    return kind.split("_", 1)[0]
