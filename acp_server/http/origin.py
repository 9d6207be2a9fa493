"""Who made a session: the ``_meta`` label every door reads the same way.

    origin = session_origin(body_meta)   # {"acp-server/origin": "conformance"} -> "conformance"
    await bridge.create_session(agent=agent, origin=origin)

A client that creates sessions for a machine (our LMSP runner, the conformance runner,
a CI job) names itself in ``_meta["acp-server/origin"]`` of ``POST /session`` or of
``/acp`` ``session/new``; the listings report it (``origin``) and the console hides such
sessions by default. Contract: a label is 1-32 characters of ``a-z 0-9 . _ -``, starting
with a letter; anything else (absent, wrong type, too long) is no label: the session is
a person's. Never an error: a label only sorts sessions, it grants nothing.
"""

from __future__ import annotations

import re
from typing import Any

ORIGIN_META = "acp-server/origin"
_LABEL = re.compile(r"[a-z][a-z0-9._-]{0,31}")


def session_origin(meta: Any) -> str | None:
    """The label in a ``_meta`` object, or ``None``."""
    value = meta.get(ORIGIN_META) if isinstance(meta, dict) else None
    return value if isinstance(value, str) and _LABEL.fullmatch(value) else None
