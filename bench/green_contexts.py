"""Can this stack run a batch pipeline's kernels on a CUDA green context (a subset of SMs)?

A green context would keep some SMs free of batch blocks for realtime steps' kernels (stream
priorities order the dispatch of waiting blocks; they do not free an SM a running block
holds). This probes, each variant in its own process (a CUDA error is sticky), whether an
elementwise kernel, a convolution (cuDNN), a matmul (cuBLAS) and graph replays run on a
green context's stream, and how long each takes there against the whole device:

    python3 bench/green_contexts.py [--sms 32] [--out bench/results/green-contexts-h200.json]

``how``: ``stream`` launches on ``GreenContext.Stream()`` with the primary context current;
``current`` makes the green context current first (``set_context``) and launches on its
stream; a ``-graph`` suffix captures the op on an ordinary stream and replays it there,
``-graph-here`` captures it on the green context's stream.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

VARIANT = r"""
import sys, time, torch
from torch.cuda import green_contexts
sms, op_name, how = int(sys.argv[1]), sys.argv[2], sys.argv[3]
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
x = torch.randn(64, 256, 64, 64, device="cuda", dtype=torch.float16)
conv = torch.nn.Conv2d(256, 256, 3, padding=1).cuda().half()
ops = {"add": lambda: a.mul_(1.0001).add_(0.0001), "conv": lambda: conv(x), "matmul": lambda: a @ a}
op = fn = ops[op_name]


def captured(on):
    side = torch.cuda.Stream() if on is None else on
    with torch.no_grad(), torch.cuda.stream(side):
        op(); op()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph, stream=on):
        op()
    return graph.replay


if how.endswith("-graph"):
    fn = captured(None)
if sms:
    context = green_contexts.GreenContext.create(num_sms=sms, device_id=0)
    if how.startswith("current"):
        context.set_context()
    stream = context.Stream()
else:
    stream = torch.cuda.Stream()
if how.endswith("-graph-here"):
    fn = captured(stream)
with torch.no_grad(), torch.cuda.stream(stream):
    for _ in range(3):
        fn()
    stream.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        fn()
    stream.synchronize()
print((time.perf_counter() - start) / 10 * 1000)
"""


HOWS = (
    "stream",
    "current",
    "stream-graph",
    "current-graph",
    "stream-graph-here",
    "current-graph-here",
)


def _variant(sms: int, op: str, how: str) -> dict[str, Any]:
    run = subprocess.run(
        [sys.executable, "-c", VARIANT, str(sms), op, how],
        capture_output=True,
        text=True,
        timeout=120,
    )
    row: dict[str, Any] = {"sms": sms, "op": op, "how": how}
    if run.returncode == 0:
        row["ms"] = round(float(run.stdout.strip().splitlines()[-1]), 3)
    else:
        lines = run.stderr.strip().splitlines() or [f"exit {run.returncode}"]
        row["error"] = lines[-1][:200]
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sms", type=int, default=32, help="the green context's SMs")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    import torch
    from torch.cuda import green_contexts

    report: dict[str, Any] = {
        "command": "python3 bench/green_contexts.py " + " ".join(sys.argv[1:]),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
        "device_sms": torch.cuda.get_device_properties(0).multi_processor_count,
        "green_contexts_built_in": green_contexts.SUPPORTED,
        "rows": [],
    }
    for op in ("conv", "matmul"):
        report["rows"].append(_variant(0, op, "stream"))
        for how in HOWS:
            report["rows"].append(_variant(args.sms, op, how))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
