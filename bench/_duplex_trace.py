"""Diagnostic: ``duplex serve`` that reports what it holds each time it gets SIGUSR1.

    CHURN_TRACE_OUT=FILE python bench/_duplex_trace.py serve --port P

The first SIGUSR1 (``bench/churn.py --trace`` sends one per report, the first after
its baseline) starts ``tracemalloc``; each later one appends to FILE, after a full
collection, the 25 tracebacks whose allocations grew most since the previous
signal and the 25 types whose count of collector-tracked objects grew most.
Not for production: tracemalloc slows every allocation.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any


def main() -> int:
    out = Path(os.environ["CHURN_TRACE_OUT"])
    import duplex.config
    import duplex.transport  # noqa: F401  the server's modules, before tracing starts
    from duplex.cli import main as duplex_main

    state: dict[str, Any] = {"snap": None, "types": Counter(), "n": 0}

    def report(signum: int, frame: Any) -> None:
        gc.collect()
        if not tracemalloc.is_tracing():
            tracemalloc.start(8)
        snap = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)]
        )
        types = Counter(type(o).__qualname__ for o in gc.get_objects())
        lines = [f"== report {state['n']}: {sum(types.values())} tracked objects"]
        if state["snap"] is not None:
            for stat in snap.compare_to(state["snap"], "traceback")[:25]:
                lines.append(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks")
                lines.extend(f"      {frame}" for frame in stat.traceback.format()[-8:])
            growth = types.copy()
            growth.subtract(state["types"])
            for name, n in growth.most_common(25):
                lines.append(f"{n:+8d} {name}")
        state.update(snap=snap, types=types, n=state["n"] + 1)
        with out.open("a") as f:
            f.write("\n".join(lines) + "\n")

    signal.signal(signal.SIGUSR1, report)
    return duplex_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
