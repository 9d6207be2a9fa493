"""The top floor: what operators and tooling see of the server, beside the doors.

    from acp_server.ops.metrics import Metrics               # GET /metrics
    from acp_server.ops.request_log import AccessRecorder, configure_logging
    from acp_server.ops import openapi                      # GET /openapi.json, `make schemas`
    python -m acp_server.ops.schemas schemas                 # schemas/*.json

Modules: ``metrics`` (Prometheus series; the bridge's observer), ``request_log`` (one
line per request, request metrics), ``openapi`` and ``openapi_types`` (the OpenAPI
document of the REST and LMSP routes), ``schemas`` (JSON Schemas of the wire types).

Contracts: this room may import the bridge and every door (it describes and measures
them); no door imports it. It is composed into the app by ``acp_server.server``.
"""
