"""Diagnostic: ``duplex serve`` with the cyclic garbage collector switched off or frozen.

    python bench/_duplex_gc.py {off,freeze} serve --port P

``off``: ``gc.disable()`` once the server's modules are imported (reference
counting still frees everything without cycles; the process grows only by its
cyclic garbage). ``freeze``: ``gc.collect(); gc.freeze()`` at the same point,
so import-time objects are never traversed again. Not for production: it
exists so ``bench/sessions.py --duplex-gc`` can show how much of the latency is
collector pauses. Each full (gen 2) collection is logged to stderr with its duration.
"""

from __future__ import annotations

import gc
import sys
import time

_started: list[float] = []


def _log_gen2(phase: str, info: dict[str, int]) -> None:
    if info["generation"] != 2:
        return
    if phase == "start":
        _started[:] = [time.perf_counter()]
    elif _started:
        ms = (time.perf_counter() - _started[0]) * 1000
        print(f"gc gen2 {ms:.1f} ms at {time.monotonic():.3f}", file=sys.stderr, flush=True)


def main() -> int:
    mode, argv = sys.argv[1], sys.argv[2:]
    if mode not in ("off", "freeze", "on"):
        raise SystemExit("usage: _duplex_gc.py {on,off,freeze} serve ...")
    gc.callbacks.append(_log_gen2)
    import duplex.config
    import duplex.transport  # noqa: F401  the server's modules, before the switch
    from duplex.cli import main as duplex_main

    if mode == "off":
        gc.disable()
    elif mode == "freeze":
        gc.collect()
        gc.freeze()
    return duplex_main(argv)


if __name__ == "__main__":
    sys.exit(main())
