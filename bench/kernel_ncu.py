"""The ring attention kernels, each launched once on one layer's rings, for Nsight Compute.

`bench/kernels.py` times the kernels; this gives a profiler one launch of each to read (its
warp stall reasons, instruction mix, memory throughput), after warm-up launches that compile
them. Run under ncu, which replays the launches it is told to keep:

    ncu --set full --import-source yes -k regex:'_ring_attention_(split|int4)' \\
        -o out/ring python3 bench/kernel_ncu.py --batch 128 --fill full \\
        --kernels fp8,int4,int4@512/64/4/dot/r96

Each kernel's launches: ``--warmup`` first (to skip with ``--launch-skip``), then one. The merge
kernel that follows each split kernel is named ``_ring_attention_merge`` (leave it out with
``-k regex:'_ring_attention_(split|int4)'``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from _tiling import int4_arguments  # noqa: E402
from kernels import CONTEXT, HEAD_DIM, HEADS  # noqa: E402

from duplex.kernels import ring_attention  # noqa: E402
from duplex.kernels.kv_int4 import quantize_int4, ring_attention_int4  # noqa: E402

_RINGS: dict[tuple[str, int], tuple[tuple[torch.Tensor, ...], ...]] = {}
"""The rings of the kernel now launched, stored in its format: one kernel's at a time."""


def launch(
    name: str,
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
) -> None:
    """One launch of ``name``'s kernel on these rings (stored in its format once)."""
    name, _, int4_tiling = name.partition("@")
    stored = _RINGS.get((name, id(keys)))
    if stored is None:
        if name == "int4":
            stored = (quantize_int4(keys), quantize_int4(values))
        elif name == "fp8":
            stored = (keys.to(torch.float8_e4m3fn), values.to(torch.float8_e4m3fn))
        else:
            raise SystemExit(f"unknown kernel {name!r}: fp8 or int4")
        _RINGS.clear()
        _RINGS[(name, id(keys))] = stored
    if name == "int4":
        kwargs = int4_arguments(int4_tiling) if int4_tiling else {}
        ring_attention_int4(q, *stored, lengths, **kwargs)
    else:
        ring_attention(q, *stored, lengths)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--fill", choices=("full", "staggered"), default="full")
    parser.add_argument(
        "--kernels",
        default="fp8,int4",
        help="which rings, in launch order: fp8, int4, or int4@TILING (as bench/kernels.py "
        "names them: split/block/warps[/dot][/sN][/rN][/kw])",
    )
    parser.add_argument("--warmup", type=int, default=0)
    args = parser.parse_args(argv)
    generator = torch.Generator(device="cuda").manual_seed(0)
    shape = (args.batch, HEADS, CONTEXT, HEAD_DIM)
    if args.fill == "full":
        fills = [CONTEXT] * args.batch
    else:
        fills = [int((i + 0.5) * CONTEXT / args.batch) + 1 for i in range(args.batch)]
    lengths = torch.tensor(fills, device="cuda")
    q = torch.randn(args.batch, HEADS, HEAD_DIM, generator=generator, device="cuda")
    q = q.to(torch.bfloat16)
    for name in args.kernels.split(","):
        keys = torch.randn(shape, generator=generator, device="cuda", dtype=torch.bfloat16)
        values = torch.randn(shape, generator=generator, device="cuda", dtype=torch.bfloat16)
        for _ in range(args.warmup + 1):
            launch(name, q, keys, values, lengths)
        torch.cuda.synchronize()
        print(f"{name}: {args.warmup + 1} launches, B={args.batch} {args.fill}", flush=True)
        del keys, values
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
