"""duplex.transport: wire protocols (sans-I/O codecs), the connection actor and the server."""

from ._app import build_app
from ._duplex_wire import (
    CLIENT_EVENT_NAMES,
    DEFAULT_MAX_EVENT_BYTES,
    SERVER_EVENT_NAMES,
    encode_server_event,
    parse_client_event,
)
from ._server import run_server, serve_duplex

__all__ = [
    "CLIENT_EVENT_NAMES",
    "DEFAULT_MAX_EVENT_BYTES",
    "SERVER_EVENT_NAMES",
    "build_app",
    "encode_server_event",
    "parse_client_event",
    "run_server",
    "serve_duplex",
]
