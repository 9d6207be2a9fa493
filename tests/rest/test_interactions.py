"""``acp_server.rest.interactions``: an agent's permission request as qwen serve 0.24.4
lists it (``pendingInteractions``), for the shapes an agent may send."""

from __future__ import annotations

from typing import Any

import msgspec

from acp_server.rest.interactions import pending_interactions, user_questions
from bridge.status import AskedPermission

AT = 1767225600.5   # 2026-01-01T00:00:00.500Z


def _listed(*params: dict[str, Any]) -> list[dict[str, Any]]:
    asked = tuple(AskedPermission(f"r{n}", p, AT) for n, p in enumerate(params))
    return msgspec.to_builtins(pending_interactions(asked))  # type: ignore[no-any-return]


def test_a_permission_with_every_field() -> None:
    [listed] = _listed({"sessionId": "s", "toolCall": {
        "toolCallId": "t", "kind": "edit", "title": "Write a", "content": None,
        "locations": [{"path": "/w/a"}], "rawInput": {"path": "/w/a"}},
        "options": [{"optionId": "allow_once", "name": "Allow", "kind": "allow_once"},
                    {"optionId": 7}, "not an option"]})
    assert listed == {
        "requestId": "r0", "kind": "permission", "createdAt": "2026-01-01T00:00:00.500Z",
        "action": {"type": "edit", "title": "Write a", "content": None,
                   "locations": [{"path": "/w/a"}], "input": {"path": "/w/a"}},
        "options": [{"optionId": "allow_once", "label": "Allow", "kind": "allow_once"},
                    {"optionId": "7"}, {"optionId": ""}]}


def test_params_of_another_shape_give_what_can_be_read() -> None:
    [listed] = _listed({"toolCall": "nope", "options": {"a": 1}})
    assert listed == {"requestId": "r0", "kind": "permission",
                      "createdAt": "2026-01-01T00:00:00.500Z", "action": {}, "options": []}


def test_a_user_question() -> None:
    question = {"question": "Which?", "options": [{"label": "A"}]}
    meta_questions = {"toolCall": {"title": "Ask", "_meta": {
        "qwenInteractionKind": "user_question", "qwenQuestions": [question, 3, question]}},
        "options": [{"optionId": "proceed_once", "name": "Submit"}]}
    raw_questions = {"toolCall": {"_meta": {"qwenInteractionKind": "user_question"},
                                  "rawInput": {"questions": [question]}}}
    listed = _listed(meta_questions, raw_questions)
    assert listed[0] == {
        "requestId": "r0", "kind": "user_question", "createdAt": "2026-01-01T00:00:00.500Z",
        "title": "Ask", "options": [{"optionId": "proceed_once", "label": "Submit"}],
        "questions": [{**question, "answerKey": "0"}, {**question, "answerKey": "2"}]}
    assert listed[1]["questions"] == [{**question, "answerKey": "0"}]
    assert "title" not in listed[1] and "action" not in listed[1]
    asked = tuple(AskedPermission(str(n), p, AT) for n, p in
                  enumerate((meta_questions, raw_questions, {})))
    assert user_questions(pending_interactions(asked)) == 2
