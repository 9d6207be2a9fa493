"""``acp-server connect``: an ACP agent on stdio that relays to an acp-server's ``/acp``,
so that any editor that starts ACP agents as child processes can use the server.

    $ ACP_SERVER_TOKEN=... acp-server connect http://127.0.0.1:4170/acp   # the editor's agent

    relay = Relay(Target("http://127.0.0.1:4170/acp"), out=writer)
    await relay.run(LineReader(stdin_reader(), max_bytes=32 << 20))

Like ``acp_server.client``, it imports nothing of the server: anyio, httpx (HTTP/2
through ``h2``), httpx-ws, msgspec. Modules: ``wire`` (JSON-RPC kept raw), ``stdio``
(the editor's side: capped lines in, one writer out), ``link`` (the server's side:
WebSocket or Streamable HTTP), ``state`` (sessions, cursors, pending requests),
``relay`` (the editor's side of the relay), ``from_server`` (what the server sends),
``reconnect`` (the link's life: reconnecting, resending, giving up), ``reattach`` (the
sessions again after a reconnect), ``cli`` (the command line). What
the server offers a reconnecting client is in ``acp_server.acp_http.dispatch``.
"""

from __future__ import annotations

from acp_server.connect.link import LinkLost, StartupError, Target, open_link
from acp_server.connect.relay import Backoff, Clock, Relay
from acp_server.connect.stdio import EditorWriter, LineReader, TooLong

__all__ = ["Backoff", "Clock", "EditorWriter", "LineReader", "LinkLost", "Relay",
           "StartupError", "Target", "TooLong", "open_link"]
