"""Session ids: made by the server, opaque to clients; on a sharded server they name the shard.

One place for the format, so the hub that makes an id and the worker that routes
a ``session.resume`` by it cannot disagree.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["new_session_id", "shard_of"]

_SHARDED = re.compile(r"duplex-s([0-9]{1,2})-")  # shards are 1..64: two ASCII digits at most


def new_session_id(random_bytes: Callable[[int], bytes], shard: int | None = None) -> str:
    """``duplex-<32 hex>``, or ``duplex-s<shard>-<32 hex>`` for a session of shard ``shard``."""
    token = random_bytes(16).hex()
    return f"duplex-{token}" if shard is None else f"duplex-s{shard}-{token}"


def shard_of(session_id: str) -> int | None:
    """The shard a session id names; ``None`` for any other string."""
    found = _SHARDED.match(session_id)
    return int(found.group(1)) if found else None
