"""Diagnostic: log every garbage-collector pass over 2 ms, in every Python process it reaches.

    PYTHONPATH=bench/gctrace GCTRACE_DIR=/tmp/gctrace .venv/bin/python bench/sessions.py ...

Python imports ``sitecustomize`` at startup from ``PYTHONPATH``, and child processes
inherit the variable, so the server, its connection workers and session shards and
the load generator each append ``<monotonic s> gen<N> <ms>ms collected=<n> <argv>``
lines to ``$GCTRACE_DIR/log.<pid>``. Not for production: it exists to see which
collector pauses fall inside a benchmark's measure window.
"""

import gc
import os
import sys
import time

_folder = os.environ.get("GCTRACE_DIR", "/tmp/gctrace")
_started = [0.0]


def _log(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    ms = (time.perf_counter() - _started[0]) * 1000
    if ms > 2:
        line = (
            f"{time.monotonic():.3f} gen{info['generation']} {ms:.1f}ms "
            f"collected={info['collected']} {' '.join(sys.argv[:3])[:80]}\n"
        )
        with open(os.path.join(_folder, f"log.{os.getpid()}"), "a") as out:
            out.write(line)


os.makedirs(_folder, exist_ok=True)
gc.callbacks.append(_log)
