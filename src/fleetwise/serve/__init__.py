"""The decision service (``fleetwise serve``, docs/serve.md) and the gateway (``fleetwise serve --gateway``,
docs/gateway.md): the project's policies behind an HTTP API. docs/security.md: the threat model and the limits.

Service: ``schemas`` (the wire: pydantic only), ``policy`` (routers on a caller's snapshot) and ``adapters``
(scalers, planners, checkpoints), ``edge`` (auth, body limit, server limits; shared with the gateway), ``app``
(the FastAPI app; the ``serve`` extra). Gateway: ``gateway_pool`` (backends' state, picking), ``gateway_forward``
(forwarding, retries, SSE framing), ``gateway`` (request check, the app). Nothing here is imported by
``import fleetwise``.
"""
