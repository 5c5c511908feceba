"""Rows to float8 e4m3 with a float32 scale a row, in one kernel.

`quantize_rows_e4m3_reference` is the torch form (the CPU path and the oracle): each row's
largest magnitude, floored at ``eps``, over 448 is its scale, and the row divided by it is
cast to e4m3 (round to nearest even). In torch that is about seven launches (an absolute
value, a max, a widening, a clamp, two divisions, the cast); an fp8 projection quantizes its
activations at every call, 128 calls a 7B step. `quantize_rows_e4m3` is the same arithmetic
in one Triton launch, bit for bit: one program holds a row (up to `MAX_DIM` values). Its
divisions are IEEE ones (``div_rn``), as torch's: Triton's ``/`` on float32 is the
approximate ``div.full``.
"""

from __future__ import annotations

import torch

from . import _triton

if _triton.available():
    import triton
    import triton.language as tl

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
    def _e4m3_nearest_even(x):
        """``x`` (``|x| <= 448``) rounded to the nearest e4m3 value, ties to even, as float32:
        the cast after it is then exact. Normal e4m3 values keep 3 of float32's 23 mantissa
        bits (the rounding done on the bits, whose carry reaches the exponent); below 2**-6
        e4m3 steps by 2**-9, which adding 1.5 * 2**14 leaves as float32's last bit. Why not
        the cast alone: Triton's interpreter rounds a value up into the next binade to half
        of it (-124.4 to -64), and the CPU tests must see the GPU's values."""
        bits = x.to(tl.int32, bitcast=True)
        kept = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000  # ~0xFFFFF
        normal = kept.to(tl.float32, bitcast=True)
        small = tl.abs((x + 24576.0) - 24576.0).to(tl.int32, bitcast=True)
        # x's sign put back on the bits (-0.0 where a negative value rounds to 0): compiled,
        # Triton's ``-small`` is ``0 - small``, which gives +0.0
        small = (small | (bits & -2147483648)).to(tl.float32, bitcast=True)
        return tl.where(tl.abs(x) < 0.015625, small, normal)

    @triton.jit
    def _quantize_rows_e4m3(
        x_ptr, values_ptr, scale_ptr, stride_row, dim, eps, MAX: tl.constexpr, BLOCK: tl.constexpr
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        inside = cols < dim
        x = tl.load(x_ptr + row * stride_row + cols, mask=inside, other=0.0).to(tl.float32)
        scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), axis=0), eps), MAX)
        tl.store(scale_ptr + row, scale)
        quantized = _e4m3_nearest_even(tl.math.div_rn(x, scale)).to(tl.float8e4nv)
        tl.store(values_ptr + row * dim + cols, quantized, mask=inside)
