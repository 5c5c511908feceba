"""Diagnostic: ``duplex serve`` that also writes its trio task count and GC-tracked objects.

    PROBE_FILE=F [PROBE_EVERY_S=S] python bench/_probe_serve.py serve --port P ...

The server's own ``trio.run`` gets one more system task that, every ``PROBE_EVERY_S``
seconds (default 5), appends a JSON line ``{"t": monotonic, "tasks": N, "gc_objects": M,
"gc_frozen": F}`` to ``PROBE_FILE`` (the server freezes what it built at startup, so
``gc_objects`` counts what it made since, garbage not yet collected included), with
``gc_full`` (full collections the collector made by itself so far) and ``gc_floor``
(the objects that survived the latest: the live ones). After a SIGUSR1 the next
sample runs a full collection first and adds ``gc_live``, the live objects now
(``bench/soak.py`` asks at its idle points). ``bench/soak.py`` reads it: the server does
not export these (each sample walks every task and lists every tracked object, which
stalls the event loop for a few ms). Not for production. Child processes (workers,
shards, engine processes) are not probed; their RSS and fds are read from ``/proc``.

To find what grows: with ``PROBE_TYPES_FILE=T`` each sample also runs a full
collection and appends every type's count of live objects to ``T``; with
``PROBE_GEN2_FILE=G``, after every full collection the collector makes by itself
the survivors' count by type goes to ``G``. Diff two lines.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import trio


def _count_tasks() -> int:
    count, todo = 0, [trio.lowlevel.current_root_task()]
    while todo:
        task = todo.pop()
        count += 1
        for nursery in task.child_nurseries:
            todo += nursery.child_tasks
    return count


def _type_counts(path: str) -> None:
    """After a full collection: each type's live objects (``PROBE_TYPES_FILE``, to find what
    grows: diff two lines)."""
    gc.collect()
    counts = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())
    with open(path, "a") as out:
        out.write(json.dumps({"t": time.monotonic(), "types": dict(counts)}) + "\n")


class _Collector:
    """What the cyclic collector did by itself: its full collections and what survived the
    latest (the floor of the GC-tracked objects: live ones, no garbage waiting)."""

    def __init__(self) -> None:
        self.full = 0
        self.floor: int | None = None
        self.collect_next = False
        """Set by SIGUSR1: the next sample runs a full collection first (``gc_live``)."""
        self.forcing = False

    def after(self, phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2 and not self.forcing:
            self.full += 1
            self.floor = len(gc.get_objects())  # right after a full one: the survivors

    def request(self, *_: object) -> None:
        self.collect_next = True


COLLECTOR = _Collector()


async def _probe(path: str, every_s: float) -> None:
    types_path = os.environ.get("PROBE_TYPES_FILE")
    with open(path, "a") as out:
        while True:
            if types_path:
                _type_counts(types_path)
            sample: dict[str, Any] = {
                "t": time.monotonic(),
                "tasks": _count_tasks(),
                "gc_objects": len(gc.get_objects()),  # not counting those frozen at startup
                "gc_frozen": gc.get_freeze_count(),
                "gc_full": COLLECTOR.full,
                "gc_floor": COLLECTOR.floor,
            }
            if COLLECTOR.collect_next:
                COLLECTOR.collect_next = False
                COLLECTOR.forcing = True
                gc.collect()
                COLLECTOR.forcing = False
                sample["gc_live"] = len(gc.get_objects())
            out.write(json.dumps(sample) + "\n")
            out.flush()
            await trio.sleep(every_s)


def _log_full_collections(path: str) -> None:
    """After every full collection: the survivors' count by type (``PROBE_GEN2_FILE``): what
    the collector could not free, without forcing any collection."""

    def after(phase: str, info: dict[str, int]) -> None:
        if phase != "stop" or info["generation"] != 2:
            return
        survivors = gc.get_objects(generation=2)
        counts = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in survivors)
        del survivors
        with open(path, "a") as out:
            out.write(json.dumps({"t": time.monotonic(), "types": dict(counts)}) + "\n")

    gc.callbacks.append(after)


def main() -> int:
    path = os.environ["PROBE_FILE"]
    gc.callbacks.append(COLLECTOR.after)
    signal.signal(signal.SIGUSR1, COLLECTOR.request)
    if os.environ.get("PROBE_GEN2_FILE"):
        _log_full_collections(os.environ["PROBE_GEN2_FILE"])
    every_s = float(os.environ.get("PROBE_EVERY_S", "5"))
    real_run = trio.run

    def probed_run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        async def with_probe() -> Any:
            trio.lowlevel.spawn_system_task(_probe, path, every_s)
            return await fn(*args)

        return real_run(with_probe, **kwargs)

    trio.run = probed_run  # the server's one trio.run (duplex.topology.run_server)
    from duplex.cli import main as duplex_main

    return duplex_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
