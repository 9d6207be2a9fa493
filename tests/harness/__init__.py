"""The two ways the tests run the server, both on ``acp_server.server.open_server``.

    from tests.harness import local_server, ServeProcess
    async with local_server(tmp_path) as srv: ...         # in process, real loopback HTTP
    with ServeProcess(tmp_path, "--max-sessions", "0") as child: ...   # acp-server serve

``local.local_server`` (and ``local.serving`` for any other ASGI app) and
``process.ServeProcess``; each module's docstring states its contracts.
"""

from tests.harness.local import LocalServer, local_server, serving
from tests.harness.process import ServeProcess, free_port, read_chunk_burst, read_until_closed

__all__ = ["LocalServer", "ServeProcess", "free_port", "local_server", "read_chunk_burst",
           "read_until_closed", "serving"]
