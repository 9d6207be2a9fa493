"""Every bridge error carries a snake_case ``code`` and typed snake_case fields, no
wire: ``bridge.wire`` names its fields as the peer does, and each door maps it (REST
to an HTTP status, ``/acp`` to a JSON-RPC error)."""

from __future__ import annotations

import errno
import inspect
import re

import pytest

import bridge.errors as errors
from acp_server.acp_http.errors import to_rpc_error
from acp_server.rest.errors import status_of
from bridge.errors import BridgeError
from bridge.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS
from bridge.wire import error_details

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
    errors.AgentUnavailableError: errors.AgentUnavailableError(
        "x", PermissionError(errno.EACCES, "Permission denied")),
    errors.AgentStartError: errors.AgentStartError("x", "it answered error -32601", 3),
    errors.AgentTimeoutError: errors.AgentTimeoutError("initialize", 200),
    errors.AgentRequestTimeoutError: errors.AgentRequestTimeoutError("session/new", 300),
    errors.AgentProtocolError: errors.AgentProtocolError("collision", "evil"),
    errors.InvalidPromptError: errors.InvalidPromptError(),
    errors.TooManyContentBlocksError: errors.TooManyContentBlocksError(9, 8),
    errors.InvalidDeadlineError: errors.InvalidDeadlineError(0),
    errors.PromptIdInUseError: errors.PromptIdInUseError("s1", "p1"),
    errors.JournalUnavailableError: errors.JournalUnavailableError("disk full"),
    errors.SessionMovedError: errors.SessionMovedError("another instance took it over"),
    errors.SessionBusyElsewhereError: errors.SessionBusyElsewhereError("s1", retry_after=2),
    errors.SessionNotRestorableError: errors.SessionNotRestorableError("s", "gone"),
    errors.ServerRestartedError: errors.ServerRestartedError("p"),
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
    fields = {k for k in vars(exc) if not k.startswith("_")} - {"args"}
    assert all(SNAKE.match(name) for name in fields), fields
    assert not hasattr(exc, "http_status") and not hasattr(exc, "details")
    details = error_details(exc)
    assert all(CAMEL.match(key) for key in details), details


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda cls: cls.__name__)
def test_each_door_answers_every_error(cls: type[BridgeError]) -> None:
    exc = SAMPLES[cls]
    status = status_of(exc)
    assert 400 <= status < 600
    code, _message, _data = to_rpc_error(exc)
    assert code in (INVALID_PARAMS, INTERNAL_ERROR) or cls is errors.AgentError
    if code == INVALID_PARAMS:   # the caller's mistake
        assert status < 500


def test_details_are_the_fields() -> None:
    assert error_details(SAMPLES[errors.PromptQueueFullError]) == {
        "sessionId": "s", "limit": 5, "pendingCount": 5}
    assert SAMPLES[errors.AgentError].rpc_code == -32000
    assert error_details(errors.PermissionNotFoundError("r")) == {"requestId": "r"}
    assert error_details(errors.SessionLimitExceededError(8, scope="agent", agent="a")) == {
        "limit": 8, "scope": "agent", "agent": "a"}
    assert error_details(SAMPLES[errors.AgentRequestTimeoutError]) == {
        "phase": "session/new", "timeoutMs": 300}


def test_an_agent_that_cannot_start_says_why_and_whether_to_wait() -> None:
    """``transient`` for the machine's shortages (and an errno the event loop could not
    name: uvloop reports some EMFILE as -1), not for a command missing or not executable."""
    cases = [(OSError(errno.EMFILE, "Too many open files"), "EMFILE", True),
             (OSError(errno.EAGAIN, "Resource temporarily unavailable"), "EAGAIN", True),
             (OSError(-1, "Unknown error -1"), "unknown", True),
             (FileNotFoundError(errno.ENOENT, "No such file or directory"), "ENOENT", False),
             (PermissionError(errno.EACCES, "Permission denied"), "EACCES", False)]
    for cause, reason, transient in cases:
        exc = errors.AgentUnavailableError("flaky", cause)
        assert (exc.reason, exc.transient) == (reason, transient)
        assert str(exc).startswith("Cannot start agent 'flaky': ")
        assert status_of(exc) == 503
        assert error_details(exc) == {"agent": "flaky", "reason": reason}
        assert to_rpc_error(exc)[2] == {"errorKind": "agent_unavailable", "agent": "flaky",
                                        "reason": reason, "retryable": True}
    assert "out of descriptors or processes" in str(
        errors.AgentUnavailableError("flaky", OSError(-1, "Unknown error -1")))
    gone = FileNotFoundError(errno.ENOENT, "No such file or directory")
    assert str(errors.AgentUnavailableError("flaky", gone, "/nowhere/at/all")) == \
        "Cannot start agent 'flaky': its folder /nowhere/at/all is gone"


def test_an_agent_that_did_not_initialize_is_unavailable_and_says_what_it_said() -> None:
    """Started, but no ACP ``initialize`` completed: the same 503 ``agent_unavailable``
    (``initialize_failed``, the exit code when it exited), not transient, its words
    bounded."""
    exc = errors.AgentStartError("cat", "x" * 5000, 3)
    assert (exc.code, exc.reason, exc.transient, exc.exit_code) == (
        "agent_unavailable", "initialize_failed", False, 3)
    assert str(exc).startswith("Agent 'cat' did not complete ACP initialize: xxx")
    assert len(str(exc)) < 700
    assert status_of(exc) == 503
    assert error_details(exc) == {"agent": "cat", "reason": "initialize_failed", "exitCode": 3}
    assert to_rpc_error(exc) == (INTERNAL_ERROR, str(exc), {
        "errorKind": "agent_unavailable", "agent": "cat", "reason": "initialize_failed",
        "exitCode": 3, "retryable": True})
