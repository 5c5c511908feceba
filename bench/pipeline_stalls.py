"""How long an image pipeline's thread keeps another thread of its process from running.

    python3 bench/pipeline_stalls.py --image-model SD15_DIR --device cuda --images 20
        [--size 512x512] [--steps 30] [--switch-interval-ms 1] [--out FILE]

In an engine process the tick loop (a trio thread) shares the GIL with the request
runners' threads. This runs the server's image runner (`load_image_runner`, as
``duplex serve`` loads it, on the batch-priority stream on CUDA) in a worker thread,
images back to back, while the main thread wakes every millisecond as a tick loop does
at its deadline, and measures how late each wake-up is. Each wake-up later than
``--stall-ms`` is reported with what the pipeline was doing then (its phase: the
prompt's encoding, step k, the VAE decode and the copy to the host, timed by hooks on
the pipeline's modules), so a stall can be put down to its cause. A first pass without
the pipeline gives the wake-up lateness of the idle process to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from duplex.models import ModelOptions  # noqa: E402
from duplex.models.diffusion import ImageRequest, load_image_runner, resolve_diffusion  # noqa: E402
from duplex.topology._server import freeze_startup_objects  # noqa: E402


class _Gate:
    """The runner's `UnitGate`, never waiting (nothing realtime here): it marks each step."""

    def __init__(self, phases: list[tuple[float, str]]) -> None:
        self.phases = phases
        self.step = 0

    def next_unit(self, kind: str = "step") -> None:
        self.step += 1
        self.phases.append((time.perf_counter(), f"{kind} {self.step}"))


def _wakeups(stop: threading.Event, period_s: float) -> list[tuple[float, float]]:
    """(time, lateness) of each wake-up until ``stop``."""
    out = []
    while not stop.is_set():
        due = time.perf_counter() + period_s
        time.sleep(period_s)
        now = time.perf_counter()
        out.append((now, now - due))
    return out


def _phase_at(phases: list[tuple[float, str]], at: float) -> str:
    current = "between images"
    for started, name in phases:
        if started > at:
            break
        current = name
    return current


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image-model", required=True, help="tiny or a diffusers folder")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--images", type=int, default=20)
    parser.add_argument("--size", default="512x512")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--switch-interval-ms", type=float, default=1.0)
    parser.add_argument("--stall-ms", type=float, default=3.0)
    parser.add_argument("--out")
    args = parser.parse_args()
    sys.setswitchinterval(args.switch_interval_ms / 1000)
    width, height = (int(v) for v in args.size.split("x"))
    model = resolve_diffusion(args.image_model, "image", ModelOptions(device=args.device))
    runner = load_image_runner(model, args.device, beside_realtime=args.device == "cuda")
    freeze_startup_objects()  # as an engine process does once its runners are built
    for module in ("text_encoder", "unet", "vae"):
        if getattr(runner.pipeline, module, None) is None:
            raise SystemExit(f"the pipeline has no {module}")
    phases: list[tuple[float, str]] = []

    def mark(name: str) -> Any:
        return lambda *_: phases.append((time.perf_counter(), name))

    runner.pipeline.text_encoder.register_forward_pre_hook(mark("text encoder"))
    runner.pipeline.text_encoder.register_forward_hook(mark("after the text encoder"))
    decode = runner.pipeline.vae.decode

    def timed_decode(*a: Any, **k: Any) -> Any:
        phases.append((time.perf_counter(), "VAE decode"))
        try:
            return decode(*a, **k)
        finally:
            phases.append((time.perf_counter(), "copy to the host"))

    runner.pipeline.vae.decode = timed_decode

    stop = threading.Event()
    timer = threading.Timer(5.0, stop.set)
    timer.start()
    idle = _wakeups(stop, 0.001)

    def images() -> None:
        try:
            for k in range(args.images):
                phases.append((time.perf_counter(), "image setup"))
                request = ImageRequest(
                    prompt=f"a lighthouse at dusk {k}", width=width, height=height,
                    seed=k, steps=args.steps,
                )  # fmt: skip
                runner.run_batch([request], _Gate(phases))
                phases.append((time.perf_counter(), "between images"))
        finally:
            stop.set()

    stop.clear()
    worker = threading.Thread(target=images)
    started = time.perf_counter()
    worker.start()
    busy = _wakeups(stop, 0.001)
    worker.join()
    wall = time.perf_counter() - started

    def summary(samples: list[tuple[float, float]]) -> dict[str, Any]:
        late = np.array([lateness for _, lateness in samples]) * 1000
        return {
            "wakeups": len(late),
            "late_p50_ms": round(float(np.percentile(late, 50)), 3),
            "late_p99_ms": round(float(np.percentile(late, 99)), 3),
            "late_max_ms": round(float(late.max()), 3),
        }

    stalls: dict[str, list[float]] = {}
    for at, lateness in busy:
        if lateness * 1000 >= args.stall_ms:
            # the stall began a wake-up period plus its lateness before it ended
            name = _phase_at(phases, at - lateness)
            kind = name.split(" ")[0] if name.startswith(("step", "decode")) else name
            stalls.setdefault(kind, []).append(round(lateness * 1000, 2))
    report = {
        "command": "python3 bench/pipeline_stalls.py " + " ".join(sys.argv[1:]),
        "machine": f"{os.cpu_count()} CPU cores",
        "images_per_min": round(args.images / wall * 60, 1),
        "idle": summary(idle),
        "beside_the_pipeline": summary(busy),
        "stalls_by_phase": {
            name: {"count": len(v), "max_ms": max(v), "sum_ms": round(sum(v), 1)}
            for name, v in sorted(stalls.items(), key=lambda kv: -sum(kv[1]))
        },
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
