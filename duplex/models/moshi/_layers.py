"""Building blocks shared by the temporal and depth transformers (math only).

Module and parameter names mirror the reference checkpoint so that
``state_dict()`` keys are the official tensor names: ``norm1.alpha``,
``self_attn.in_proj_weight`` / ``self_attn.out_proj.weight`` (stacked per depth
step), ``gating.linear_in.weight`` / ``gating.linear_out.weight``. After `to_fp8` a
block's linear weights are `Fp8Linear` buffers instead (``weight_dtype = "fp8"``).
"""

from __future__ import annotations

from typing import final

import torch
import torch.nn.functional as F
from torch import nn

from duplex.kernels import rms_norm, rms_norm_reference, rope, rope_reference, triton_available
from duplex.kernels.rms_norm import MAX_DIM as RMS_NORM_MAX_DIM
from duplex.kernels.rms_norm import add_rms_norm, add_rms_norm_reference
from duplex.kernels.rope import rope_supports
from duplex.kernels.silu_gate import MAX_DIM as SILU_GATE_MAX_DIM
from duplex.kernels.silu_gate import silu_gate, silu_gate_e4m3, silu_gate_reference

from ._fp8 import FP8_EPS, Fp8Linear

__all__ = ["Attention", "GatedFFN", "RMSNorm", "apply_rope", "embed"]


def embed(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Embedding lookup where id ``-1`` (the reference's zero token) gives a zero vector."""
    out = F.embedding(ids.clamp_min(0), table)
    # masked_fill with a Python scalar: a CPU 0-dim tensor here would be a host copy,
    # which a CUDA graph capture refuses
    return out.masked_fill((ids == -1)[..., None], 0.0)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, max_period: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Interleaved rotary embedding, computed in float32 like the reference.

    On CUDA with Triton this is one kernel for q and k (`duplex.kernels.rope`);
    elsewhere, or when autograd needs the graph, the torch reference (`rope_reference`).

    Args:
        q, k: ``[..., T, H, D]`` with time on axis -3 (``T`` may be absent: ``[B, H, D]``).
        positions: absolute frame index, broadcastable to the leading ``[..., T]`` axes.
        max_period: rotation base.
    """
    if (
        q.is_cuda
        and triton_available()
        and not _needs_grad(q, k)
        and rope_supports(q, k, positions)
    ):
        return rope(q, k, positions, max_period)
    return rope_reference(q, k, positions, max_period)


def _needs_grad(*tensors: torch.Tensor) -> bool:
    """Autograd would record these ops (the Triton kernels have no backward)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


@final
class RMSNorm(nn.Module):
    """RMSNorm in float32 with a ``[1, 1, dim]`` gain named ``alpha`` (reference layout)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One Triton kernel on CUDA (`duplex.kernels.rms_norm`), else the torch reference."""
        if self._kernel(x):
            return rms_norm(x, self.alpha, self.eps)
        return rms_norm_reference(x, self.alpha, self.eps)

    def residual(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x + delta, norm(x + delta))``: a residual add and the norm after it, one launch on
        CUDA (`duplex.kernels.rms_norm.add_rms_norm`, the same bits as the two calls)."""
        if self._kernel(x) and delta.dtype == x.dtype and delta.shape == x.shape:
            return add_rms_norm(x, delta, self.alpha, self.eps)
        return add_rms_norm_reference(x, delta, self.alpha, self.eps)

    def _kernel(self, x: torch.Tensor) -> bool:
        return (
            x.is_cuda
            and triton_available()
            and x.shape[-1] <= RMS_NORM_MAX_DIM
            and not _needs_grad(x, self.alpha)
        )


@final
class GatedFFN(nn.Module):
    """``linear_out(silu(a) * b)`` with ``[a; b] = linear_in(x)``."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.linear_in = nn.Linear(dim, 2 * hidden, bias=False)
        self.linear_out = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """On CUDA the SiLU and the product are one launch (`duplex.kernels.silu_gate`), and
        with an fp8 ``linear_out`` the quantization of its input too; the same bits."""
        projected = self.linear_in(x)
        fused = (
            projected.is_cuda
            and triton_available()
            and projected.dtype in (torch.bfloat16, torch.float32)
            and projected.shape[-1] // 2 <= SILU_GATE_MAX_DIM
            and not _needs_grad(projected)
        )
        if not fused:
            return self.linear_out(silu_gate_reference(projected))
        if isinstance(self.linear_out, Fp8Linear):
            rows = projected.reshape(-1, projected.shape[-1])
            values, scale = silu_gate_e4m3(rows, FP8_EPS)
            out = self.linear_out.quantized(values, scale, projected.dtype)
            return out.reshape(*projected.shape[:-1], out.shape[-1])
        return self.linear_out(silu_gate(projected))

    def to_fp8(self) -> None:
        """Store both weights as `Fp8Linear` (the originals are dropped)."""
        self.linear_in = Fp8Linear(self.linear_in.weight)  # type: ignore[assignment]
        self.linear_out = Fp8Linear(self.linear_out.weight)  # type: ignore[assignment]


@final
class _Weight(nn.Module):
    """A bare ``weight`` parameter, so the key reads ``...out_proj.weight``."""

    def __init__(self, rows: int, cols: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, cols))


@final
class Attention(nn.Module):
    """Projection weights of one attention block, stacked over ``steps`` weight sets.

    ``in_proj_weight`` is ``[steps * 3 * dim, dim]`` (step-major, then q/k/v,
    then heads) and ``out_proj.weight`` is ``[steps * dim, dim]``, exactly as in
    the reference file; the temporal transformer has ``steps == 1``.
    """

    def __init__(self, dim: int, num_heads: int, steps: int = 1) -> None:
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        self.steps = steps
        self.in_proj_weight = nn.Parameter(torch.empty(steps * 3 * dim, dim))
        self.out_proj = _Weight(steps * dim, dim)
        self.in_fp8: Fp8Linear | None = None
        self.out_fp8: Fp8Linear | None = None

    def qkv(self, x: torch.Tensor, step: int = 0) -> tuple[torch.Tensor, ...]:
        """Project ``[..., dim]`` to q, k, v, each ``[..., H, D]``, with step ``step``'s weights."""
        return self.projected(x, step).unbind(-3)

    def projected(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
        """`qkv` as one ``[..., 3, H, D]`` tensor (its keys and values stored in one copy)."""
        start, stop = step * 3 * self.dim, (step + 1) * 3 * self.dim
        if self.in_fp8 is not None:
            projected = self.in_fp8.rows(x, start, stop)
        else:
            projected = F.linear(x, self.in_proj_weight[start:stop])
        return projected.unflatten(-1, (3, self.num_heads, -1))

    def out(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
        """Output projection of ``[..., H, D]`` heads with step ``step``'s weights."""
        start, stop = step * self.dim, (step + 1) * self.dim
        if self.out_fp8 is not None:
            return self.out_fp8.rows(x.flatten(-2), start, stop)
        return F.linear(x.flatten(-2), self.out_proj.weight[start:stop])

    def to_fp8(self) -> None:
        """Store both projections as `Fp8Linear` (a scale a row, so a step's rows slice
        cleanly); the original parameters are dropped."""
        self.in_fp8 = Fp8Linear(self.in_proj_weight)
        self.out_fp8 = Fp8Linear(self.out_proj.weight)
        del self.in_proj_weight
        del self.out_proj
