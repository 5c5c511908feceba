"""Ring decode attention on one GPU: our Triton kernel against masked SDPA over the whole ring.

One layer of the 7B temporal transformer (32 heads of 128, a 3000-row ring),
B rows, fills either spread over the ring (``staggered``: row i at
``(i + 0.5) * 3000 / B`` rows, as sessions at different offsets) or all full.
For each case it times (CUDA events, median of ``--reps`` calls after warm-up):

- ``sdpa``: what the static step ran before the kernel, ``scaled_dot_product_attention``
  over each row's whole ring view with a boolean fill mask (bf16 only; an fp8
  ring first needs a bf16 copy, which is timed too);
- ``kernel``: `duplex.kernels.ring_attention` with each tiling of ``--sweep``
  (split rows / block rows / warps), checked against the torch reference;
- ``int4``: the same rings stored in 4 bits (`duplex.kernels.kv_int4`), read by
  ``ring_attention_int4`` at each tiling of ``--int4-sweep``, checked against the reference on
  the dequantized bf16 rows it stands for (``int4_max_err``: the kernel's own error).

Effective bandwidth is the bytes of *filled* keys and values divided by the time. The
card's own bandwidth is measured in the same run (``hbm``): a read-only reduction
(``torch.sum`` over 4 GiB, far past the L2) and a device-to-device copy (its read and its
write counted); the bytes floor of a step is its bytes at ``hbm.read_gbps``.

    PYTHONPATH=$PWD python3 bench/kernels.py --out out/kernels
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _source import source_info
from _tiling import int4_arguments, tiling

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from duplex.kernels import ring_attention, ring_attention_reference  # noqa: E402
from duplex.kernels.kv_int4 import (  # noqa: E402
    int4_row_bytes,
    quantize_int4,
    ring_attention_int4,
    ring_attention_int4_reference,
)

HEADS, HEAD_DIM, CONTEXT = 32, 128, 3000


def timed(fn: Any, reps: int) -> float:
    """Median microseconds of ``fn()`` over ``reps`` calls (after 3 warm-up calls)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def hbm_bandwidth(reps: int, gib: int = 4) -> dict[str, float]:
    """GB/s the card reads (a sum: what attention and the weight reads do) and copies."""
    x = torch.empty(gib << 29, dtype=torch.bfloat16, device="cuda").fill_(1.0)
    y = torch.empty_like(x)
    nbytes = x.numel() * x.element_size()
    read = timed(lambda: torch.sum(x, dtype=torch.float32), reps)
    copy = timed(lambda: y.copy_(x), reps)
    return {
        "bytes": nbytes,
        "read_gbps": round(nbytes / read / 1e3, 1),
        "copy_gbps": round(2 * nbytes / copy / 1e3, 1),
    }


def sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor):
    mask = (torch.arange(keys.shape[2], device=q.device)[None, :] < lengths[:, None])[
        :, None, None, :
    ]
    k, v = keys.to(q.dtype), values.to(q.dtype)
    return F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask)[:, :, 0]


def measure(
    dtype: torch.dtype,
    batch: int,
    fill: str,
    tilings: list[str],
    reps: int,
    generator: torch.Generator,
    int4_tilings: list[str],
) -> dict[str, Any]:
    """One case: SDPA and every tiling of the kernel on the same rings."""
    device = generator.device
    shape = (batch, HEADS, CONTEXT, HEAD_DIM)
    keys = torch.randn(shape, generator=generator, device=device).to(dtype)
    values = torch.randn(shape, generator=generator, device=device).to(dtype)
    q = torch.randn(batch, HEADS, HEAD_DIM, generator=generator, device=device)
    q = q.to(torch.bfloat16)
    if fill == "staggered":
        fills = [int((i + 0.5) * CONTEXT / batch) + 1 for i in range(batch)]
    else:
        fills = [CONTEXT] * batch
    lengths = torch.tensor(fills, device=device)
    filled_bytes = sum(fills) * HEADS * HEAD_DIM * keys.element_size() * 2
    want = ring_attention_reference(q, keys, values, lengths).float()
    row: dict[str, Any] = {
        "dtype": str(dtype).removeprefix("torch."),
        "batch": batch,
        "fill": fill,
        "filled_gb": round(filled_bytes / 1e9, 3),
        "sdpa_us": round(timed(lambda: sdpa(q, keys, values, lengths), reps), 1),
    }
    for name in tilings:
        kwargs = tiling(name)
        got = ring_attention(q, keys, values, lengths, **kwargs).float()
        micros = timed(lambda t=kwargs: ring_attention(q, keys, values, lengths, **t), reps)
        row[f"kernel_{name}_us"] = round(micros, 1)
        row[f"kernel_{name}_gbps"] = round(filled_bytes / micros / 1e3, 1)
        row[f"kernel_{name}_max_err"] = round(float((got - want).abs().max()), 5)
    if dtype == torch.bfloat16:
        row.update(measure_int4(q, keys, values, lengths, fills, reps, int4_tilings))
    return row


def measure_int4(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    fills: list[int],
    reps: int,
    tilings: list[str],
) -> dict[str, Any]:
    """The int4 ring of the same keys and values: time and bandwidth of its kernel, for
    each tiling (named as `tiling` reads them)."""
    keys4, values4 = quantize_int4(keys), quantize_int4(values)
    want = ring_attention_int4_reference(q, keys4, values4, lengths).float()
    filled_bytes = sum(fills) * HEADS * int4_row_bytes(HEAD_DIM) * 2
    row: dict[str, Any] = {"int4_filled_gb": round(filled_bytes / 1e9, 3)}
    for name in tilings:
        kwargs = int4_arguments(name)
        got = ring_attention_int4(q, keys4, values4, lengths, **kwargs).float()
        micros = timed(lambda t=kwargs: ring_attention_int4(q, keys4, values4, lengths, **t), reps)
        row[f"int4_{name}_us"] = round(micros, 1)
        row[f"int4_{name}_gbps"] = round(filled_bytes / micros / 1e3, 1)
        row[f"int4_{name}_max_err"] = round(float((got - want).abs().max()), 5)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16,64,128")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument(
        "--sweep",
        default="512/64/2/dot,512/64/4/dot,1024/64/2/dot,512/32/2/dot",
        help="split_rows/block_rows/num_warps[/dot] tilings to time (dot: tensor cores)",
    )
    parser.add_argument(
        "--int4-sweep",
        default="1024/128/4/dot/r128/kw,512/64/4/dot/r96,1024/128/4/dot/r0/kw",
        help="split_rows/block_rows/num_warps[/dot][/sN][/rN][/kw] tilings of the int4 "
        "kernel (on the bf16 cases' rings; dot: tensor cores, sN: N stages, rN: at most N "
        "registers (r0: uncapped), kw: keys read as words; a switch not named is off)",
    )
    parser.add_argument("--out", type=Path, default=Path("out/kernels"))
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    tilings, int4_tilings = args.sweep.split(","), args.int4_sweep.split(",")
    generator = torch.Generator(device="cuda").manual_seed(0)
    hbm = hbm_bandwidth(args.reps)
    torch.cuda.empty_cache()  # its 8 GiB
    print(json.dumps({"hbm": hbm}), flush=True)
    rows = []
    for dtype, batch, fill in itertools.product(
        (torch.bfloat16, torch.float8_e4m3fn), batches, ("staggered", "full")
    ):
        rows.append(measure(dtype, batch, fill, tilings, args.reps, generator, int4_tilings))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    out = args.out.with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "command": " ".join(["python3", *sys.argv]),
        "device": torch.cuda.get_device_name(),
        "source": source_info(),
        "hbm": hbm,
    }
    out.write_text(json.dumps({**document, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
