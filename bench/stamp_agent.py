"""A stdio ACP agent for the latency benchmark: each prompt ``N`` answers N
``agent_message_chunk`` updates whose text is ``time.time_ns()`` taken just before the
line is written, one every ``GAP_S`` (so no two share a write).

    acp-server serve --agent "python -m bench.stamp_agent"
    POST /session/{id}/prompt {"prompt":[{"type":"text","text":"200"}]}
"""

from __future__ import annotations

import json
import sys
import time
import uuid

GAP_S = 0.002


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        method, rpc_id, params = message.get("method"), message.get("id"), message.get("params")
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": rpc_id, "result": {
                "protocolVersion": 1, "agentCapabilities": {}, "authMethods": []}})
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": rpc_id, "result": {"sessionId": str(uuid.uuid4())}})
        elif method == "session/prompt":
            text = "".join(b.get("text", "") for b in params["prompt"])
            count = int(text.strip() or "1") if text.strip().isdigit() else 1
            for _ in range(count):
                time.sleep(GAP_S)
                send({"jsonrpc": "2.0", "method": "session/update", "params": {
                    "sessionId": params["sessionId"], "update": {
                        "sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": str(time.time_ns())}}}})
            send({"jsonrpc": "2.0", "id": rpc_id, "result": {"stopReason": "end_turn"}})
        elif rpc_id is not None and method is not None:
            send({"jsonrpc": "2.0", "id": rpc_id, "result": {}})


if __name__ == "__main__":
    main()
