"""The gated FFN's middle, ``silu(gate) * value``, in one launch, or quantized to e4m3 in it.

A gated FFN projects each row to ``[gate; value]`` (``2 * hidden`` wide) and multiplies the
SiLU of the gate by the value before its output projection. In torch that is two launches
(the SiLU, the product), and with fp8 weights a third (`fp8_rows.quantize_rows_e4m3` on the
product): 80 SiLUs and 80 products a 7B frame (32 temporal layers, 8 depth steps of 6), 0.6 ms
at B=128 on an H100. `silu_gate` is the first two in one launch, `silu_gate_e4m3` all three.

Bit for bit torch's: the SiLU in float32 (``x / (1 + exp(-x))``, an IEEE division, and on
the GPU libdevice's ``expf``, which is what torch's CUDA SiLU calls) rounded to the input's
dtype, then the product in float32 rounded again; the rounding is done on the bits
(`_rounding`), since the interpreter's cast to bfloat16 truncates. Host runs (the
interpreter) take numpy's ``exp``, as torch's CPU SiLU gives up to an ulp of float32 apart:
the CPU path of the model is `silu_gate_reference`. One program holds a row (``hidden`` up to
`MAX_DIM`), as the quantized form needs the row's largest magnitude.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _triton
from .fp8_rows import E4M3_MAX, quantize_rows_e4m3_reference

if _triton.available():
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    from ._rounding import bf16_nearest_even
    from .fp8_rows import e4m3_row

__all__ = [
    "MAX_DIM",
    "silu_gate",
    "silu_gate_e4m3",
    "silu_gate_e4m3_reference",
    "silu_gate_reference",
]

MAX_DIM = 16384
"""Widest ``hidden`` one program holds (the 7B's is 11264, its depth layers' 2816)."""


def silu_gate_reference(projected: torch.Tensor) -> torch.Tensor:
    """``[..., 2 * hidden]`` (gate, then value) -> ``silu(gate) * value`` ``[..., hidden]``."""
    gate, value = projected.unflatten(-1, (2, -1)).unbind(-2)
    return F.silu(gate) * value


def silu_gate_e4m3_reference(
    projected: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`silu_gate_reference` of ``[M, 2 * hidden]`` rows, quantized a row
    (`quantize_rows_e4m3_reference`): e4m3 ``[M, hidden]`` and float32 scales ``[M, 1]``."""
    return quantize_rows_e4m3_reference(silu_gate_reference(projected), eps)


def silu_gate(projected: torch.Tensor) -> torch.Tensor:
    """`silu_gate_reference` in one launch (CUDA; interpreted for host tensors): a fresh
    contiguous ``[..., hidden]`` in ``projected``'s dtype (bfloat16 or float32)."""
    rows, hidden = _rows(projected)
    out = torch.empty(*projected.shape[:-1], hidden, dtype=projected.dtype, device=rows.device)
    _launch(rows, hidden, out, out, out, 0.0, quantize=False)
    return out


def silu_gate_e4m3(projected: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`silu_gate_e4m3_reference` in one launch: ``[M, 2 * hidden]`` rows -> e4m3 values
    ``[M, hidden]`` and float32 scales ``[M, 1]`` (the product rounded to ``projected``'s
    dtype before it is quantized, as the two torch calls give)."""
    if projected.dim() != 2:
        raise ValueError("silu_gate_e4m3 takes [M, 2 * hidden] rows")
    rows, hidden = _rows(projected)
    values = torch.empty(rows.shape[0], hidden, dtype=torch.float8_e4m3fn, device=rows.device)
    scale = torch.empty(rows.shape[0], 1, dtype=torch.float32, device=rows.device)
    _launch(rows, hidden, projected, values, scale, eps, quantize=True)
    return values, scale


def _rows(projected: torch.Tensor) -> tuple[torch.Tensor, int]:
    width = projected.shape[-1]
    if width % 2:
        raise ValueError(f"silu_gate takes [gate; value] rows of an even width, not {width}")
    if width // 2 > MAX_DIM:
        raise ValueError(f"silu_gate holds a row in registers: {width // 2} > {MAX_DIM}")
    if projected.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"silu_gate takes bfloat16 or float32 rows, not {projected.dtype}")
    if projected.stride(-1) != 1:
        projected = projected.contiguous()
    return projected.reshape(-1, width), width // 2


def _launch(
    rows: torch.Tensor,
    hidden: int,
    out: torch.Tensor,
    values: torch.Tensor,
    scale: torch.Tensor,
    eps: float,
    *,
    quantize: bool,
) -> None:
    if rows.shape[0] == 0:
        return
    block = triton.next_power_of_2(hidden)
    _silu_gate[(rows.shape[0],)](
        rows,
        out,
        values,
        scale,
        rows.stride(0),
        hidden,
        eps,
        BLOCK=block,
        QUANTIZE=quantize,
        MAX=E4M3_MAX,
        BF16=rows.dtype == torch.bfloat16,
        LIBDEVICE=rows.is_cuda,
        num_warps=16 if block >= 8192 else 8 if block >= 2048 else 4,
    )


if _triton.available():

    @triton.jit
    def _silu_gate(
        x_ptr,
        out_ptr,
        values_ptr,
        scale_ptr,
        stride_row,
        hidden,
        eps,
        BLOCK: tl.constexpr,
        QUANTIZE: tl.constexpr,
        MAX: tl.constexpr,
        BF16: tl.constexpr,
        LIBDEVICE: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        inside = cols < hidden
        base = x_ptr + row * stride_row
        gate = tl.load(base + cols, mask=inside, other=0.0).to(tl.float32)
        value = tl.load(base + hidden + cols, mask=inside, other=0.0).to(tl.float32)
        # libdevice's expf, as torch's CUDA SiLU; the interpreter has only numpy's
        decay = libdevice.exp(-gate) if LIBDEVICE else tl.exp(-gate)
        silu = tl.math.div_rn(gate, 1.0 + decay)
        if BF16:
            silu = bf16_nearest_even(silu)
        product = silu * value
        if BF16:
            product = bf16_nearest_even(product)
        if QUANTIZE:
            quantized, scale = e4m3_row(product, eps, MAX)
            tl.store(scale_ptr + row, scale)
            tl.store(values_ptr + row * hidden + cols, quantized, mask=inside)
        else:
            product = product.to(out_ptr.dtype.element_ty)
            tl.store(out_ptr + row * hidden + cols, product, mask=inside)
