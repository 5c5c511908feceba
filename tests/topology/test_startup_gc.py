"""After startup's freeze, closed sessions' cyclic garbage is collected at the usual pace.

Every closed session and connection is a reference cycle (actor, cell, mailbox,
hypercorn's protocol objects) that only a full collection frees. CPython runs one
once the objects promoted to the oldest generation number a quarter of those that
survived the last full collection. `freeze_startup_objects` collected with every
startup object still in that generation (torch alone brings ~200,000), so the first
full collection after the freeze could wait for ~50,000 promoted objects.
"""

from __future__ import annotations

import gc
from collections import deque

from duplex.topology._server import freeze_startup_objects, unfreeze_startup_objects


class _Node:
    peer: _Node
    payload: list[int]


def _full_collections_during_churn(cycles: int) -> int:
    """Full collections the collector makes by itself while ``cycles`` short-lived
    reference cycles come and go (each lives long enough to reach the oldest
    generation, as a session does)."""
    full = [0]

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full[0] += 1

    live: deque[_Node] = deque(maxlen=300)
    gc.callbacks.append(count)
    try:
        for i in range(cycles):
            a, b = _Node(), _Node()
            a.peer, b.peer, a.payload = b, a, [i]
            live.append(a)
    finally:
        gc.callbacks.remove(count)
    return full[0]


def test_the_first_full_collection_comes_as_soon_as_usual_after_the_freeze() -> None:
    startup_objects = [[[] for _ in range(10)] for _ in range(20_000)]  # ~220,000 tracked
    assert gc.isenabled()
    freeze_startup_objects()
    try:
        # with the long-lived count left at ~220,000, none in 100,000 cycles (~50,000
        # would have to reach the oldest generation first)
        assert _full_collections_during_churn(100_000) >= 1
    finally:
        unfreeze_startup_objects()
        del startup_objects
        gc.collect()
