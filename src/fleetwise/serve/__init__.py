"""The decision service (``fleetwise serve``, docs/serve.md): the project's policies behind an HTTP API.

``fleetwise.serve.policy`` (pydantic only) runs the registered routers on a caller's snapshot of its replicas;
``fleetwise.serve.app`` (the ``serve`` extra: FastAPI, uvicorn, prometheus_client) is the service itself.
Nothing here is imported by ``import fleetwise``.
"""
