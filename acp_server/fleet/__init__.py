"""Sessions across instances on one PostgreSQL store (issue #24): requests for a session
reach the instance that runs it (``routing.SessionRouter``), forwarded over HTTP
(``forward``) or adopted here once its owner's lease expired."""

from acp_server.fleet.adoption import Fleet, FleetStats
from acp_server.fleet.forward import FORWARDED_HEADER, Forwarder
from acp_server.fleet.replica import JournalReplicas
from acp_server.fleet.routing import SessionRouter

__all__ = ["FORWARDED_HEADER", "Fleet", "FleetStats", "Forwarder", "JournalReplicas", "SessionRouter"]
