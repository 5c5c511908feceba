"""duplex.wire: the session wire protocols, sans-I/O.

Each projection turns one client frame into a typed session event and one
session event into the frames that carry it, with time passed in: native
``/v1/duplex`` JSON, OpenAI Realtime (GA and beta), Moshi's ``/api/chat``,
vLLM-Omni's raw ``/v1/audio/duplex``, and OpenPI's msgpack robot protocol.
Nothing here imports trio, Starlette or hypercorn (a layering test checks it);
the sockets that drive these objects are ``duplex.transport``'s.
"""

from ._envelope import DEFAULT_MAX_EVENT_BYTES
from ._json_text import dumps
from ._moshi import ChatQuery, MoshiProjection
from ._moshi import error_frame as moshi_error_frame
from ._native import (
    CLIENT_EVENT_NAMES,
    SERVER_EVENT_NAMES,
    NativeProjection,
    encode_server_event,
    parse_client_event,
)
from ._openpi import MAX_PAYLOAD_BYTES, Answer, Infer, OpenPIProtocol
from ._openpi import NOT_AVAILABLE as OPENPI_NOT_AVAILABLE
from ._openpi import error_frame as openpi_error_frame
from ._pcm import PcmProjection
from ._realtime import RealtimeProjection, duplex_flag, schema_from_headers
from ._stream import Frame, Later, OutputClock, StreamProjection

__all__ = [
    "CLIENT_EVENT_NAMES",
    "DEFAULT_MAX_EVENT_BYTES",
    "MAX_PAYLOAD_BYTES",
    "OPENPI_NOT_AVAILABLE",
    "SERVER_EVENT_NAMES",
    "Answer",
    "ChatQuery",
    "Frame",
    "Infer",
    "Later",
    "MoshiProjection",
    "NativeProjection",
    "OpenPIProtocol",
    "OutputClock",
    "PcmProjection",
    "RealtimeProjection",
    "StreamProjection",
    "dumps",
    "duplex_flag",
    "encode_server_event",
    "moshi_error_frame",
    "openpi_error_frame",
    "parse_client_event",
    "schema_from_headers",
]
