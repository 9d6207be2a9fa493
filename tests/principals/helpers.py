"""Stored tokens for the tests: minted on a served ``Server`` as the bootstrap admin.

    alpha = await mint(srv.server, "alpha")                  # scopes prompt + read
    ops = await mint(srv.server, "ops", "admin", unlimited=True)
    headers = bearer(alpha)
"""

from __future__ import annotations

from acp_server.principals import BOOTSTRAP
from acp_server.server import Server


async def mint(server: Server, name: str, *scopes: str, expires: str | None = None,
               unlimited: bool = False) -> str:
    gate = server.gate
    issued = await gate.create_token(gate.caller(BOOTSTRAP), name, scopes=list(scopes),
                                     expires=expires,
                                     rate_class="unlimited" if unlimited else "default")
    return issued.token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
