"""LMSP v1: async tasks and responses on a durable store (the spec text, cited as "§N"
throughout, is ``docs/spec/LMSP.md``).

    async with open_lmsp(bridge, state_dir="/var/lib/acp", store_url="sqlite:///x.db",
                         max_running_tasks=4) as lmsp:
        app = Starlette(routes=routes(lmsp))     # /lmsp/v1, the service bound to each

Modules: ``wire`` (public wire types), ``problems`` (§9.3), ``requests`` (parsing),
``responses`` (ACP → response events), ``runner`` (execution), ``deltas`` (a running
task's events batched into commits), ``models`` (the model map: a live view of the
bridge's agents), ``service`` (``open_lmsp``), ``task_events`` (a task's committed
events as a stream), ``endpoints`` (HTTP, ``routes``), ``errors`` (the door's exception
handlers: problem objects). The durable store, its writer and the live hub are the
room ``acp_server.store``.
"""

from __future__ import annotations

from acp_server.lmsp.errors import EXCEPTION_HANDLERS
from acp_server.lmsp.endpoints import routes
from acp_server.lmsp.service import LmspConfig, LmspService, open_lmsp

__all__ = ["EXCEPTION_HANDLERS", "LmspConfig", "LmspService", "open_lmsp", "routes"]
