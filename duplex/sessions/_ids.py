"""Session ids: made by the server, opaque to clients; they name the shard and the node.

One place for the format, so the hub that makes an id and the worker (or cluster
ingress) that routes a ``session.resume`` by it cannot disagree:
``duplex-[n<node>-][s<shard>-]<32 hex>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["NODE_NAME", "new_session_id", "node_of", "shard_of"]

NODE_NAME = re.compile(r"[a-z0-9]{1,16}")
"""A cluster node's name as ids carry it: 1-16 lowercase ASCII letters and digits."""

# shards are 1..64: two ASCII digits at most; the token is hex, so neither prefix is ambiguous
_PREFIXES = re.compile(r"duplex-(?:n([a-z0-9]{1,16})-)?(?:s([0-9]{1,2})-)?")


def new_session_id(
    random_bytes: Callable[[int], bytes], shard: int | None = None, node: str | None = None
) -> str:
    """``duplex-<32 hex>``, with ``n<node>-`` and ``s<shard>-`` before the token when given."""
    token = random_bytes(16).hex()
    node_part = "" if node is None else f"n{node}-"
    shard_part = "" if shard is None else f"s{shard}-"
    return f"duplex-{node_part}{shard_part}{token}"


def shard_of(session_id: str) -> int | None:
    """The shard a session id names; ``None`` for any other string."""
    found = _PREFIXES.match(session_id)
    return int(found.group(2)) if found and found.group(2) else None


def node_of(session_id: str) -> str | None:
    """The cluster node a session id names; ``None`` for any other string."""
    found = _PREFIXES.match(session_id)
    return found.group(1) if found and found.group(1) else None
