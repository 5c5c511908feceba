"""duplex.transport: the socket shell: the ASGI app, the HTTP boundary, access, connections.

The app serves the sessions' routes over a ``Backend`` and takes the service
routes (``duplex.services``) from whoever builds it (the topology); the
connection actor runs one client socket through its wire projection
(``duplex.wire``). What the process topology (``duplex.topology``) builds on is
exported here; no other package imports a ``_`` module of this one.
"""

from ._access import AccessSettings, ResumeGuard, digest
from ._app import (
    HttpAnswer,
    HttpRoute,
    HubBackend,
    build_app,
    hypercorn_config,
    refusal_response,
    refuse_upgrade,
    relayed,
    routes_app,
)
from ._connection import ShutDown
from ._http import serve_http
from ._limits import has_body, raise_fd_limit, throttle_accept_errors
from ._sockets import EventSocket, Received, SocketGone

__all__ = [
    "AccessSettings",
    "EventSocket",
    "HttpAnswer",
    "HttpRoute",
    "HubBackend",
    "Received",
    "ResumeGuard",
    "ShutDown",
    "SocketGone",
    "build_app",
    "digest",
    "has_body",
    "hypercorn_config",
    "raise_fd_limit",
    "refusal_response",
    "refuse_upgrade",
    "relayed",
    "routes_app",
    "serve_http",
    "throttle_accept_errors",
]
