"""How many objects the cyclic garbage collector tracks that one streaming session adds.

    .venv/bin/python bench/session_heap.py [--seconds 60]

A session machine (no sockets, no engine) takes one 80 ms frame of speech-like input
and one model frame each tick for ``--seconds``: 20 speaking frames with text, then
5 listening frames, and again. Everything built before is frozen (``gc.freeze``), so
the count is what the session keeps alive: its journal, history and ledgers. Why it
matters: a full collection walks every tracked object and stops the event loop for
every session of the process (docs/benchmarks.md, "Sessions").
"""

from __future__ import annotations

import argparse
import gc
from collections import Counter

import numpy as np

from duplex.sessions import (
    AudioAppend,
    ConnectionAttached,
    ModelFrame,
    SessionConfig,
    SessionMachine,
)

FRAME = 1920  # 80 ms at 24 kHz


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    frames = int(args.seconds / 0.08)
    voice = np.full(FRAME, 0.1, dtype=np.float32)
    quiet = np.zeros(FRAME, dtype=np.float32)
    loud = AudioAppend((0.3 * np.sin(np.arange(FRAME) * 0.2)).astype(np.float32))
    gc.collect()
    gc.freeze()
    machine = SessionMachine(SessionConfig(overlap_policy="model"))
    machine.handle(ConnectionAttached(1), 0.0)
    now = 0.0
    for k in range(frames):
        now += 0.08
        machine.handle(loud, now)
        speaking = k % 25 < 20
        frame = ModelFrame(
            machine.epoch,
            voice if speaking else quiet,
            "a" if speaking else "",
            speaking,
            False,
            consumed_input_samples=FRAME,
        )
        machine.handle(frame, now)
    gc.collect()
    tracked = gc.get_objects()
    kinds = Counter(type(o).__name__ for o in tracked)
    journal = machine.statistics().journal
    print(f"{frames} frames ({args.seconds:g} s), journal {journal.entries} events")
    print(f"tracked objects: {len(tracked)} ({len(tracked) / frames:.2f} a frame)")
    print("most common:", ", ".join(f"{name} {n}" for name, n in kinds.most_common(6)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
