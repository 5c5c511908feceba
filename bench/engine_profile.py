"""Where a frame of our Moshi engine spends GPU time: kernels by family, from the profiler.

`bench/duplex_engine.py` times whole frames; this says what is inside one. For
each B it builds the same engine (full ``moshi-7b`` config, seeded random
weights, CUDA graphs per batch bucket, sessions at staggered offsets or all at
full context), warms it up (graph capture), then records ``--frames`` frames
under ``torch.profiler`` and sums kernel time by family (attention, including
our Triton ring attention; our other Triton kernels: RMSNorm, RoPE, sampling;
matmul, top-k / sort, softmax, elementwise, indexing, convolution, reduction,
copy, other) and by kernel name. Kernels replayed from CUDA graphs are reported one
by one by CUPTI, so the graphed frame is what is measured.

    PYTHONPATH=$PWD/out/devdeps:$PWD python3 bench/engine_profile.py \\
        --batches 1,64 --out out/engine_profile

Outputs ``<out>.json``: per B and mode, frame wall time, summed kernel time,
kernels per frame, and the family and top-name tables (ms per frame); under ``codec``
the same tables for Mimi's encode and decode alone (what of the frame is the codec's).
``--kv``, ``--weight-dtype`` and ``--codec-dtype`` are `duplex serve`'s choices.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from duplex_engine import (
    PRESET_MIMI,
    WEIGHT_SEED,
    OurEngine,
    as_served,
    build_lm_on_device,
    free_memory,
    import_ours,
    lm_dtype,
    log,
    machine_info,
    source_info,
    sync,
    test_pcm,
)

FAMILIES = (
    ("attention", ("attention", "fmha", "flash", "attn")),
    ("triton_fused", ("_rms_norm", "_rope", "_sample")),
    ("matmul", ("gemm", "gemv", "cutlass", "xmma", "cublas", "sm90", "splitk", "matmul")),
    ("topk_sort", ("topk", "sort", "radix", "select")),
    ("softmax", ("softmax",)),
    ("convolution", ("conv", "cudnn", "implicit", "winograd")),
    ("indexing", ("index", "scatter", "gather", "embedding")),
    ("reduction", ("reduce", "argmax", "max_", "sum_", "norm")),
    ("copy", ("copy", "memcpy", "memset", "fill", "cat")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "pointwise")),
)


def family(name: str) -> str:
    lowered = name.lower()
    for label, needles in FAMILIES:
        if any(needle in lowered for needle in needles):
            return label
    return "other"


def kernel_events(profiler: Any) -> list[tuple[str, float]]:
    """(name, microseconds) of every GPU kernel / memory op the profiler saw."""
    out = []
    for event in profiler.events():
        if str(getattr(event, "device_type", "")).endswith("CUDA"):
            duration = getattr(event, "device_time", None)
            if duration is None:
                duration = event.cuda_time
            out.append((event.name, float(duration)))
    return out


def tables(events: list[tuple[str, float]], frames: int) -> dict[str, Any]:
    """Kernel time per frame by family and the top kernels by name."""
    by_family: dict[str, float] = defaultdict(float)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, micros in events:
        by_family[family(name)] += micros
        entry = by_name[name]
        entry[0] += micros
        entry[1] += 1
    top = sorted(by_name.items(), key=lambda item: -item[1][0])[:40]
    return {
        "kernel_ms_per_frame": round(sum(by_family.values()) / 1e3 / frames, 3),
        "kernels_per_frame": round(len(events) / frames, 1),
        "families_ms_per_frame": {
            k: round(v / 1e3 / frames, 3) for k, v in sorted(by_family.items(), key=lambda i: -i[1])
        },
        "top_kernels": [
            {
                "name": name[:160],
                "family": family(name),
                "ms_per_frame": round(micros / 1e3 / frames, 4),
                "calls_per_frame": round(count / frames, 1),
            }
            for name, (micros, count) in top
        ],
    }


def profile_batch(
    ours: Any, engine: OurEngine, batch: int, mode: str, frames: int, device: torch.device
) -> dict[str, Any]:
    context = engine.config.context
    slots = list(range(batch))
    if mode == "staggered":
        starts = [int((i + 0.5) * context / batch) for i in range(batch)]
    else:
        starts = [context + i for i in range(batch)]
    for slot, frame in zip(slots, starts, strict=True):
        engine.start(slot, frame, ours.SlotSampling(seed=1000 + slot))
    pcm = test_pcm(3 + frames, batch, device)
    with torch.no_grad():
        for index in range(3):  # capture and warm the bucket's graphs
            engine.frame(slots, pcm[index])
        sync(device)
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        started = time.perf_counter()
        with torch.profiler.profile(activities=activities) as profiler:
            for index in range(frames):
                engine.frame(slots, pcm[3 + index])
            sync(device)
        wall_ms = (time.perf_counter() - started) * 1e3 / frames
    with torch.no_grad(), torch.profiler.profile(activities=activities) as codec_profiler:
        for index in range(frames):  # the codec alone: Mimi's share of the frame above
            codes = engine.streams.encode(slots, pcm[3 + index])
            engine.streams.decode(slots, codes, check_values=False)
        sync(device)
    return {
        "mode": mode,
        "batch": batch,
        "frames": frames,
        "wall_ms_per_frame_profiled": round(wall_ms, 3),
        **tables(kernel_events(profiler), frames),
        "codec": tables(kernel_events(codec_profiler), frames),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", default="moshi-7b", choices=sorted(PRESET_MIMI))
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--modes", default="staggered,full")
    parser.add_argument("--kv", default="bf16", choices=("bf16", "fp8", "int4"))
    parser.add_argument("--weight-dtype", default="auto", choices=("auto", "fp8"))
    parser.add_argument("--codec-dtype", default="float32", choices=("float32", "bf16"))
    parser.add_argument("--frames", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("out/engine_profile"))
    args = parser.parse_args(argv)
    batches = sorted({int(b) for b in args.batches.split(",") if b.strip()})
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    ours = import_ours()
    config = ours.moshi_preset(args.preset)
    mimi_config = ours.mimi_preset(PRESET_MIMI[args.preset])
    lm = build_lm_on_device(ours, config, device, lm_dtype(device), WEIGHT_SEED)
    mimi = ours.random_mimi(mimi_config, WEIGHT_SEED).to(device)
    as_served(ours, lm, mimi, args.weight_dtype, args.codec_dtype)
    kv_dtype = ours.KV_DTYPES["auto" if args.kv == "bf16" else args.kv]
    data: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine_info(device),
        "source": source_info(),
        "kv": args.kv,
        "weight_dtype": args.weight_dtype,
        "codec_dtype": args.codec_dtype,
        "results": [],
    }
    graphs = device.type == "cuda"
    engine = OurEngine(ours, lm, mimi, max(batches), kv_dtype=kv_dtype, cuda_graphs=graphs)
    data["mimi_ring_kernel"] = engine.streams.ring_kernel
    out = args.out.with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    for mode in modes:
        for batch in batches:
            log(f"profile {mode} B={batch}")
            try:
                result = profile_batch(ours, engine, batch, mode, args.frames, device)
            except Exception as error:  # keep the other rows
                result = {"mode": mode, "batch": batch, "error": f"{type(error).__name__}: {error}"}
            data["results"].append(result)
            log(json.dumps({k: v for k, v in result.items() if k not in ("top_kernels", "codec")}))
            if "codec" in result:
                log("  codec: " + json.dumps(result["codec"]["families_ms_per_frame"]))
            out.write_text(json.dumps(data, indent=2, default=str) + "\n")
            free_memory(device)
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
