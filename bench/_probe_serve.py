"""Diagnostic: ``duplex serve`` that also writes its trio task count and GC-tracked objects.

    PROBE_FILE=F [PROBE_EVERY_S=S] python bench/_probe_serve.py serve --port P ...

The server's own ``trio.run`` gets one more system task that, every ``PROBE_EVERY_S``
seconds (default 5), appends a JSON line ``{"t": monotonic, "tasks": N, "gc_objects": M,
"gc_frozen": F}`` to ``PROBE_FILE`` (the server freezes what it built at startup, so
``gc_objects`` counts what it made since). ``bench/soak.py`` reads it: the server does
not export these (each sample walks every task and lists every tracked object, which
stalls the event loop for a few ms). Not for production. Child processes (workers,
shards, engine processes) are not probed; their RSS and fds are read from ``/proc``.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
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


async def _probe(path: str, every_s: float) -> None:
    with open(path, "a") as out:
        while True:
            sample = {
                "t": time.monotonic(),
                "tasks": _count_tasks(),
                "gc_objects": len(gc.get_objects()),  # not counting those frozen at startup
                "gc_frozen": gc.get_freeze_count(),
            }
            out.write(json.dumps(sample) + "\n")
            out.flush()
            await trio.sleep(every_s)


def main() -> int:
    path = os.environ["PROBE_FILE"]
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
