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

`add_rms_norm` is the same launch with a transformer's residual add in front
(``s = x + delta``, rounded to ``x``'s dtype as torch's add rounds, stored, then normed):
every residual add of the 7B's layers is followed by a norm, and the add alone was a launch
of its own (about 260 a frame with Mimi's, 0.9 ms at B=128 on an H100).
"""

from __future__ import annotations

import torch

from . import _triton

if _triton.available():
    import triton
    import triton.language as tl

    from ._rounding import bf16_nearest_even

__all__ = ["MAX_DIM", "add_rms_norm", "add_rms_norm_reference", "rms_norm", "rms_norm_reference"]

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


def add_rms_norm_reference(
    x: torch.Tensor, delta: torch.Tensor, alpha: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = x + delta`` and ``rms_norm_reference(s)``: a residual add and the next norm."""
    total = x + delta
    return total, rms_norm_reference(total, alpha, eps)


def rms_norm(x: torch.Tensor, alpha: torch.Tensor, eps: float) -> torch.Tensor:
    """`rms_norm_reference` as one Triton kernel (CUDA; interpreted for host tensors).

    Returns a fresh contiguous tensor of ``x``'s shape and dtype. Not differentiable.
    """
    return _launch(x, None, alpha, eps)[1]


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, alpha: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`add_rms_norm_reference` in one launch: ``(x + delta, its norm)``, both fresh and
    contiguous (``delta`` of ``x``'s shape and dtype: added in float32 and the sum rounded
    once, as torch adds two such tensors)."""
    if delta.shape != x.shape or delta.dtype != x.dtype:
        raise ValueError(
            f"add_rms_norm adds tensors of one shape and dtype: {tuple(x.shape)} {x.dtype} "
            f"+ {tuple(delta.shape)} {delta.dtype}"
        )
    total, out = _launch(x, delta, alpha, eps)
    assert total is not None
    return total, out


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``[rows, dim]`` with a contiguous last axis (a view where the leading axes
    flatten to one stride)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x.reshape(-1, x.shape[-1])


def _launch(
    x: torch.Tensor, delta: torch.Tensor | None, alpha: torch.Tensor, eps: float
) -> tuple[torch.Tensor | None, torch.Tensor]:
    dim = x.shape[-1]
    if dim > MAX_DIM:
        raise ValueError(f"rms_norm holds a row in registers: dim {dim} > {MAX_DIM}")
    rows = _rows(x)
    deltas = rows if delta is None else _rows(delta)  # not read without DELTA
    alpha = alpha.reshape(-1)
    if alpha.stride(0) != 1:
        alpha = alpha.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    total = None if delta is None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0] == 0:
        return total, out
    block = triton.next_power_of_2(dim)
    _rms_norm[(rows.shape[0],)](
        rows,
        deltas,
        alpha,
        out,
        out if total is None else total,  # not written without DELTA
        rows.stride(0),
        deltas.stride(0),
        dim,
        1.0 / dim,
        eps,
        BLOCK=block,
        DELTA=delta is not None,
        num_warps=8 if block >= 2048 else 4,
    )
    return total, out


if _triton.available():

    @triton.jit
    def _rms_norm(
        x_ptr,
        delta_ptr,
        alpha_ptr,
        out_ptr,
        total_ptr,
        stride_row,
        stride_delta,
        dim,
        inv_dim,
        eps,
        BLOCK: tl.constexpr,
        DELTA: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        inside = cols < dim
        x = tl.load(x_ptr + row * stride_row + cols, mask=inside, other=0.0)
        if DELTA:
            delta = tl.load(delta_ptr + row * stride_delta + cols, mask=inside, other=0.0)
            # torch's add: float32 math, one rounding to the stored dtype; the norm reads that
            x = x.to(tl.float32) + delta.to(tl.float32)
            if total_ptr.dtype.element_ty == tl.bfloat16:
                x = bf16_nearest_even(x)  # exact: the interpreter's cast truncates
            x = x.to(total_ptr.dtype.element_ty)
            tl.store(total_ptr + row * dim + cols, x, mask=inside)
        x = x.to(tl.float32)
        mean_square = tl.sum(x * x, axis=0) * inv_dim
        scale = tl.rsqrt(eps + mean_square)
        alpha = tl.load(alpha_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        y = x * (alpha * scale)
        if out_ptr.dtype.element_ty == tl.bfloat16:
            y = bf16_nearest_even(y)
        tl.store(out_ptr + row * dim + cols, y.to(out_ptr.dtype.element_ty), mask=inside)
