"""duplex.runtime: the session runtime, the trio and model wiring around the session core.

``duplex.sessions`` is the sans-I/O core: events in, effects out, ``now`` passed
in. This package is what runs it: the session actor (one `SessionMachine` per
actor, its effects performed on the engine slot, the shared VAD and the
connection), the VAD link, and the hub (admission, the registry of live
sessions, the engine and VAD driver lifecycle).

It is a sibling of ``duplex.sessions``, not a subpackage, so that the import
direction reads from the folders: ``actors`` and ``sessions`` import no other
duplex package (only the shared leaf modules such as ``duplex.exceptions``);
``runtime`` joins them with ``models``; ``transport`` sits on top and imports
only what this ``__init__`` and ``duplex.sessions`` publish.
The core's import test then covers its whole package, with no exceptions.

Published here is what a connection needs: the hub, the messages a
connection actor exchanges with its session actor, and the registry of
request-batched engines (`RequestEngines`) the batch endpoints submit to.
"""

from ._actor import Attach, ClientNotReading, CloseSocket, Detach, FromClient, Outbound
from ._hub import Opened, SessionHub
from ._requests import RequestEngines, RequestService

__all__ = [
    "Attach",
    "ClientNotReading",
    "CloseSocket",
    "Detach",
    "FromClient",
    "Opened",
    "Outbound",
    "RequestEngines",
    "RequestService",
    "SessionHub",
]
