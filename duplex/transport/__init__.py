"""duplex.transport: wire protocols (sans-I/O codecs), the connection actor and the ASGI app.

What the process topology (``duplex.topology``) builds on is exported here; no
other package imports a ``_`` module of this one.
"""

from ._access import AccessSettings, ResumeGuard, digest
from ._app import HttpAnswer, HttpRoute, HubBackend, build_app, generation_app, hypercorn_config
from ._duplex_wire import (
    CLIENT_EVENT_NAMES,
    DEFAULT_MAX_EVENT_BYTES,
    SERVER_EVENT_NAMES,
    encode_server_event,
    parse_client_event,
)
from ._http import serve_http
from ._media import MediaService, MediaSettings
from ._media_wire import MediaLimits
from ._openpi import RobotService
from ._openpi_wire import MAX_PAYLOAD_BYTES
from ._sockets import EventSocket, Received, SocketGone
from ._speech import SpeechService

__all__ = [
    "CLIENT_EVENT_NAMES",
    "DEFAULT_MAX_EVENT_BYTES",
    "MAX_PAYLOAD_BYTES",
    "SERVER_EVENT_NAMES",
    "AccessSettings",
    "EventSocket",
    "HttpAnswer",
    "HttpRoute",
    "HubBackend",
    "MediaLimits",
    "MediaService",
    "MediaSettings",
    "Received",
    "ResumeGuard",
    "RobotService",
    "SocketGone",
    "SpeechService",
    "build_app",
    "digest",
    "encode_server_event",
    "generation_app",
    "hypercorn_config",
    "parse_client_event",
    "serve_http",
]
