"""The checks: stable ids, suite, level and a one-line reference to the text enforced.

    from acp_server.conformance.catalog import CHECKS, SUITES
    CHECKS["backpressure.refusal.retry-after"].level   # "MUST"

Contracts: ids never change meaning (reports and CI filters key on them); a level is
MUST where the text states the rule as a requirement of the server, SHOULD where the
rule comes from a reference implementation or a recommendation. The texts are the
prompt-queue backpressure seed (``seed``), the ACP Streamable HTTP RFD as recorded in
``reference/acp.md`` (``RFD``), ``qwen-serve.md`` (the peer) and LMSP §6.4, §7, §9.2
(``docs/spec/LMSP.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Level = Literal["MUST", "SHOULD"]
SUITES = ("backpressure", "acp-http", "lmsp")


@dataclass(frozen=True)
class Check:
    id: str
    level: Level
    reference: str

    @property
    def suite(self) -> str:
        return self.id.split(".", 1)[0]


_SEED = "seed prompt-queue-backpressure"
_RFD = "ACP RFD Streamable HTTP (acp.md §2.2)"
_V1 = "ACP v1 schema 1.21 (acp.md §1.2)"

_ALL = [
    # backpressure (REST)
    Check("backpressure.capabilities.limit", "MUST",
          f"{_SEED}, HTTP: /capabilities limits.maxPendingPromptsPerSession is a number, null when disabled"),
    Check("backpressure.admission.exact-limit", "MUST",
          f"{_SEED}, admission step 3: pendingPromptCount >= limit throws PromptQueueFullError"),
    Check("backpressure.refusal.retry-after", "MUST",
          f"{_SEED}, HTTP: the refusal carries header Retry-After: 5"),
    Check("backpressure.refusal.body", "MUST",
          f"{_SEED}, HTTP: body {{code: 'prompt_queue_full', error, sessionId, limit, pendingCount}}"),
    Check("backpressure.refusal.no-prompt-id", "MUST",
          f"{_SEED}, HTTP: no promptId is returned when admission fails"),
    Check("backpressure.admission.concurrent", "MUST",
          f"{_SEED}, semantics: the bridge is the admission gate (concurrent posts included)"),
    Check("backpressure.release.completed", "MUST",
          f"{_SEED}, admission step 5: the slot is released when the prompt settles (completed)"),
    Check("backpressure.release.cancelled", "MUST",
          f"{_SEED}, admission step 5: the slot is released when the prompt settles (cancelled)"),
    Check("backpressure.release.dropped", "MUST",
          f"{_SEED}, admission step 5 (+ qwen-serve.md §1.6 DELETE pending-prompts): a dropped queued prompt frees its slot"),
    Check("backpressure.failure.no-poison", "MUST",
          f"{_SEED}, bridge: a failure does not poison the FIFO"),
    Check("backpressure.branch.no-slot", "MUST",
          f"{_SEED}, summary: branchSession is serialized but does not consume the prompt limit"),
    Check("backpressure.status.counts", "SHOULD",
          "qwen-serve.md §1.4: /daemon/status runtime.activity {activePrompts, pendingPrompts, queuedPrompts}"),
    # acp-http
    Check("acp-http.initialize", "MUST",
          f"{_RFD}: POST initialize -> 200, JSON-RPC response body, header Acp-Connection-Id"),
    Check("acp-http.post.accepted", "MUST",
          f"{_RFD}: POST of any other message -> 202 Accepted, empty body"),
    Check("acp-http.stream.connection", "MUST",
          f"{_RFD}: the connection-scoped GET stream carries the session/new reply, matched by id"),
    Check("acp-http.stream.session", "MUST",
          f"{_RFD}: the session GET stream carries session/update and the session/prompt reply"),
    Check("acp-http.status.415", "MUST",
          f"{_RFD}: a POST without Content-Type: application/json -> 415"),
    Check("acp-http.status.406", "MUST",
          f"{_RFD}: a GET without Accept: text/event-stream -> 406"),
    Check("acp-http.status.400", "MUST",
          f"{_RFD}: a POST without Acp-Connection-Id -> 400"),
    Check("acp-http.status.404", "MUST",
          f"{_RFD}: an unknown Acp-Connection-Id -> 404"),
    Check("acp-http.status.409", "SHOULD",
          "acp.md §2.2 (TS reference server): a second reader of a stream -> 409"),
    Check("acp-http.status.501", "MUST",
          f"{_RFD}: a batch (JSON array) -> 501"),
    Check("acp-http.status.413", "SHOULD",
          "acp.md §2.2 (TS handler caps bodies at 16 MiB), qwen-serve.md §1.1: an oversized body -> 413"),
    Check("acp-http.delete", "MUST",
          f"{_RFD}: DELETE -> 202, then the connection is gone (a later POST -> 404)"),
    Check("acp-http.websocket", "MUST",
          f"{_RFD}: GET with Upgrade: websocket; JSON-RPC in text frames, initialize first"),
    Check("acp-http.load.history-first", "MUST",
          "acp.md §1.2 session/load + RFD flow: the history is replayed as session/update before the answer"),
    Check("acp-http.prompt-queue-full", "MUST",
          f"{_SEED}, ACP HTTP: -32603 with data {{errorKind: 'prompt_queue_full', sessionId, limit, pendingCount}}"),
    Check("acp-http.v1.session-delete", "MUST",
          f"{_V1}: session/delete answers {{}} and the session leaves session/list (when "
          "sessionCapabilities.delete is advertised)"),
    Check("acp-http.v1.cancel-request", "SHOULD",
          f"{_V1}, cancellation: $/cancel_request of a running session/prompt ends it "
          "(the answer MUST come: stopReason cancelled, or -32800)"),
    Check("acp-http.v1.logout", "SHOULD",
          f"{_V1}: logout answers {{}} (-32601 only when auth.logout is not advertised)"),
    Check("acp-http.v1.session-fork", "SHOULD",
          f"{_V1} unstable: session/fork answers a new sessionId (when "
          "sessionCapabilities.fork is advertised)"),
    Check("acp-http.v1.unknown-method", "SHOULD",
          f"{_V1}, extensibility: an unrecognised request is answered -32601 (Method not found)"),
    # lmsp
    Check("lmsp.create.shape", "MUST",
          "LMSP §7.1: POST /tasks -> 202 with the task object (id, object, type, status, ..., response, error)"),
    Check("lmsp.create.readable", "MUST",
          "LMSP §7.1: the service MUST persist the task before it replies (readable at once)"),
    Check("lmsp.state.transitions", "MUST",
          "LMSP §7.2: only the state machine's transitions are taken"),
    Check("lmsp.state.terminal-final", "MUST",
          "LMSP §7.2: the service MUST NOT move a task out of a terminal state"),
    Check("lmsp.cancel.queued", "MUST",
          "LMSP §7.3: a queued task becomes cancelled at once"),
    Check("lmsp.cancel.running", "MUST",
          "LMSP §7.3: a running task becomes cancelling until the backend stops, then cancelled"),
    Check("lmsp.cancel.idempotent", "MUST",
          "LMSP §7.3: cancellation MUST be idempotent (cancelling/cancelled -> 200, current task)"),
    Check("lmsp.cancel.finished", "MUST",
          "LMSP §7.3: cancelling a succeeded or failed task -> 409 task_not_cancelable"),
    Check("lmsp.not-found", "MUST",
          "LMSP §7.1, §7.3: an unknown id -> 404 task_not_found"),
    Check("lmsp.events.created-first", "MUST",
          "LMSP §7.4, §6.4: the stream begins with response.created, sequence_number 0"),
    Check("lmsp.events.contiguous", "MUST",
          "LMSP §6.4: sequence numbers grow by 1 with no gaps; one terminal event, last"),
    Check("lmsp.events.resume-header", "MUST",
          "LMSP §6.4: Last-Event-ID: N resumes with the events after N"),
    Check("lmsp.events.resume-query", "MUST",
          "LMSP §6.4: ?starting_after=N resumes with the events after N"),
    Check("lmsp.events.finished-204", "MUST",
          "LMSP §6.4: a cursor at the terminal event of a finished task -> 204"),
    Check("lmsp.events.bad-cursor", "MUST",
          "LMSP §6.4: a cursor that is not a non-negative integer -> 400 invalid_request"),
    Check("lmsp.idempotency.replay", "MUST",
          "LMSP §9.2: same key, same body -> 202, the same task, Idempotent-Replayed: true"),
    Check("lmsp.idempotency.conflict", "MUST",
          "LMSP §9.2: same key, different body -> 422 idempotency_key_reused"),
    Check("lmsp.on-restart.validated", "MUST",
          "LMSP §7.1, §7.5: on_restart is fail, retry or resume; resume without snapshots -> 400 unsupported_capability"),
]

CHECKS: dict[str, Check] = {check.id: check for check in _ALL}


def checks_of(suite: str) -> list[Check]:
    return [check for check in _ALL if check.suite == suite]
