"""Python SDK of acp-server (and ``qwen serve``): REST + SSE over httpx, anyio-native.

    from acp_server.client import DaemonClient, DaemonSessionClient

    async with DaemonClient("http://127.0.0.1:4170") as client:
        session = await client.create_or_attach_session()
        result = await client.prompt(session.session_id, "hello")
        print(result.stop_reason)

Works under asyncio and trio. Modules: ``daemon`` (``DaemonClient``), ``session``
(``DaemonSessionClient``), ``events`` (the resumable SSE iterator), ``reservations``
(the local early-fail cap), ``tasks`` (``TaskClient``, LMSP async tasks), ``errors``,
``wire`` (msgspec types).
"""

from __future__ import annotations

from acp_server.client.daemon import DaemonClient, prompt_body
from acp_server.client.errors import (DaemonConnectionError, DaemonError, DaemonForbiddenError,
                                      DaemonHttpError, DaemonRateLimitError,
                                      DaemonUnauthorizedError,
                                      DaemonPendingPromptLimitError, DaemonProtocolError,
                                      DaemonSessionIdProtocolError, DaemonStreamEndedError,
                                      DaemonStreamError, DaemonTurnError)
from acp_server.client.events import StreamCursor, match_turn_event, subscribe_events
from acp_server.client.reservations import (DEFAULT_MAX_PENDING_PROMPTS_PER_SESSION,
                                            PromptReservations, Reservation,
                                            normalize_pending_prompt_limit)
from acp_server.client.session import DaemonSessionClient
from acp_server.client.tasks import (EventHistoryExpiredError, ForbiddenError, LmspProblem,
                                     RateLimitedError, Task, TaskClient, TaskEvent,
                                     TaskNotCancelableError, TaskNotFoundError, UnauthorizedError)
from acp_server.client.wire import (Capabilities, CreateSessionRequest, DaemonEvent, Limits,
                                    PromptAccepted, PromptRequest, PromptResult, RestoreRequest,
                                    SessionInfo)

__all__ = [
    "DEFAULT_MAX_PENDING_PROMPTS_PER_SESSION",
    "Capabilities",
    "CreateSessionRequest",
    "DaemonClient",
    "DaemonConnectionError",
    "DaemonError",
    "DaemonEvent",
    "DaemonForbiddenError",
    "DaemonHttpError",
    "DaemonPendingPromptLimitError",
    "DaemonProtocolError",
    "DaemonRateLimitError",
    "DaemonSessionClient",
    "DaemonSessionIdProtocolError",
    "DaemonStreamEndedError",
    "DaemonStreamError",
    "DaemonTurnError",
    "DaemonUnauthorizedError",
    "EventHistoryExpiredError",
    "ForbiddenError",
    "Limits",
    "LmspProblem",
    "PromptAccepted",
    "PromptRequest",
    "PromptReservations",
    "RateLimitedError",
    "PromptResult",
    "Reservation",
    "RestoreRequest",
    "SessionInfo",
    "StreamCursor",
    "Task",
    "TaskClient",
    "TaskEvent",
    "TaskNotCancelableError",
    "TaskNotFoundError",
    "UnauthorizedError",
    "match_turn_event",
    "normalize_pending_prompt_limit",
    "prompt_body",
    "subscribe_events",
]
