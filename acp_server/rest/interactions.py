"""A session's open permission requests as qwen serve 0.24.4 lists them in a status and
a listing item (``pendingInteractions``, its SDK's ``DaemonPendingInteraction``).

    interactions = pending_interactions(status.asked)
    [i.kind for i in interactions]        # "permission" | "user_question"

Contracts (qwen's snapshot of an ACP ``session/request_permission``, field for field):
``options`` are ``{optionId, label?, kind?}`` (the option's ``name`` is the ``label``;
an ``optionId`` that is not a string is written as text). A request whose
``toolCall._meta.qwenInteractionKind`` is ``user_question`` (qwen's own agent asking
the user a question) is a ``user_question`` with the tool call's ``title`` and its
``questions`` (``_meta.qwenQuestions``, else ``rawInput.questions``; each object given
an ``answerKey``, its index as text); any other is a ``permission`` whose ``action`` is
the tool call's ``kind`` (as ``type``), ``title``, ``content``, ``locations`` and
``rawInput`` (as ``input``), each when present. Params of another shape (no tool
call, options not a list) give what can be read, never an error.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from acp_server.rest import wire
from bridge.status import AskedPermission
from bridge.wire import iso

USER_QUESTION = "user_question"


def pending_interactions(asked: tuple[AskedPermission, ...]) -> list[wire.PendingInteraction]:
    return [_interaction(a) for a in asked]


def user_questions(interactions: list[wire.PendingInteraction]) -> int:
    return sum(1 for i in interactions if i.kind == USER_QUESTION)


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _options(params: dict[str, Any]) -> list[wire.InteractionOption]:
    options = params.get("options")
    found = []
    for option in options if isinstance(options, list) else ():
        option = _object(option)
        option_id = option.get("optionId")
        name, kind = option.get("name"), option.get("kind")
        found.append(wire.InteractionOption(
            optionId=option_id if isinstance(option_id, str)
            else "" if option_id is None else str(option_id),
            label=name if isinstance(name, str) else UNSET,
            kind=kind if isinstance(kind, str) else UNSET))
    return found


def _interaction(asked: AskedPermission) -> wire.PendingInteraction:
    tool_call = _object(asked.params.get("toolCall"))
    meta = _object(tool_call.get("_meta"))
    raw_input = tool_call.get("rawInput", UNSET)
    title = tool_call.get("title")
    common: dict[str, Any] = {"requestId": asked.request_id, "createdAt": iso(asked.asked_at),
                              "options": _options(asked.params)}
    if meta.get("qwenInteractionKind") == USER_QUESTION:
        questions = meta.get("qwenQuestions")
        if not isinstance(questions, list):
            questions = _object(raw_input).get("questions")
        return wire.PendingInteraction(
            kind=USER_QUESTION, title=title if isinstance(title, str) else UNSET,
            questions=[{**q, "answerKey": str(n)} for n, q in
                       enumerate(questions if isinstance(questions, list) else [])
                       if isinstance(q, dict)], **common)
    action: dict[str, Any] = {}
    if isinstance(tool_call.get("kind"), str):
        action["type"] = tool_call["kind"]
    if isinstance(title, str):
        action["title"] = title
    for key in ("content", "locations"):
        if key in tool_call:
            action[key] = tool_call[key]
    if raw_input is not UNSET:
        action["input"] = raw_input
    return wire.PendingInteraction(kind="permission", action=action, **common)
