"""Rows to float8 e4m3 with a float32 scale a row, in one kernel.

`quantize_rows_e4m3_reference` is the torch form (the CPU path and the oracle): each row's
largest magnitude, floored at ``eps``, over 448 is its scale, and the row divided by it is
cast to e4m3 (round to nearest even). In torch that is about seven launches (an absolute
value, a max, a widening, a clamp, two divisions, the cast); an fp8 projection quantizes its
activations at every call, 128 calls a 7B step. `quantize_rows_e4m3` is the same arithmetic
in one Triton launch, bit for bit: one program holds a row (up to `MAX_DIM` values). Its
divisions are IEEE ones (``div_rn``), as torch's: Triton's ``/`` on float32 is the
approximate ``div.full``; its rounding is done on the bits (`_rounding`). `e4m3_row` is the
same arithmetic for kernels that quantize a row they compute.
"""

from __future__ import annotations

import torch

from . import _triton

if _triton.available():
    import triton
    import triton.language as tl

    from ._rounding import e4m3_nearest_even

__all__ = ["E4M3_MAX", "MAX_DIM", "quantize_rows_e4m3", "quantize_rows_e4m3_reference"]

E4M3_MAX = 448.0
"""The largest e4m3 value: each row's largest magnitude is scaled onto it."""
MAX_DIM = 16384
"""Widest row one program holds (the 7B's projections take rows of 4096 and 11264)."""


def quantize_rows_e4m3_reference(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``[M, K]`` -> e4m3 values ``[M, K]`` and float32 scales ``[M, 1]`` (value * scale)."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=eps) / E4M3_MAX
    return (x.float() / scale).to(torch.float8_e4m3fn), scale


def quantize_rows_e4m3(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_rows_e4m3_reference` in one launch (CUDA; interpreted for host tensors).
    ``x``'s last axis must be contiguous."""
    rows, dim = x.shape
    if dim > MAX_DIM:
        raise ValueError(f"quantize_rows_e4m3 holds a row in registers: {dim} > {MAX_DIM}")
    if x.stride(-1) != 1:
        raise ValueError("quantize_rows_e4m3 needs contiguous rows")
    values = torch.empty(rows, dim, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    if rows == 0:
        return values, scale
    block = triton.next_power_of_2(dim)
    _quantize_rows_e4m3[(rows,)](
        x,
        values,
        scale,
        x.stride(0),
        dim,
        eps,
        MAX=E4M3_MAX,
        BLOCK=block,
        num_warps=8 if block >= 2048 else 4,
    )
    return values, scale


if _triton.available():

    @triton.jit
    def e4m3_row(x, eps, MAX: tl.constexpr):
        """One row's float32 values (masked lanes 0) as e4m3 and its float32 scale: the
        arithmetic of `quantize_rows_e4m3_reference`, for kernels that quantize what they
        compute (`silu_gate`)."""
        scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), axis=0), eps), MAX)
        return e4m3_nearest_even(tl.math.div_rn(x, scale)).to(tl.float8e4nv), scale

    @triton.jit
    def _quantize_rows_e4m3(
        x_ptr, values_ptr, scale_ptr, stride_row, dim, eps, MAX: tl.constexpr, BLOCK: tl.constexpr
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        inside = cols < dim
        x = tl.load(x_ptr + row * stride_row + cols, mask=inside, other=0.0).to(tl.float32)
        quantized, scale = e4m3_row(x, eps, MAX)
        tl.store(scale_ptr + row, scale)
        tl.store(values_ptr + row * dim + cols, quantized, mask=inside)
