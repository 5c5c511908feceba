"""A Python client of ``duplex serve``: the Realtime ``?duplex=1`` socket with reconnect and
resume, and ``duplex talk`` (a conversation from a WAV file or the microphone).

It speaks only the wire protocol (docs/protocol/realtime.md): nothing here imports the
server's packages, so it runs against any server that speaks it.
"""

from ._connection import ClientClosed, RealtimeClient, ReconnectPolicy
from ._state import (
    SAMPLE_RATE,
    JitterBuffer,
    ResumeRefused,
    ServerEvent,
    SessionCursor,
    realtime_url,
)

__all__ = [
    "SAMPLE_RATE",
    "ClientClosed",
    "JitterBuffer",
    "RealtimeClient",
    "ReconnectPolicy",
    "ResumeRefused",
    "ServerEvent",
    "SessionCursor",
    "realtime_url",
]
