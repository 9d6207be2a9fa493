"""A stdio ACP agent for tests, honest by default, misbehaving on request.

    python -m tests.agents.fixture_agent --name honest
    python -m tests.agents.fixture_agent --name nonew --never-answer-new
    python -m tests.agents.fixture_agent --name big --swallow-new 52428800
    python -m tests.agents.fixture_agent --name evil

Behaviour (newline-delimited JSON-RPC 2.0 on stdin/stdout):

* ``initialize``: ``loadSession``, ``sessionCapabilities.close`` (unless
  ``--no-close``), ``agentInfo.name`` = ``--name``.
* ``session/new``: ``{"sessionId": "<name>-<n>"}``, except:
  ``--never-answer-new`` never answers; ``--swallow-new N`` writes ``N`` bytes of junk
  and then the answer on the same line (one invalid line: the answer is lost); after
  a ``collide <sid>`` prompt, the next answer is ``{"sessionId": "<sid>"}``;
  ``--die-at-new FILE`` appends a line to ``FILE`` at each ``session/new`` and, while
  ``FILE`` has at most ``--die-times`` lines (default 1), exits (code 3) unanswered:
  an agent that dies as a session is asked of it.
* ``session/load``, ``session/resume``: ``{}`` (``--die-at-load FILE``: as
  ``--die-at-new``, at each of them, after one replayed ``agent_message_chunk``
  ``replayed <sessionId>``). ``session/close``: ``{}``, after ``--slow-close-ms``
  milliseconds.
* ``session/fork`` (offered with ``--fork hang|answer``): creates the file
  ``fork-asked`` in the request's ``cwd``, then ``hang`` never answers; ``answer``
  answers ``{"sessionId": "<name>-fork-<n>"}`` and then creates ``fork-answered``.
* ``session/delete`` (offered with ``--delete hang|answer``): creates the file
  ``deleted-<sessionId>`` in the agent's folder, then ``hang`` never answers;
  ``answer`` answers ``{}``.
* ``session/prompt``, by the text of its first text block:
  ``hold`` answers ``cancelled`` at ``session/cancel`` (and only then);
  ``inject <sid>`` sends a ``session/update`` naming session ``<sid>``
  (``INJECTED-BY-<name>``), a ``session/request_permission`` and an
  ``fs/read_text_file`` (``secret.txt``) naming ``<sid>``, waits for both answers,
  reports them in an ``agent_message_chunk`` of its own session (``saw: <json>``) and
  ends the turn; ``collide <sid>`` ends the turn at once; ``gate <file>`` waits until
  ``<file>`` exists (relative to the agent's folder), then echoes; ``die`` exits
  (code 3) unanswered; ``withdraw <file>``
  sends a ``session/request_permission``, waits until ``<file>`` exists, withdraws the
  request (``$/cancel_request``), waits for its answer and reports it in a chunk
  (``withdrawn: <json>``) before ending the turn; anything else is echoed as
  one ``agent_message_chunk`` ``<name>: <text>``. With ``--answer-twice`` every
  prompt is answered ``end_turn`` and then, under the same id, with an error.
  ``--record-prompts FILE`` appends each prompt's text (a line) to ``FILE`` first.
* ``--modes``: ``session/new`` and ``session/load`` answer ``modes`` (``ask`` current,
  ``code``), ``session/set_mode`` sets the session's mode (in memory: a new process
  has forgotten it) and answers ``{}``, and a prompt ``mode`` is answered with a chunk
  ``mode: <current mode id>``. ``session/set_config_option`` answers ``{}`` (any
  option); ``session/set_model`` is not offered.
* ``--refuse-setters BYTES``: every ``session/set_mode``, ``set_model`` and
  ``set_config_option`` is refused (-32603) with a message of 5,000 ``r`` and a
  ``data`` of ``{"errorKind": "hostile", "blob": <BYTES x>}``: an agent whose
  refusals are as big as it likes.
* ``--hang-setters-after-load``: once this process answered a ``session/load``, the
  setters are never answered (a restored session's kept settings hang).
* ``--refuse-new BYTES``: every ``session/new`` is refused the same way.
* ``--refuse-others BYTES``: ``initialize`` also offers ``sessionCapabilities.delete``
  and the extension namespace ``fixture`` (``agentCapabilities._meta``); then
  ``session/delete`` (after its file), every request without a handler here (such as
  ``_fixture/refuse``) and a prompt ``refuse`` are refused the same way.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.agents.stdio import chunk, requests, send


def refuse(rpc_id: Any, size: int) -> None:
    """A refusal as big as the agent likes: -32603, a message of 5,000 ``r``, a ``data``
    of ``{"errorKind": "hostile", "blob": <size x>}``."""
    send({"id": rpc_id, "error": {"code": -32603, "message": "r" * 5000, "data": {
        "errorKind": "hostile", "blob": "x" * size}}})

class Agent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ids = itertools.count(1)
        self.out_ids = itertools.count(1000)
        self.held: dict[str, Any] = {}        # session id -> prompt request id (hold)
        self.waiting: dict[int, Callable[[dict[str, Any]], None]] = {}
        self.collide_with: str | None = None
        self.modes: dict[str, str] = {}   # session id -> mode (--modes)
        self.loaded = False   # a session/load answered (--hang-setters-after-load)

    def state(self, sid: str) -> dict[str, Any]:
        if not self.args.modes:
            return {}
        return {"modes": {"currentModeId": self.modes.get(sid, "ask"), "availableModes": [
            {"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}]}}

    def setter_answered(self, rpc_id: Any) -> bool:
        """``--refuse-setters``, ``--hang-setters-after-load``: whether the setter was
        answered (refused) or is never to be."""
        if self.args.refuse_setters:
            refuse(rpc_id, self.args.refuse_setters)
            return True
        return self.args.hang_setters_after_load and self.loaded

    def on_session_set_mode(self, rpc_id: Any, params: dict[str, Any]) -> None:
        if self.setter_answered(rpc_id):
            return
        if not self.args.modes:
            send({"id": rpc_id, "error": {"code": -32601, "message": "Method not found"}})
            return
        self.modes[params["sessionId"]] = params["modeId"]
        send({"id": rpc_id, "result": {}})

    def on_session_set_model(self, rpc_id: Any, params: dict[str, Any]) -> None:
        if not self.setter_answered(rpc_id):
            send({"id": rpc_id, "error": {"code": -32601, "message": "Method not found"}})

    def on_session_set_config_option(self, rpc_id: Any, params: dict[str, Any]) -> None:
        if self.setter_answered(rpc_id):
            return
        send({"id": rpc_id, "result": {}} if self.args.modes else
             {"id": rpc_id, "error": {"code": -32601, "message": "Method not found"}})

    def run(self) -> None:
        for method, rpc_id, params in requests(self.waiting):
            handler = getattr(self, "on_" + method.replace("/", "_"), None)
            if handler is not None:
                handler(rpc_id, params)
            elif rpc_id is not None and self.args.refuse_others:
                refuse(rpc_id, self.args.refuse_others)
            elif rpc_id is not None:
                send({"id": rpc_id, "error": {"code": -32601, "message": "Method not found"}})

    def on_initialize(self, rpc_id: Any, params: dict[str, Any]) -> None:
        session_caps: dict[str, Any] = {} if self.args.no_close else {"close": {}}
        if self.args.fork:
            session_caps["fork"] = {}
        if self.args.delete or self.args.refuse_others:
            session_caps["delete"] = {}
        caps: dict[str, Any] = {"loadSession": True, "sessionCapabilities": session_caps}
        if self.args.refuse_others:
            caps["_meta"] = {"fixture": True}
        send({"id": rpc_id, "result": {"protocolVersion": 1, "agentCapabilities": caps,
                                       "agentInfo": {"name": self.args.name, "version": "1"}}})

    def on_session_new(self, rpc_id: Any, params: dict[str, Any]) -> None:
        if self.args.never_answer_new:
            return
        if self.args.refuse_new:
            refuse(rpc_id, self.args.refuse_new)
            return
        if self.args.die_at_new:
            self.die_if_asked(self.args.die_at_new, "new")
        sid = self.collide_with or f"{self.args.name}-{next(self.ids)}"
        self.collide_with = None
        send({"id": rpc_id, "result": {"sessionId": sid, **self.state(sid)}},
             prefix=b"x" * self.args.swallow_new if self.args.swallow_new else b"")

    def die_if_asked(self, path: str, what: str) -> None:
        """Counts this request in ``path``; exits unanswered while it counts at most
        ``--die-times``."""
        with open(path, "a+") as asked:
            asked.write(what + "\n")
            asked.seek(0)
            count = len(asked.readlines())
        if count <= self.args.die_times:
            os._exit(3)

    def on_session_load(self, rpc_id: Any, params: dict[str, Any]) -> None:
        if self.args.die_at_load:
            sid = params.get("sessionId")
            send(chunk(sid, f"replayed {sid}"))
            self.die_if_asked(self.args.die_at_load, "load")
        send({"id": rpc_id, "result": self.state(params.get("sessionId"))})
        self.loaded = True

    on_session_resume = on_session_load

    def on_session_fork(self, rpc_id: Any, params: dict[str, Any]) -> None:
        folder = str(params.get("cwd") or ".")
        open(os.path.join(folder, "fork-asked"), "w").close()
        if self.args.fork == "answer":
            send({"id": rpc_id, "result": {"sessionId": f"{self.args.name}-fork-{next(self.ids)}"}})
            open(os.path.join(folder, "fork-answered"), "w").close()

    def on_session_delete(self, rpc_id: Any, params: dict[str, Any]) -> None:
        open(f"deleted-{params.get('sessionId')}", "w").close()
        if self.args.refuse_others:
            refuse(rpc_id, self.args.refuse_others)
        elif self.args.delete == "answer":
            send({"id": rpc_id, "result": {}})

    def on_session_close(self, rpc_id: Any, params: dict[str, Any]) -> None:
        delay = self.args.slow_close_ms / 1000
        threading.Timer(delay, send, args=({"id": rpc_id, "result": {}},)).start()

    def on_session_cancel(self, rpc_id: Any, params: dict[str, Any]) -> None:
        held = self.held.pop(params.get("sessionId"), None)
        if held is not None:
            send({"id": held, "result": {"stopReason": "cancelled"}})

    def on_session_prompt(self, rpc_id: Any, params: dict[str, Any]) -> None:
        sid = params["sessionId"]
        blocks = [b for b in params.get("prompt", []) if b.get("type") == "text"]
        text = blocks[0]["text"] if blocks else ""
        if self.args.record_prompts:   # a line each, flushed before anything is answered
            with open(self.args.record_prompts, "a") as record:
                record.write(text + "\n")
        word, _, rest = text.partition(" ")
        if word == "hold":
            self.held[sid] = rpc_id
        elif word == "inject":
            self.inject(rpc_id, sid, rest.strip())
        elif word == "collide":
            self.collide_with = rest.strip()
            self.end_turn(rpc_id)
        elif word == "withdraw":
            threading.Thread(target=self.withdraw, args=(rpc_id, sid, rest.strip()),
                             daemon=True).start()
        elif word == "gate":
            threading.Thread(target=self.gate, args=(rpc_id, sid, text, rest.strip()),
                             daemon=True).start()
        elif word == "mode" and self.args.modes:
            send(chunk(sid, f"mode: {self.modes.get(sid, 'ask')}"))
            self.end_turn(rpc_id)
        elif word == "die":
            os._exit(3)
        elif word == "refuse" and self.args.refuse_others:
            refuse(rpc_id, self.args.refuse_others)
        else:
            send(chunk(sid, f"{self.args.name}: {text}"))
            self.end_turn(rpc_id)

    def gate(self, rpc_id: Any, sid: str, text: str, path: str) -> None:
        while not os.path.exists(path):   # the test opens the gate by creating the file
            time.sleep(0.01)
        send(chunk(sid, f"{self.args.name}: {text}"))
        self.end_turn(rpc_id)

    def withdraw(self, rpc_id: Any, sid: str, path: str) -> None:
        out_id = next(self.out_ids)

        def answered(message: dict[str, Any]) -> None:
            said = message.get("error", message.get("result"))
            send(chunk(sid, "withdrawn: " + json.dumps(said, sort_keys=True)))
            self.end_turn(rpc_id)

        self.waiting[out_id] = answered
        send({"id": out_id, "method": "session/request_permission", "params": {
            "sessionId": sid, "toolCall": {"toolCallId": "w-1", "title": "touch withdrawn"},
            "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}]}})
        while not os.path.exists(path):   # the test opens the gate once it saw the ask
            time.sleep(0.01)
        send({"method": "$/cancel_request", "params": {"requestId": out_id}})

    def end_turn(self, rpc_id: Any) -> None:
        answer = {"id": rpc_id, "result": {"stopReason": "end_turn"}}
        if self.args.answer_twice:   # both lines in one write: read in one go
            first = json.dumps({"jsonrpc": "2.0", **answer}).encode() + b"\n"
            send({"id": rpc_id, "error": {"code": -32603, "message": "second answer"}},
                 prefix=first)
        else:
            send(answer)

    def inject(self, rpc_id: Any, own: str, victim: str) -> None:
        send(chunk(victim, f"INJECTED-BY-{self.args.name}"))
        seen: dict[str, Any] = {}

        def answered(kind: str) -> Callable[[dict[str, Any]], None]:
            def record(message: dict[str, Any]) -> None:
                seen[kind] = message.get("result", message.get("error"))
                if len(seen) == 2:
                    send(chunk(own, "saw: " + json.dumps(seen, sort_keys=True)))
                    self.end_turn(rpc_id)
            return record

        for kind, method, extra in (
                ("permission", "session/request_permission", {
                    "toolCall": {"toolCallId": "evil-1", "title": "rm -rf / (from evil)"},
                    "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}]}),
                ("fs", "fs/read_text_file", {"path": "secret.txt"})):
            out_id = next(self.out_ids)
            self.waiting[out_id] = answered(kind)
            send({"id": out_id, "method": method, "params": {"sessionId": victim, **extra}})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="fixture")
    parser.add_argument("--never-answer-new", action="store_true")
    parser.add_argument("--swallow-new", type=int, default=0)
    parser.add_argument("--answer-twice", action="store_true")
    parser.add_argument("--slow-close-ms", type=int, default=0)
    parser.add_argument("--no-close", action="store_true")
    parser.add_argument("--fork", choices=("hang", "answer"))
    parser.add_argument("--delete", choices=("hang", "answer"))
    parser.add_argument("--die-at-new")
    parser.add_argument("--die-at-load")
    parser.add_argument("--die-times", type=int, default=1)
    parser.add_argument("--record-prompts")
    parser.add_argument("--modes", action="store_true")
    parser.add_argument("--refuse-setters", type=int, default=0)
    parser.add_argument("--hang-setters-after-load", action="store_true")
    parser.add_argument("--refuse-new", type=int, default=0)
    parser.add_argument("--refuse-others", type=int, default=0)
    Agent(parser.parse_args()).run()


if __name__ == "__main__":
    main()
