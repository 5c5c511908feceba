"""Batched silero VAD step time against the number of streams, on this CPU.

    .venv/bin/python bench/vad.py [--streams 1,16,64,256] [--threads 1,2] [--steps 200]
    git show 886c3d0:duplex/models/_silero.py > /tmp/silero_before.py
    .venv/bin/python bench/vad.py --baseline /tmp/silero_before.py

For each torch thread count and stream count N: the VAD's engine
(`silero_engine`: an `Engine` over a `SileroRunner`) with N slots, each fed one
512-sample (32 ms) window of white noise before every step, so each step is one
forward over N windows. Prints the time of `Engine.step` (its scheduling, the
forward and the outputs; median, p90, min, in ms) and the share of the 32 ms
real-time budget the median uses. The first steps are warm-up and not counted.
``torch.set_num_threads`` is process-wide: the server sets it once.

``--baseline FILE``: a ``_silero.py`` from before the VAD ran on the engine core
(its own stream pool, ``SileroVad``; commit 886c3d0 is the last) is loaded from
``FILE`` and stepped in the same process, interleaved step by step with the engine
(the order alternating), on the same audio; a row for each. On a shared machine the
load then falls on both alike, which separate runs cannot promise.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from duplex.models import VAD_WINDOW_MS, VAD_WINDOW_SAMPLES, silero_engine

Stepper = Callable[[], int]
"""Pushes one window to every stream, then steps once; returns windows scored."""


def engine_stepper(streams: int, audio: np.ndarray) -> tuple[Stepper, Stepper]:
    """(push, step) for the VAD's engine."""
    vad = silero_engine(streams)
    handles = [vad.acquire_slot(f"s{i}") for i in range(streams)]
    clock = iter(range(1 << 30))

    def push() -> int:
        for handle, row in zip(handles, audio, strict=True):
            assert handle is not None
            vad.push_input(handle, row)
        return 0

    return push, lambda: len(vad.step(float(next(clock))))


def baseline_stepper(
    module: ModuleType, streams: int, audio: np.ndarray
) -> tuple[Stepper, Stepper]:
    """(push, step) for the old ``SileroVad`` of ``module``."""
    vad: Any = module.SileroVad(max_streams=streams)
    handles = [vad.acquire(f"s{i}") for i in range(streams)]

    def push() -> int:
        for handle, row in zip(handles, audio, strict=True):
            vad.push(handle, row)
        return 0

    return push, lambda: len(vad.step())


def load_baseline(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("silero_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def measure(
    streams: int, steps: int, baseline: ModuleType | None, warmup: int = 10
) -> dict[str, list[float]]:
    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal((streams, VAD_WINDOW_SAMPLES))).astype(np.float32)
    targets = {"engine": engine_stepper(streams, audio)}
    if baseline is not None:
        targets["before"] = baseline_stepper(baseline, streams, audio)
    times: dict[str, list[float]] = {name: [] for name in targets}
    for k in range(warmup + steps):
        order = list(targets) if k % 2 == 0 else list(reversed(targets))
        for name in order:
            push, step = targets[name]
            push()
            started = time.perf_counter()
            scored = step()
            elapsed = time.perf_counter() - started
            assert scored == streams
            if k >= warmup:
                times[name].append(elapsed)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1,16,64,256")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--baseline", type=Path, help="an old _silero.py (SileroVad) to compare")
    args = parser.parse_args()
    baseline = None if args.baseline is None else load_baseline(args.baseline)
    print(f"torch {torch.__version__}, budget {VAD_WINDOW_MS} ms per window")
    print(
        f"{'target':>7} {'threads':>7} {'streams':>7} {'median':>8} {'p90':>8} {'min':>8}"
        f" {'budget':>7}"
    )
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for streams in (int(n) for n in args.streams.split(",")):
            for name, times in measure(streams, args.steps, baseline).items():
                ms = np.array(times) * 1e3
                median = float(np.median(ms))
                print(
                    f"{name:>7} {threads:>7} {streams:>7} {median:>8.2f}"
                    f" {np.percentile(ms, 90):>8.2f} {ms.min():>8.2f}"
                    f" {median / VAD_WINDOW_MS:>7.1%}"
                )


if __name__ == "__main__":
    main()
