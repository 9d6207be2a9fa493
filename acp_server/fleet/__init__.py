"""Sessions across instances on one PostgreSQL store (issue #24): requests for a session
reach the instance that runs it (``routing.SessionRouter``), forwarded over HTTP
(``forward``) or adopted here once its owner's lease expired."""

from acp_server.fleet.routing import FORWARDED_HEADER, FleetStats, SessionRouter

__all__ = ["FORWARDED_HEADER", "FleetStats", "SessionRouter"]
