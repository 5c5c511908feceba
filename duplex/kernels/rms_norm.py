"""RMSNorm over the last axis in one kernel (float32 math, result in the input's dtype).

`rms_norm_reference` is the torch oracle and the CPU path: the formula of the
reference checkpoint's ``rms_norm_f32``, ``x * (alpha * rsqrt(eps + mean(x^2)))``
computed in float32 and cast back. As plain torch it is about eight kernels a
call (copy, pow, mean, add, rsqrt, alpha cast, two muls, cast back).

`rms_norm` is the Triton kernel: one program per row holds the whole row in
registers (rows up to `MAX_DIM` wide), reduces the sum of squares and writes
the scaled row, so one launch per call. Leading axes may be strided as long
as they flatten to one row stride; the last axis must be contiguous (it is
made so otherwise). The grid depends on shapes only: no host sync, and a CUDA
graph can capture it.
"""

from __future__ import annotations

import torch

from . import _triton

if _triton.available():
    import triton
    import triton.language as tl

__all__ = ["MAX_DIM", "rms_norm", "rms_norm_reference"]

MAX_DIM = 16384
"""Widest row one program holds in registers (the 7B's rows are 4096)."""


def rms_norm_reference(x: torch.Tensor, alpha: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * (alpha * rsqrt(eps + mean(x^2, -1)))`` in float32, cast back to ``x``'s dtype.

    Args:
        x: ``[..., dim]``, any float dtype.
        alpha: ``dim`` gains in any shape (the checkpoint's ``[1, 1, dim]``).
        eps: added to the mean square.
    """
    xf = x.float()
    scale = torch.rsqrt(eps + xf.pow(2).mean(dim=-1, keepdim=True))
    return (xf * (alpha.reshape(-1).float() * scale)).to(x.dtype)


def rms_norm(x: torch.Tensor, alpha: torch.Tensor, eps: float) -> torch.Tensor:
    """`rms_norm_reference` as one Triton kernel (CUDA; interpreted for host tensors).

    Returns a fresh contiguous tensor of ``x``'s shape and dtype. Not differentiable.
    """
    dim = x.shape[-1]
    if dim > MAX_DIM:
        raise ValueError(f"rms_norm holds a row in registers: dim {dim} > {MAX_DIM}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows = x.reshape(-1, dim)  # a view whenever the leading axes flatten to one stride
    alpha = alpha.reshape(-1)
    if alpha.stride(0) != 1:
        alpha = alpha.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0] == 0:
        return out
    block = triton.next_power_of_2(dim)
    _rms_norm[(rows.shape[0],)](
        rows,
        alpha,
        out,
        rows.stride(0),
        dim,
        1.0 / dim,
        eps,
        BLOCK=block,
        num_warps=8 if block >= 2048 else 4,
    )
    return out


if _triton.available():

    @triton.jit
    def _rms_norm(
        x_ptr,
        alpha_ptr,
        out_ptr,
        stride_row,
        dim,
        inv_dim,
        eps,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        inside = cols < dim
        x = tl.load(x_ptr + row * stride_row + cols, mask=inside, other=0.0).to(tl.float32)
        mean_square = tl.sum(x * x, axis=0) * inv_dim
        scale = tl.rsqrt(eps + mean_square)
        alpha = tl.load(alpha_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        y = x * (alpha * scale)
        tl.store(out_ptr + row * dim + cols, y.to(out_ptr.dtype.element_ty), mask=inside)
