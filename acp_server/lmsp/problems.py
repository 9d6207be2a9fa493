"""LMSP problem objects (§9.3): the code table, the exception and the response.

    raise LmspError("task_not_found", f"No task {task_id!r}.", task_id=task_id)
    ...
    return problem_response(exc, instance=request.url.path)   # application/problem+json

Contracts: ``code`` is mandatory and stable; ``type`` = ``PROBLEM_BASE`` + code;
``title`` is fixed per code; the HTTP status and fixed headers (``Retry-After``,
``x-should-retry``) come from the table, never from the raiser.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET
from starlette.responses import Response

from acp_server.http.policy import Refusal
from acp_server.lmsp.wire import ErrorPointer, Problem, encode
from acp_server.store.errors import RETRY_AFTER_S, StoreUnavailableError

PROBLEM_BASE = "https://lmsp.invalid/problems/"
PROBLEM_JSON = "application/problem+json"

# code -> (HTTP status, title, fixed headers)
CODES: dict[str, tuple[int, str, dict[str, str]]] = {
    "invalid_request": (400, "Invalid request", {}),
    "unsupported_capability": (400, "Unsupported capability", {}),
    "unauthorized": (401, "Unauthorized", {}),
    "forbidden": (403, "Forbidden", {}),
    "task_not_found": (404, "Task not found", {}),
    "model_not_found": (404, "Model not found", {}),
    "response_not_found": (404, "Response not found", {}),
    "not_found": (404, "Not found", {}),
    "method_not_allowed": (405, "Method not allowed", {}),
    "idempotency_key_in_use": (409, "Idempotency key in use", {"Retry-After": "1"}),
    "task_not_cancelable": (409, "Task cannot be cancelled", {"x-should-retry": "false"}),
    "response_not_cancelable": (400, "Response cannot be cancelled",
                                {"x-should-retry": "false"}),
    "response_in_progress": (409, "Response in progress", {}),
    "event_history_expired": (410, "Event history expired", {"x-should-retry": "false"}),
    "payload_too_large": (413, "Payload too large", {}),
    "idempotency_key_reused": (422, "Idempotency key reused", {}),
    "rate_limit_exceeded": (429, "Rate limit exceeded", {}),
    "prompt_queue_full": (503, "Prompt queue full", {"Retry-After": "5"}),
    "store_unavailable": (503, "Store unavailable", {"Retry-After": str(RETRY_AFTER_S)}),
    "server_restarted": (0, "Server restarted", {}),
    "agent_error": (0, "Agent error", {}),
    "context_length_exceeded": (0, "Context length exceeded", {}),   # the model's window
    "agent_unavailable": (0, "Agent unavailable", {}),   # its process could not start
    "server_error": (0, "Server error", {}),
    "output_lost": (0, "Output lost", {}),   # a slow store: the turn's events outran the ring
}


SHOWN_ID_CHARS = 80   # an id echoed in an error: a caller's 1 MiB "id" is not sent back


def shown(value: str) -> str:
    """An id as an error shows it: cut to ``SHOWN_ID_CHARS`` characters (``…`` after)."""
    return value if len(value) <= SHOWN_ID_CHARS else value[:SHOWN_ID_CHARS] + "…"


class LmspError(Exception):
    """An error answered with a problem object. ``extensions`` are §9.3 members."""

    def __init__(self, code: str, detail: str, **extensions: Any) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.extensions = extensions

    @property
    def status(self) -> int:
        return CODES[self.code][0]


MAX_ERROR_POINTERS = 50   # a 1 MiB body of bad items: 50 pointers and a count, not 37 MB


def invalid(pointer: str, detail: str, *more: tuple[str, str], param: str | None = None
            ) -> LmspError:
    """400 ``invalid_request``; ``param`` defaults to the first pointer, dotted. At
    most ``MAX_ERROR_POINTERS`` pointers; past them the last says how many more."""
    found = [(pointer, detail), *more]
    if len(found) > MAX_ERROR_POINTERS:
        kept = MAX_ERROR_POINTERS - 1
        found[kept:] = [("", f"... and {len(found) - kept} more problems like these.")]
    errors = [ErrorPointer(pointer=p, detail=d) for p, d in found]
    return LmspError("invalid_request", detail, param=param or pointer_to_param(pointer),
                     errors=errors)


def pointer_to_param(pointer: str) -> str:
    """``/input/input/0/role`` → ``input.input[0].role``."""
    out = ""
    for part in pointer.strip("/").split("/"):
        if part.isdigit():
            out += f"[{part}]"
        elif part:
            out += f".{part}" if out else part
    return out


def problem(code: str, detail: str | None = None, *, instance: str | None = None,
            with_status: bool = True, **extensions: Any) -> Problem:
    """An answer's problem (``with_status``) repeats ``detail`` as ``message``, the
    member the OpenAI SDKs show; a problem inside ``task.error`` has neither."""
    status, title, _ = CODES[code]
    answer = with_status and bool(status)
    return Problem(type=PROBLEM_BASE + code, title=title,
                   status=status if answer else UNSET,
                   detail=UNSET if detail is None else detail,
                   instance=UNSET if instance is None else instance, code=code,
                   message=detail if answer and detail is not None else UNSET, **extensions)


def store_unavailable(exc: StoreUnavailableError) -> LmspError:
    """503 ``store_unavailable`` (the reason stays in the log and ``/health?deep=1``)."""
    return LmspError("store_unavailable", "The task store is unavailable; nothing was "
                     "recorded. Retry later (with the same Idempotency-Key to be safe).")


def problem_response(exc: LmspError, *, instance: str | None = None) -> Response:
    status, _, headers = CODES[exc.code]
    body = encode(problem(exc.code, exc.detail, instance=instance, **exc.extensions))
    return Response(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


_REFUSAL_TITLES = {408: "Request timeout", 414: "URI too long", 421: "Misdirected request",
                   431: "Request header fields too large", 501: "Not implemented",
                   503: "Service unavailable"}


# The principals' members (camelCase on REST, as the peer) under LMSP's snake_case names.
_REFUSAL_MEMBERS = {"requiredScope": "required_scope", "tier": "tier",
                    "retryAfterMs": "retry_after_ms"}


def render_refusal(refusal: Refusal) -> tuple[bytes, bytes]:
    """The front layer's refusals as problem objects (``code`` = the refusal's code;
    a 403 for a missing scope names it, ``required_scope``; a 429 has ``tier`` and
    ``retry_after_ms``)."""
    if refusal.code in CODES:
        body = problem(refusal.code, refusal.message,
                       **{_REFUSAL_MEMBERS[k]: v for k, v in refusal.extra
                          if k in _REFUSAL_MEMBERS})
    else:
        body = Problem(type=PROBLEM_BASE + refusal.code, code=refusal.code,
                       title=_REFUSAL_TITLES.get(refusal.status, "Refused"),
                       status=refusal.status, detail=refusal.message,
                       message=refusal.message)
    return PROBLEM_JSON.encode(), encode(body)
