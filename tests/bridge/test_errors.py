"""Every bridge error carries what a door needs: ``code``, ``http_status``,
``rpc_code`` and ``details()`` (camelCase wire names)."""

from __future__ import annotations

import inspect
import re

import pytest

import bridge.errors as errors
from bridge.errors import BridgeError
from bridge.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS

SAMPLES: dict[type[BridgeError], BridgeError] = {
    errors.InvalidOptionError: errors.InvalidOptionError("Invalid x: -1"),
    errors.SessionNotFoundError: errors.SessionNotFoundError("s"),
    errors.SessionLimitExceededError: errors.SessionLimitExceededError(2),
    errors.PromptQueueFullError: errors.PromptQueueFullError("s", 5, 5),
    errors.BranchWhilePromptActiveError: errors.BranchWhilePromptActiveError("s"),
    errors.WorkspaceMismatchError: errors.WorkspaceMismatchError("/a", "/b"),
    errors.InvalidClientIdError: errors.InvalidClientIdError("s", "c"),
    errors.SessionIdNotHonoredError: errors.SessionIdNotHonoredError("a", "b"),
    errors.SubscriberLimitExceededError: errors.SubscriberLimitExceededError("s", 64),
    errors.PermissionNotFoundError: errors.PermissionNotFoundError("r", "s"),
    errors.InvalidPermissionOptionError: errors.InvalidPermissionOptionError("r", "o"),
    errors.PromptNotFoundError: errors.PromptNotFoundError("s", "p"),
    errors.AgentNotFoundError: errors.AgentNotFoundError("x", ["reference"]),
    errors.NotSupportedError: errors.NotSupportedError("no fork"),
    errors.PromptCancelledError: errors.PromptCancelledError(),
    errors.PromptDeadlineExceededError: errors.PromptDeadlineExceededError(100),
    errors.SessionClosedError: errors.SessionClosedError("s"),
    errors.AgentError: errors.AgentError(-32000, "boom", {"x": 1}),
    errors.AgentDiedError: errors.AgentDiedError(exit_code=3),
    errors.AgentTimeoutError: errors.AgentTimeoutError("initialize", 200),
    errors.InvalidPromptError: errors.InvalidPromptError(),
    errors.TooManyContentBlocksError: errors.TooManyContentBlocksError(9, 8),
    errors.InvalidDeadlineError: errors.InvalidDeadlineError(0),
}
CAMEL = re.compile(r"^[a-z]+([A-Z][a-z]*)*$")
SNAKE = re.compile(r"^[a-z]+(_[a-z]+)*$")


def test_every_error_is_sampled() -> None:
    defined = {cls for _name, cls in inspect.getmembers(errors, inspect.isclass)
               if issubclass(cls, BridgeError) and cls is not BridgeError}
    assert defined == set(SAMPLES)


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda cls: cls.__name__)
def test_error_attributes(cls: type[BridgeError]) -> None:
    exc = SAMPLES[cls]
    assert SNAKE.match(exc.code)
    assert 400 <= exc.http_status < 600
    assert exc.rpc_code in (INVALID_PARAMS, INTERNAL_ERROR) or cls is errors.AgentError
    details = exc.details()
    assert all(CAMEL.match(key) for key in details), details
    if exc.rpc_code == INVALID_PARAMS:   # the caller's mistake
        assert exc.http_status < 500


def test_details_are_the_fields() -> None:
    assert SAMPLES[errors.PromptQueueFullError].details() == {
        "sessionId": "s", "limit": 5, "pendingCount": 5}
    assert SAMPLES[errors.AgentError].rpc_code == -32000
    assert errors.PermissionNotFoundError("r").details() == {"requestId": "r"}
