"""A server's sessions and capacity from its shards' health: each engine counted once.

With session shards on engine processes, every shard links to the same engines and
each reports that engine's slots as its own capacity: summed, two shards of one
146-slot engine said 292. Here the shards' reports are merged by engine: an engine
process (``shared``) is one engine however many shards see it; an engine inside a
shard (CPU, no engine process) is that shard's own. Pure: health dicts in, numbers out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, final

__all__ = ["ServerSessions", "merged_sessions"]


@final
@dataclass(frozen=True, slots=True)
class ServerSessions:
    """Sessions of a whole server (every shard), for ``/health`` and ``/metrics``.

    Args:
        live: sessions live now, over every shard that answered.
        capacity: sessions it may hold at once: the shards' own bounds, and each
            engine's slots counted once.
        engines: distinct engines seen (an engine process counts once).
    """

    live: int
    capacity: int
    engines: int

    def as_dict(self) -> dict[str, int]:
        """The ``sessions`` object of ``/health``."""
        return {"live": self.live, "capacity": self.capacity}


def _count(value: object) -> int:
    """A count from a health answer: a non-negative int, else 0 (a shard that is restarting
    answers without it)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def merged_sessions(
    shards: Sequence[Mapping[str, Any] | None], *, shared_engines: bool
) -> ServerSessions:
    """Every shard's ``/health`` answer (``None``: it did not answer) as one server's.

    A shard's capacity is ``min(its share of max_sessions, the slots of the engines it
    sees)``; the server's is the sum of those, bounded by the slots of the distinct
    engines (one engine's slots are never counted twice). With ``shared_engines``
    (engine processes) engine ``i`` of every shard is the same engine; without, each
    shard's engines are its own. Where two shards report one engine's slots differently
    (reports cross in flight), the larger is taken.

    Args:
        shards: each shard's health, in shard order: ``sessions`` (``live``,
            ``capacity``) and ``engines`` (``engine``, ``slots``) as
            ``HubBackend.health_of`` writes them.
        shared_engines: the shards reach their engines through engine processes.
    """
    live = capacity = 0
    slots: dict[tuple[int, int], int] = {}
    for position, shard in enumerate(shards):
        if shard is None:
            continue
        sessions = shard.get("sessions") or {}
        live += _count(sessions.get("live"))
        capacity += _count(sessions.get("capacity"))
        for engine in shard.get("engines") or ():
            index = _count(engine.get("engine"))
            key = (-1 if shared_engines else position, index)
            slots[key] = max(slots.get(key, 0), _count(engine.get("slots")))
    return ServerSessions(live, min(capacity, sum(slots.values())), len(slots))
