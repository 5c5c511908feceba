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

To tell a leak from the allocator keeping freed memory: every sample also carries glibc's
``mallinfo2`` (``malloc_in_use``: bytes malloc has handed out and not had back;
``malloc_free``: freed bytes it still holds in its arenas; ``malloc_mmap``: its large
blocks) and ``pymalloc_blocks`` (Python's small-object blocks live). With
``PROBE_TRACEMALLOC=N``, the first SIGUSR1 (the soak's idle baseline) starts
``tracemalloc`` with N frames and every later one (after the full collection) writes the
allocations still held that were made since, grouped by traceback, to
``PROBE_TRACEMALLOC_OUT`` (JSON lines, with the total). With ``PROBE_MALLOC_TRIM_S=S``
the probe calls ``malloc_trim(0)`` every S seconds (each sample then carries the bytes
``malloc_trim`` reported released, as ``malloc_trimmed``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import os
import signal
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from typing import Any

import trio

_LIBC: Any = None


MALLINFO2_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                    "uordblks", "fordblks", "keepcost")  # fmt: skip


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2_FIELDS]


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _LIBC.mallinfo2.restype = _MallInfo2
        _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
    return _LIBC


def _malloc_stats() -> dict[str, int]:
    """glibc's view of the heap, summed over its arenas (None fields off glibc)."""
    try:
        info = _libc().mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {
        "malloc_in_use": info.uordblks + info.hblkhd,
        "malloc_free": info.fordblks,
        "malloc_mmap": info.hblkhd,
        "pymalloc_blocks": sys.getallocatedblocks(),
    }


class _Trimmer:
    """``PROBE_MALLOC_TRIM_S``: ``malloc_trim(0)`` now and then (what a server could do)."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.next = time.monotonic() + every_s
        self.released = 0

    def maybe(self) -> None:
        if self.every_s > 0 and time.monotonic() >= self.next:
            self.next = time.monotonic() + self.every_s
            self.released += int(_libc().malloc_trim(0))


def _tracemalloc_point(frames: int, out_path: str) -> None:
    """At an idle point: start tracing (the first time), else write what is still held
    of the allocations made since (the caller has just run a full collection)."""
    if not tracemalloc.is_tracing():
        tracemalloc.start(frames)
        return
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__)]
    )
    stats = snapshot.statistics("traceback")
    with open(out_path, "a") as out:
        out.write(json.dumps({
            "t": time.monotonic(),
            "total_bytes": sum(stat.size for stat in stats),
            "blocks": sum(stat.count for stat in stats),
            "tracemalloc_overhead": tracemalloc.get_tracemalloc_memory(),
            "top": [
                {"bytes": stat.size, "count": stat.count,
                 "where": [f"{f.filename}:{f.lineno}" for f in stat.traceback][-frames:]}
                for stat in stats[:40]
            ],
        }) + "\n")  # fmt: skip


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
    trace_frames = int(os.environ.get("PROBE_TRACEMALLOC", "0"))
    trace_out = os.environ.get("PROBE_TRACEMALLOC_OUT", path + ".tracemalloc.jsonl")
    trimmer = _Trimmer(float(os.environ.get("PROBE_MALLOC_TRIM_S", "0")))
    with open(path, "a") as out:
        while True:
            trimmer.maybe()
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
                if trace_frames:
                    _tracemalloc_point(trace_frames, trace_out)
            sample.update(_malloc_stats())
            if trimmer.every_s:
                sample["malloc_trimmed"] = trimmer.released
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
