"""The 7B step's projections alone: how near their weight bytes' floor each runs, by form.

At B=128 the temporal transformer's 128 fp8 projections a frame took 3.5 ms on an H100 for
6.6 GB of weights (2.1 ms at the card's read), and cuBLAS ran all four shapes on 128 x 128
tiles: an output of 4096 columns is then 32 tiles for 132 SMs. This times each shape of the
7B's projections the way the step runs them (a CUDA graph of one call a layer, each layer its
own weights, so nothing is read from L2), in the forms a change could take:

- ``rows``: ``torch._scaled_mm(x8, w8.T)`` with a scale a row of each (the step's form);
- ``swapped``: the transposed product ``w8 @ x8.T`` (the weight rows as the tiles' long side;
  the output comes transposed);
- ``bf16``: ``F.linear`` on bf16 weights (the depth transformer's form, and the reference);
- with ``--inductor``, ``inductor`` and ``inductor_triton``: the step's product compiled by
  ``torch.compile(mode="max-autotune-no-cudagraphs")``, which times cuBLAS against Triton's
  templates (persistent TMA ones on Hopper) for the shape and keeps the fastest, and the same
  with Triton's templates alone: would a Triton GEMM tuned for these skinny shapes beat cuBLAS?
  Its autotuning table goes to stderr;
- with ``--triton``, ``triton_BMxBNxBK_wW_sS``: a plain Triton kernel (this file's
  `_rows_mm`) at each tiling of `TILINGS` that fits the batch: the activations' whole batch
  as one tile where it fits (so each weight tile is read by one program, and the
  activations from L2 once a column tile), the weights' rows in ``BN``-row tiles. Its result
  is checked against ``rows`` (``triton_max_rel``).

(A Triton split-K form, narrow output tiles and K split over more programs, was timed here at
commit ``9285357`` and deleted after: at best 0.90-0.94x cuBLAS on the 4096-column outputs at
B=128 and slower everywhere else; docs/benchmarks.md.)

For each: microseconds a call, the weights' GB/s, and the ratio to the card's read (``hbm``,
measured in the same run). The depth transformer's shapes are timed in bf16 and fp8 (it is
bf16 today: would fp8 pay there?).

    python3 bench/fp8_gemm.py --batches 128 --out out/fp8-gemm
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _source import source_info
from kernels import hbm_bandwidth

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from duplex.models.moshi._fp8 import quantize_rows  # noqa: E402

# (name, out features N, in features K, calls a frame): the 7B's projections
TEMPORAL = (("qkv", 12288, 4096, 32), ("out", 4096, 4096, 32), ("ffn_in", 22528, 4096, 32))
TEMPORAL += (("ffn_out", 4096, 11264, 32),)
DEPTH = (("depth_in", 1024, 4096, 8), ("depth_qkv", 3072, 1024, 48), ("depth_out", 1024, 1024, 48))
DEPTH += (("depth_ffn_in", 5632, 1024, 48), ("depth_ffn_out", 1024, 2816, 48))


def graphed(calls: list[Any], reps: int) -> float:
    """Median microseconds a call of ``calls`` captured in one CUDA graph, replayed."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    times = []
    for _ in range(reps + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return sorted(times[2:])[reps // 2]


TILINGS = (
    (256, 128, 128, 8, 3), (256, 64, 128, 8, 4), (256, 64, 128, 4, 4), (256, 32, 128, 4, 4),
    (128, 128, 128, 8, 4), (128, 64, 128, 4, 4), (128, 32, 128, 4, 5), (128, 64, 256, 4, 3),
    (64, 64, 128, 4, 4),
)  # fmt: skip
"""(BM, BN, BK, warps, stages) of the Triton form; a BM above the batch is skipped."""

if torch.cuda.is_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _rows_mm(x_ptr, w_ptr, xs_ptr, ws_ptr, out_ptr, M, N, K, stride_x, stride_w,
                 stride_out, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
        """One ``[BM, BN]`` tile of ``(x * xs) @ (w * ws).T``: the weight tile is read K-major
        (as fp8 tensor cores take it), the scales applied once at the end."""
        m = tl.program_id(1) * BM + tl.arange(0, BM)
        n = tl.program_id(0) * BN + tl.arange(0, BN)
        k = tl.arange(0, BK)
        x_tile = x_ptr + m[:, None] * stride_x + k[None, :]
        w_tile = w_ptr + n[None, :] * stride_w + k[:, None]
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for _ in range(0, K, BK):
            a = tl.load(x_tile, mask=m[:, None] < M, other=0.0)
            b = tl.load(w_tile, mask=n[None, :] < N, other=0.0)
            acc = tl.dot(a, b, acc)
            x_tile += BK
            w_tile += BK
        xs = tl.load(xs_ptr + m, mask=m < M, other=0.0)
        ws = tl.load(ws_ptr + n, mask=n < N, other=0.0)
        out = acc * xs[:, None] * ws[None, :]
        mask = (m[:, None] < M) & (n[None, :] < N)
        tl.store(out_ptr + m[:, None] * stride_out + n[None, :], out.to(tl.bfloat16), mask=mask)


def rows_mm(x8: torch.Tensor, xs: torch.Tensor, w8: torch.Tensor, ws: torch.Tensor,
            tiling: tuple[int, ...]) -> torch.Tensor:  # fmt: skip
    """`_rows_mm` over the whole product (``xs`` ``[M, 1]``, ``ws`` ``[N]``)."""
    bm, bn, bk, warps, stages = tiling
    (m, k), n = x8.shape, w8.shape[0]
    out = torch.empty(m, n, device=x8.device, dtype=torch.bfloat16)
    grid = (triton.cdiv(n, bn), triton.cdiv(m, bm))
    _rows_mm[grid](x8, w8, xs, ws, out, m, n, k, x8.stride(0), w8.stride(0), out.stride(0),
                   BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages)  # fmt: skip
    return out


def _scaled(x8: torch.Tensor, w8: torch.Tensor, xs: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    return torch._scaled_mm(x8, w8.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)


def compiled(backends: str) -> Any:
    """The step's product compiled with max-autotune over ``backends`` (ATEN: cuBLAS)."""
    import torch._inductor.config as inductor_config

    function = torch.compile(_scaled, mode="max-autotune-no-cudagraphs", dynamic=False)

    def call(*args: torch.Tensor) -> torch.Tensor:
        with inductor_config.patch(max_autotune_gemm_backends=backends):
            return function(*args)

    return call


def measure(
    name: str,
    n: int,
    k: int,
    layers: int,
    batch: int,
    reps: int,
    inductor: bool = False,
    triton_forms: bool = False,
) -> dict[str, Any]:
    generator = torch.Generator(device="cuda").manual_seed(n + k)
    x = torch.randn(batch, k, generator=generator, device="cuda").to(torch.bfloat16)
    x8, x_scale = quantize_rows(x.float())
    x8, x_scale = x8.contiguous(), x_scale[:, None].contiguous()
    weights = [torch.randn(n, k, generator=generator, device="cuda") for _ in range(layers)]
    fp8 = [quantize_rows(w) for w in weights]
    bf16 = [w.to(torch.bfloat16) for w in weights]
    del weights
    forms = {
        "rows": [
            lambda w=w, s=s: torch._scaled_mm(
                x8, w.t(), scale_a=x_scale, scale_b=s[None, :], out_dtype=torch.bfloat16
            )
            for w, s in fp8
        ],
        "swapped": [
            lambda w=w, s=s: torch._scaled_mm(
                w, x8.t(), scale_a=s[:, None], scale_b=x_scale.t(), out_dtype=torch.bfloat16
            )
            for w, s in fp8
        ],
        "bf16": [lambda w=w: F.linear(x, w) for w in bf16],
    }
    if triton_forms:
        want = _scaled(x8, fp8[0][0], x_scale, fp8[0][1][None, :]).float()
        worst = 0.0
        for tiling in TILINGS:
            if tiling[0] > max(batch, 64) or k % tiling[2]:
                continue
            try:
                got = rows_mm(x8, x_scale, fp8[0][0], fp8[0][1], tiling).float()
            except Exception:  # a tiling past the card's shared memory
                continue
            worst = max(worst, float((got - want).abs().max() / want.abs().max()))
            label = "triton_{}x{}x{}_w{}_s{}".format(*tiling)
            forms[label] = [
                lambda w=w, s=s, t=tiling: rows_mm(x8, x_scale, w, s, t) for w, s in fp8
            ]
    if inductor:
        for form, backends in (("inductor", "ATEN,TRITON"), ("inductor_triton", "TRITON")):
            call = compiled(backends)
            forms[form] = [
                lambda w=w, s=s, call=call: call(x8, w, x_scale, s[None, :]) for w, s in fp8
            ]
    row: dict[str, Any] = {"name": name, "batch": batch, "n": n, "k": k, "layers": layers}
    if triton_forms:
        row["triton_max_rel"] = round(worst, 5)
    for form, calls in forms.items():
        try:
            us = graphed(calls, reps)
        except Exception as exc:  # a form cuBLAS (or inductor) refuses for this shape
            row[f"{form}_error"] = str(exc).splitlines()[0][:200]
            continue
        weight_bytes = n * k * (2 if form == "bf16" else 1)
        row[f"{form}_us"] = round(us, 2)
        row[f"{form}_gbps"] = round(weight_bytes / us / 1e3, 1)
    times = {
        key: value
        for key, value in row.items()
        if key.startswith("triton_") and key.endswith("_us")
    }
    if times:
        best = min(times, key=times.__getitem__)
        row["triton_best"] = best[: -len("_us")]
        row["triton_best_over_rows"] = round(times[best] / row["rows_us"], 3)
    del fp8, bf16
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="128")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--inductor", action="store_true", help="add the compiled forms")
    parser.add_argument("--temporal", action="store_true", help="the temporal shapes only")
    parser.add_argument("--triton", action="store_true", help="add the Triton tilings")
    parser.add_argument("--out", type=Path, default=Path("out/fp8-gemm"))
    args = parser.parse_args(argv)
    hbm = hbm_bandwidth(args.reps)
    torch.cuda.empty_cache()
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        for name, n, k, calls in TEMPORAL + (() if args.temporal else DEPTH):
            row = measure(name, n, k, calls, batch, args.reps, args.inductor, args.triton)
            for key in [key for key in row if key.endswith("_gbps")]:
                row[key.replace("_gbps", "_of_read")] = round(row[key] / hbm["read_gbps"], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    document = {
        "command": " ".join(["python3", *sys.argv]),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "source": source_info(),
        "hbm": hbm,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
