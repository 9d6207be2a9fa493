"""acp-server: an HTTP daemon serving ACP coding agents, compatible with ``qwen serve``.

    $ acp-server serve --port 4170 --workspace .
    acp-server listening on http://127.0.0.1:4170 (workspace=/abs/ws, agent=reference)
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
