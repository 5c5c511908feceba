"""Interleaved rotary embedding of q and k in one kernel (float32 math).

`rope_reference` is the torch oracle and the CPU path: pairs ``(x[2i], x[2i+1])``
are rotated by ``position * exp(i * (-log(max_period) * 2 / D))`` for
``i in [0, D/2)``, in float32, and cast back. As plain torch it is about 27
kernels a call (angles, cos, sin, then for q and k each a copy, four muls, an
add and a sub, a stack and a cast).

`rope` is the Triton kernel: ONE launch rotates both q and k. One program per
(batch row, time step, block of `BLOCK_HEADS` heads) computes the angles of
its position once and rotates those heads of q and of k, reading the inputs
through their strides (q and k are strided views from unbinding a fused
projection: no copy is made) and writing fresh contiguous outputs. It covers
the per-frame case (``[B, H, D]`` with positions ``[B]``) and the sequence
case (``[B, T, H, D]`` with positions broadcastable to ``[B, T]``, e.g.
``[T]``); positions are read through broadcast (zero) strides. The grid
depends on shapes only: no host sync, and a CUDA graph can capture it.

Precision: on CUDA the kernel calls libdevice's ``expf``, ``sinf`` and
``cosf``, the CUDA math library that torch's own CUDA kernels use, so the
angles match the torch path bit for bit (an approximate ``exp`` would be one
ulp off in a frequency, which at position 30000 moves the angle by ~2e-3).
Triton's interpreter has no libdevice, so on host tensors it uses ``tl.exp``,
``tl.sin`` and ``tl.cos`` (numpy's float32 functions).
"""

from __future__ import annotations

import math
import os

import torch

from . import _triton

if _triton.available():
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

__all__ = ["BLOCK_HEADS", "rope", "rope_reference", "rope_supports"]

BLOCK_HEADS = 4
"""Heads per program: 8 programs for the 7B's 32 heads at B = 1."""


def rope_reference(
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


def rope_supports(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> bool:
    """Whether `rope` handles these shapes (else use `rope_reference`).

    q and k alike (shape, dtype, device; positions on that device too), ``[B, H, D]`` or
    ``[B, T, H, D]`` with an even ``D``, and positions broadcasting to the leading axes
    without enlarging them.
    """
    if q.shape != k.shape or q.dtype != k.dtype or not q.device == k.device == positions.device:
        return False
    if q.dim() not in (3, 4) or q.shape[-1] % 2 or positions.dim() > q.dim() - 2:
        return False
    leading = q.shape[:-2]
    try:
        return torch.broadcast_shapes(positions.shape, leading) == leading
    except RuntimeError:
        return False


def rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, max_period: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rope_reference` as one Triton launch for q and k (CUDA; interpreted for host tensors).

    Shapes as `rope_supports` accepts (``ValueError`` otherwise). Returns fresh
    contiguous tensors in q's dtype. Not differentiable.
    """
    if not rope_supports(q, k, positions):
        raise ValueError(
            f"rope takes alike [B, H, D] or [B, T, H, D] q/k with an even D and positions "
            f"broadcasting to the leading axes; got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"positions {tuple(positions.shape)}"
        )
    steps = q.dim() == 4
    q4 = q if steps else q.unsqueeze(1)  # [B, T, H, D] views
    k4 = k if steps else k.unsqueeze(1)
    batch, time, heads, dim = q4.shape
    pos = positions.expand(q.shape[:-2])  # broadcast strides, no copy
    pos = pos if steps else pos.unsqueeze(1)  # [B, T]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if q_out.numel() == 0:
        return q_out, k_out
    half = dim // 2
    block_heads = min(BLOCK_HEADS, triton.next_power_of_2(heads))
    grid = (batch * time, triton.cdiv(heads, block_heads))
    _rope[grid](
        q4,
        k4,
        q_out,
        k_out,
        pos,
        time,
        heads,
        *q4.stride(),
        *k4.stride(),
        *pos.stride(),
        -math.log(max_period) * 2 / dim,
        HALF=half,
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_HEADS=block_heads,
        PRECISE=q.is_cuda and not _interpreting(),
    )
    return q_out, k_out


def _interpreting() -> bool:
    """Triton's interpreter is on (it has no libdevice)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


if _triton.available():

    @triton.jit
    def _rope(
        q_ptr,
        k_ptr,
        q_out_ptr,
        k_out_ptr,
        pos_ptr,
        time,
        heads,
        stride_qb,
        stride_qt,
        stride_qh,
        stride_qd,
        stride_kb,
        stride_kt,
        stride_kh,
        stride_kd,
        stride_pb,
        stride_pt,
        freq_scale,
        HALF: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        BLOCK_HEADS: tl.constexpr,
        PRECISE: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)  # b * time + t
        b = row // time
        t = row % time
        pairs = tl.arange(0, BLOCK_HALF)
        head = tl.program_id(1) * BLOCK_HEADS + tl.arange(0, BLOCK_HEADS)
        inside = (head < heads)[:, None] & (pairs < HALF)[None, :]
        position = tl.load(pos_ptr + b * stride_pb + t * stride_pt).to(tl.float32)
        exponent = pairs.to(tl.float32) * freq_scale
        if PRECISE:
            angles = position * libdevice.exp(exponent)
            cos = libdevice.cos(angles)
            sin = libdevice.sin(angles)
        else:
            angles = position * tl.exp(exponent)
            cos = tl.cos(angles)
            sin = tl.sin(angles)
        cos = cos[None, :]
        sin = sin[None, :]
        head64 = head.to(tl.int64)[:, None]
        even = (2 * pairs)[None, :]
        # outputs are contiguous [B, (T,) H, D]: element (b, t, h, d) at (row * H + h) * D + d
        out = (row * heads + head64) * (2 * HALF) + even

        q = q_ptr + b * stride_qb + t * stride_qt + head64 * stride_qh + even * stride_qd
        re = tl.load(q, mask=inside, other=0.0).to(tl.float32)
        im = tl.load(q + stride_qd, mask=inside, other=0.0).to(tl.float32)
        dtype = q_out_ptr.dtype.element_ty
        tl.store(q_out_ptr + out, (re * cos - im * sin).to(dtype), mask=inside)
        tl.store(q_out_ptr + out + 1, (re * sin + im * cos).to(dtype), mask=inside)

        k = k_ptr + b * stride_kb + t * stride_kt + head64 * stride_kh + even * stride_kd
        re = tl.load(k, mask=inside, other=0.0).to(tl.float32)
        im = tl.load(k + stride_kd, mask=inside, other=0.0).to(tl.float32)
        dtype = k_out_ptr.dtype.element_ty
        tl.store(k_out_ptr + out, (re * cos - im * sin).to(dtype), mask=inside)
        tl.store(k_out_ptr + out + 1, (re * sin + im * cos).to(dtype), mask=inside)
