"""``python -m acp_server serve ...`` is ``acp-server serve ...``."""

from __future__ import annotations

from acp_server.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
