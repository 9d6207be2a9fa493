"""A stdio ACP agent that misbehaves in every way asked of it, for the hostile tests.

    python -m tests.agents.hostile_agent                       # answers initialize
    python -m tests.agents.hostile_agent --init never|exit|close-stdout

At ``initialize`` (``--init``): ``never`` answers; ``exit`` exits (code 5) unanswered;
``close-stdout`` closes its stdout and stays alive (ignoring stdin's end and
SIGTERM). Otherwise it answers (``loadSession`` false, nothing else) and makes sessions
``hostile-<n>``. ``session/cancel`` is always ignored.

``session/prompt``, by the first word of its first text block:

* ``ignore``: never answered.
* ``flood``: ``agent_message_chunk`` updates of 1 KiB without end, never answered.
* ``stall <file>``: a chunk ``stalling``; once ``<file>`` exists (in the agent's
  folder), a chunk ``LATE``, a permission request, and ``end_turn``.
* ``bigline <MiB>``: one update of that many MiB on one line, then ``end_turn``.
* ``noeol``: bytes without a newline, without end.
* ``ids``: answers to ids it was never asked (unknown, huge, a string, an object), a line
  that is no JSON, one that is no JSON-RPC, then the right answer twice.
* ``perms <n>``: ``n`` permission requests at once, without waiting; once all are
  answered, a chunk ``perms: {<outcome or error code>: count}`` and ``end_turn``.
* ``fs``: reads and writes with hostile paths (see ``FS_PROBES``) and ``terminal/*``
  requests, then a chunk ``fs: {<probe>: <error code or "ok:<bytes>">}`` and ``end_turn``.
* ``exit``: one chunk, then exits (code 3) unanswered.
* ``stderr <MiB>``: that many MiB on stderr (lines, then one line of it all), then
  ``end_turn``.
* ``closeout``: closes stdout and stays alive (ignoring stdin's end and SIGTERM).
* anything else: a chunk ``hostile: <text>`` (``hostile: <text> (while <n> stalled)``
  while ``stall`` prompts wait at their gate) and ``end_turn``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from typing import Any

from tests.agents.stdio import chunk, requests, send, send_raw

BIG = 20 * 1024 * 1024 + 7   # past the server's 16 MiB read cap

FS_PROBES: dict[str, tuple[str, dict[str, Any]]] = {
    "dotdot": ("fs/read_text_file", {"path": "../../../../../etc/passwd"}),
    "absolute": ("fs/read_text_file", {"path": "/etc/passwd"}),
    "proc": ("fs/read_text_file", {"path": "/proc/self/environ"}),
    "symlink_out": ("fs/read_text_file", {"path": "escape/passwd"}),
    "symlink_file": ("fs/read_text_file", {"path": "escape-file"}),
    "huge": ("fs/read_text_file", {"path": "huge.txt"}),
    "huge_line": ("fs/read_text_file", {"path": "small.txt", "line": 10 ** 30,
                                         "limit": 10 ** 30}),
    "bad_line": ("fs/read_text_file", {"path": "small.txt", "line": "x", "limit": -5}),
    "nul": ("fs/read_text_file", {"path": "a\u0000b"}),
    "no_path": ("fs/read_text_file", {"path": 12}),
    "write_out": ("fs/write_text_file", {"path": "../outside.txt", "content": "pwned"}),
    "write_proc": ("fs/write_text_file", {"path": "/proc/self/oom_score_adj",
                                          "content": "1000"}),
    "write_symlink": ("fs/write_text_file", {"path": "escape-file", "content": "pwned"}),
    "terminal_create": ("terminal/create", {"command": "sh", "args": ["-c", "id"]}),
    "terminal_output": ("terminal/output", {"terminalId": "t-1"}),
}


STAYING = threading.Event()   # stdout closed: the process stays past stdin's end


def stay_alive_without_stdout() -> None:
    STAYING.set()
    sys.stdout.flush()
    os.close(1)
    while True:
        time.sleep(3600)


class Agent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sessions = itertools.count(1)
        self.out_ids = itertools.count(10_000)
        self.waiting: dict[int, Any] = {}
        self.lock = threading.Lock()
        self.stalled = 0   # ``stall`` prompts not yet past their gate

    def run(self) -> None:
        for method, rpc_id, params in requests(self.waiting):
            if method == "initialize":
                self.initialize(rpc_id)
            elif method == "session/new":
                send({"id": rpc_id, "result": {"sessionId": f"hostile-{next(self.sessions)}"}})
            elif method == "session/prompt":
                threading.Thread(target=self.prompt, args=(rpc_id, params), daemon=True).start()
            elif method == "session/close":
                send({"id": rpc_id, "result": {}})
            elif rpc_id is not None:
                send({"id": rpc_id, "error": {"code": -32601, "message": "Method not found"}})
        while STAYING.is_set():   # stdin's end: exit (the server's stop), unless stdout
            time.sleep(3600)       # was closed: then stay
        os._exit(0)

    def initialize(self, rpc_id: Any) -> None:
        if self.args.init == "never":
            return
        if self.args.init == "exit":
            os._exit(5)
        if self.args.init == "close-stdout":
            threading.Thread(target=stay_alive_without_stdout, daemon=True).start()
            return
        send({"id": rpc_id, "result": {"protocolVersion": 1, "agentCapabilities": {
            "loadSession": False}, "agentInfo": {"name": "hostile", "version": "1"}}})

    def prompt(self, rpc_id: Any, params: dict[str, Any]) -> None:
        sid = params["sessionId"]
        blocks = [b for b in params.get("prompt", []) if b.get("type") == "text"]
        text = blocks[0]["text"] if blocks else ""
        word, _, rest = text.partition(" ")
        if word == "ignore":
            return
        if word == "flood":
            filler = "f" * 1024
            while True:
                send(chunk(sid, filler))
        if word == "stall":
            with self.lock:
                self.stalled += 1
            send(chunk(sid, "stalling"))
            while not os.path.exists(rest):   # the test opens the gate
                time.sleep(0.01)
            with self.lock:
                self.stalled -= 1
            send(chunk(sid, "LATE"))
            answered = threading.Event()
            self.ask("session/request_permission", {
                "sessionId": sid, "toolCall": {"toolCallId": "late", "title": "LATE"},
                "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}]},
                lambda message: answered.set())
            answered.wait()
        elif word == "bigline":
            send(chunk(sid, "b" * (int(rest) * 1024 * 1024)))
        elif word == "noeol":
            block = b"x" * 65536
            while True:
                send_raw(block)
        elif word == "ids":
            for junk in (b'{"jsonrpc":"2.0","id":987654,"result":{"stopReason":"end_turn"}}',
                         b'{"jsonrpc":"2.0","id":' + b"9" * 5000 + b',"result":{}}',
                         b'{"jsonrpc":"2.0","id":"' + str(rpc_id).encode() + b'","result":{}}',
                         b'{"jsonrpc":"2.0","id":{"a":1},"result":{}}',
                         b'{"jsonrpc":"2.0","id":' + str(rpc_id).encode() + b'}',
                         b"not json at all", b"[1, 2, 3]", b'{"hello": "world"}'):
                send_raw(junk + b"\n")
            send(chunk(sid, "hostile: ids"))
            send({"id": rpc_id, "result": {"stopReason": "end_turn"}})
        elif word == "perms":
            self.perms(rpc_id, sid, int(rest))
            return
        elif word == "fs":
            self.fs(rpc_id, sid)
            return
        elif word == "exit":
            send(chunk(sid, "hostile: about to exit"))
            os._exit(3)
        elif word == "stderr":
            size = int(rest) * 1024 * 1024
            line = b"e" * 1023 + b"\n"
            for _ in range(size // 2 // 1024):
                sys.stderr.buffer.write(line)
            sys.stderr.buffer.write(b"E" * (size // 2) + b"\n")
            sys.stderr.buffer.flush()
        elif word == "closeout":
            stay_alive_without_stdout()
        else:
            with self.lock:
                stalled = f" (while {self.stalled} stalled)" if self.stalled else ""
            send(chunk(sid, f"hostile: {text}{stalled}"))
        send({"id": rpc_id, "result": {"stopReason": "end_turn"}})

    def ask(self, method: str, params: dict[str, Any], on_answer: Any) -> None:
        out_id = next(self.out_ids)
        self.waiting[out_id] = on_answer
        send({"id": out_id, "method": method, "params": params})

    def perms(self, rpc_id: Any, sid: str, count: int) -> None:
        tally: Counter[str] = Counter()
        done = threading.Event()

        def answered(message: dict[str, Any]) -> None:
            if "error" in message:
                tally[str(message["error"]["code"])] += 1
            else:
                tally[message["result"]["outcome"]["outcome"]] += 1
            if sum(tally.values()) == count:
                done.set()

        for n in range(count):
            self.ask("session/request_permission", {
                "sessionId": sid, "toolCall": {"toolCallId": f"p-{n}", "title": f"ask {n}"},
                "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}]},
                answered)
        done.wait()
        send(chunk(sid, "perms: " + json.dumps(dict(tally), sort_keys=True)))
        send({"id": rpc_id, "result": {"stopReason": "end_turn"}})

    def fs(self, rpc_id: Any, sid: str) -> None:
        for name, target in (("escape", "/etc"), ("escape-file", "/etc/hostname")):
            if not os.path.lexists(name):
                os.symlink(target, name)
        with open("huge.txt", "wb") as huge:
            huge.truncate(BIG)
        with open("small.txt", "w") as small:
            small.write("one\ntwo\n")
        seen: dict[str, str] = {}
        done = threading.Event()

        def record(name: str) -> Any:
            def answered(message: dict[str, Any]) -> None:
                if "error" in message:
                    seen[name] = str(message["error"]["code"])
                else:
                    seen[name] = f"ok:{len(json.dumps(message['result']))}"
                if len(seen) == len(FS_PROBES):
                    done.set()
            return answered

        for name, (method, params) in FS_PROBES.items():
            self.ask(method, {"sessionId": sid, **params}, record(name))
        done.wait()
        send(chunk(sid, "fs: " + json.dumps(seen, sort_keys=True)))
        send({"id": rpc_id, "result": {"stopReason": "end_turn"}})


def main() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # stopped by SIGKILL only
    parser = argparse.ArgumentParser()
    parser.add_argument("--init", choices=("answer", "never", "exit", "close-stdout"),
                        default="answer")
    Agent(parser.parse_args()).run()


if __name__ == "__main__":
    main()
