"""Batched silero VAD step time against the number of streams, on this CPU.

    .venv/bin/python bench/vad.py [--streams 1,16,64,256] [--threads 1,2] [--steps 200]

For each torch thread count and stream count N: the VAD's engine
(`silero_engine`: an `Engine` over a `SileroRunner`) with N slots, each fed one
512-sample (32 ms) window of white noise before every step, so each step is one
forward over N windows. Prints the time of `Engine.step` (its scheduling, the
forward and the outputs; median, p90, min, in ms) and the share of the 32 ms
real-time budget the median uses. The first steps are warm-up and not counted.
``torch.set_num_threads`` is process-wide: the server sets it once.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from duplex.models import VAD_WINDOW_MS, VAD_WINDOW_SAMPLES, silero_engine


def measure(streams: int, steps: int, warmup: int = 10) -> list[float]:
    vad = silero_engine(streams)
    handles = [vad.acquire_slot(f"s{i}") for i in range(streams)]
    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal((streams, VAD_WINDOW_SAMPLES))).astype(np.float32)
    times: list[float] = []
    for k in range(warmup + steps):
        for handle, row in zip(handles, audio, strict=True):
            assert handle is not None
            vad.push_input(handle, row)
        started = time.perf_counter()
        windows = vad.step(float(k))
        elapsed = time.perf_counter() - started
        assert len(windows) == streams
        if k >= warmup:
            times.append(elapsed)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1,16,64,256")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, budget {VAD_WINDOW_MS} ms per window")
    print(f"{'threads':>7} {'streams':>7} {'median':>8} {'p90':>8} {'min':>8} {'budget':>7}")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for streams in (int(n) for n in args.streams.split(",")):
            ms = np.array(measure(streams, args.steps)) * 1e3
            median = float(np.median(ms))
            print(
                f"{threads:>7} {streams:>7} {median:>8.2f} {np.percentile(ms, 90):>8.2f}"
                f" {ms.min():>8.2f} {median / VAD_WINDOW_MS:>7.1%}"
            )


if __name__ == "__main__":
    main()
