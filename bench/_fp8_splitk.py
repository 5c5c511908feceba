"""An fp8 projection for skinny batches that splits K over more programs (an experiment).

``torch._scaled_mm`` runs the 7B's projections at B=128 on 128 x 128 tiles: an output of
4096 columns is 32 tiles for 132 SMs, 0.40-0.50 of the card's read (docs/benchmarks.md,
"Fewer launches a step, measured"). This kernel tiles the output ``BLOCK_M x BLOCK_N``
(narrow N tiles) and splits K into ``splits`` ranges, each its own program; with more than
one split each program writes its float32 partial and a second launch sums them in split
order (deterministic) and casts. Row scales of both operands are applied to the partials.
Timed against cuBLAS by `bench/fp8_gemm.py` (the ``splitk`` forms); not used by the engine
unless it wins there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def fp8_splitk(
    x8: torch.Tensor,
    x_scale: torch.Tensor,
    w8: torch.Tensor,
    w_scale: torch.Tensor,
    *,
    splits: int,
    block_m: int = 64,
    block_n: int = 64,
    block_k: int = 128,
    num_warps: int = 4,
    num_stages: int = 4,
) -> torch.Tensor:
    """``(x8 * x_scale) @ (w8 * w_scale).T`` in bf16: ``x8`` ``[M, K]``, ``x_scale`` ``[M, 1]``,
    ``w8`` ``[N, K]``, ``w_scale`` ``[N]``."""
    m, k = x8.shape
    n = w8.shape[0]
    per_split = triton.cdiv(triton.cdiv(k, splits), block_k) * block_k
    splits = triton.cdiv(k, per_split)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=x8.device)
    partial = torch.empty(splits if splits > 1 else 0, m, n, dtype=torch.float32, device=x8.device)
    grid = (triton.cdiv(n, block_n), splits, triton.cdiv(m, block_m))
    _splitk[grid](
        x8, w8, x_scale, w_scale, out, partial,
        m, n, k, x8.stride(0), w8.stride(0), per_split,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DIRECT=splits == 1,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if splits > 1:
        block = 1024
        _sum_splits[(triton.cdiv(m * n, block),)](partial, out, m * n, splits, BLOCK=block)
    return out


@triton.jit
def _splitk(
    x_ptr, w_ptr, xs_ptr, ws_ptr, out_ptr, part_ptr,
    M, N, K, stride_x, stride_w, per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DIRECT: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    start = pid_s * per_split
    stop = tl.minimum(start + per_split, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(start, stop, BLOCK_K):
        cols = k + rk
        a = tl.load(
            x_ptr + rm[:, None] * stride_x + cols[None, :],
            mask=(rm[:, None] < M) & (cols[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            w_ptr + rn[None, :] * stride_w + cols[:, None],
            mask=(rn[None, :] < N) & (cols[:, None] < K),
            other=0.0,
        )
        acc = tl.dot(a, b, acc)
    xs = tl.load(xs_ptr + rm, mask=rm < M, other=0.0)
    ws = tl.load(ws_ptr + rn, mask=rn < N, other=0.0)
    acc = acc * xs[:, None] * ws[None, :]
    inside = (rm[:, None] < M) & (rn[None, :] < N)
    if DIRECT:
        tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16), mask=inside)
    else:
        part = part_ptr + pid_s * M * N + rm[:, None] * N + rn[None, :]
        tl.store(part, acc, mask=inside)


@triton.jit
def _sum_splits(part_ptr, out_ptr, size, splits, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < size
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, splits):
        total += tl.load(part_ptr + s * size + offs, mask=inside, other=0.0)
    tl.store(out_ptr + offs, total.to(tl.bfloat16), mask=inside)
