"""Building blocks shared by the temporal and depth transformers (math only).

Module and parameter names mirror the reference checkpoint so that
``state_dict()`` keys are the official tensor names: ``norm1.alpha``,
``self_attn.in_proj_weight`` / ``self_attn.out_proj.weight`` (stacked per depth
step), ``gating.linear_in.weight`` / ``gating.linear_out.weight``.
"""

from __future__ import annotations

import math
from typing import final

import torch
import torch.nn.functional as F
from torch import nn

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

    Args:
        q, k: ``[..., T, H, D]`` with time on axis -3 (``T`` may be absent: ``[B, H, D]``).
        positions: absolute frame index, broadcastable to the leading ``[..., T]`` axes.
        max_period: rotation base.
    """
    dim = q.shape[-1]
    half = torch.arange(dim // 2, device=q.device, dtype=torch.float32)
    freqs = torch.exp(half * (-math.log(max_period) * 2 / dim))
    angles = positions.float()[..., None, None] * freqs  # [..., 1, D/2]
    cos, sin = torch.cos(angles), torch.sin(angles)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        pairs = x.float().unflatten(-1, (dim // 2, 2))
        re, im = pairs[..., 0], pairs[..., 1]
        out = torch.stack((re * cos - im * sin, re * sin + im * cos), dim=-1)
        return out.flatten(-2).to(x.dtype)

    return rotate(q), rotate(k)


@final
class RMSNorm(nn.Module):
    """RMSNorm in float32 with a ``[1, 1, dim]`` gain named ``alpha`` (reference layout)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        scale = torch.rsqrt(self.eps + xf.pow(2).mean(dim=-1, keepdim=True))
        return (xf * (self.alpha.reshape(-1).float() * scale)).to(x.dtype)


@final
class GatedFFN(nn.Module):
    """``linear_out(silu(a) * b)`` with ``[a; b] = linear_in(x)``."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.linear_in = nn.Linear(dim, 2 * hidden, bias=False)
        self.linear_out = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.linear_in(x).unflatten(-1, (2, -1)).unbind(-2)
        return self.linear_out(F.silu(gate) * value)


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

    def qkv(self, x: torch.Tensor, step: int = 0) -> tuple[torch.Tensor, ...]:
        """Project ``[..., dim]`` to q, k, v, each ``[..., H, D]``, with step ``step``'s weights."""
        rows = 3 * self.dim
        weight = self.in_proj_weight[step * rows : (step + 1) * rows]
        projected = F.linear(x, weight).unflatten(-1, (3, self.num_heads, -1))
        return projected.unbind(-3)

    def out(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
        """Output projection of ``[..., H, D]`` heads with step ``step``'s weights."""
        weight = self.out_proj.weight[step * self.dim : (step + 1) * self.dim]
        return F.linear(x.flatten(-2), weight)
