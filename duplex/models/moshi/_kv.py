"""Per-slot KV rings of the temporal transformer and the attention that reads them.

Every slot owns ``context`` rows per layer; frame ``n`` of a slot writes row
``n % context``. A slot's fill length is ``min(n + 1, context)`` after the
write, and attention reads only rows below it: rows past the fill length hold
whatever an earlier session left there, so resetting a slot is O(1) (the
runner just restarts its frame counter) and never touches other slots.

Because RoPE is applied before keys are stored, attention is invariant to the
order of rows in the ring; once a slot wraps, its ring holds exactly the last
``context`` frames, which is the reference's ``delta < context`` window.

`ring_attention` is the torch reference for the slot-indexed decode kernel
(a Triton version will read rows in place instead of gathering them).
`masked_attention` is the static-shape version a CUDA graph captures: it
gathers ``context`` rows per slot, but reads an unfilled row's index as row 0
(always filled) so garbage never enters (NaN or inf there would survive SDPA's
mask: ``NaN + -inf`` is NaN), and runs ``scaled_dot_product_attention`` in the
model dtype with a boolean mask. Redirecting indices costs nothing over the
gather itself, unlike zeroing the gathered rows (two more passes over them).
"""

from __future__ import annotations

import math
from typing import final

import torch
import torch.nn.functional as F

__all__ = ["KVRing", "masked_attention", "ring_attention"]


def ring_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    slots: torch.Tensor,
    lengths: torch.Tensor,
    max_len: int,
) -> torch.Tensor:
    """One query per row against the filled part of its slot's ring.

    Args:
        q: ``[B, H, D]`` queries (RoPE applied).
        keys, values: one layer's rings, ``[slots, H, context, D]``.
        slots: ``[B]`` slot index of each row.
        lengths: ``[B]`` filled rows per slot (at least 1: the current frame).
        max_len: ``max(lengths)``, known on the host so no device sync is needed.

    Returns:
        ``[B, H, D]`` attention output in ``q``'s dtype.
    """
    k = keys[slots, :, :max_len].float()  # [B, H, L, D]
    v = values[slots, :, :max_len].float()
    filled = torch.arange(max_len, device=q.device)[None, :] < lengths[:, None]  # [B, L]
    filled = filled[:, None, :]  # [B, 1, L]
    scores = torch.einsum("bhd,bhld->bhl", q.float(), k) / math.sqrt(q.shape[-1])
    # where, not masked_fill on a product: rows past the fill may hold NaN/inf garbage.
    scores = torch.where(filled, scores, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    v = torch.where(filled[..., None], v, 0.0)
    return torch.einsum("bhl,bhld->bhd", probs, v).to(q.dtype)


def masked_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    slots: torch.Tensor,
    lengths: torch.Tensor,
) -> torch.Tensor:
    """`ring_attention` with static shapes: every ring row is read, unfilled rows are masked.

    Args:
        q: ``[B, H, D]`` queries (RoPE applied).
        keys, values: one layer's rings, ``[slots, H, context, D]`` (any float dtype).
        slots: ``[B]`` slot index of each row.
        lengths: ``[B]`` filled rows per slot (at least 1), computed on the device.

    Returns:
        ``[B, H, D]`` attention output in ``q``'s dtype.
    """
    positions = torch.arange(keys.shape[2], device=q.device)
    filled = positions[None, :] < lengths[:, None]  # [B, L]
    rows = torch.where(filled, positions[None, :], 0)  # unfilled -> row 0: never garbage
    # Advanced indices around a slice put their [B, L] shape first: [B, L, H, D].
    k = keys[slots[:, None], :, rows].to(q.dtype).transpose(1, 2)  # [B, H, L, D]
    v = values[slots[:, None], :, rows].to(q.dtype).transpose(1, 2)
    mask = filled[:, None, None, :]  # [B, 1, 1, L]
    return F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask)[:, :, 0]


@final
class KVRing:
    """Keys and values of every layer for a fixed pool of slots.

    Storage is ``[layers, slots, heads, context, head_dim]`` (about 1.5 GiB per
    slot for the 7B config in bf16). The runner owns it and the slot frame counters.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        max_slots: int,
        num_heads: int,
        context: int,
        head_dim: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (num_layers, max_slots, num_heads, context, head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.context = context

    def write(
        self,
        layer: int,
        slots: torch.Tensor,
        frames: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        """Store one frame's ``[B, H, D]`` keys/values at row ``frame % context`` of each slot."""
        rows = frames % self.context
        self.keys[layer, slots, :, rows] = k.to(self.keys.dtype)
        self.values[layer, slots, :, rows] = v.to(self.values.dtype)

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        slots: torch.Tensor,
        lengths: torch.Tensor,
        max_len: int | None,
    ) -> torch.Tensor:
        """`ring_attention` over one layer's rings; `masked_attention` when ``max_len`` is None."""
        keys, values = self.keys[layer], self.values[layer]
        if max_len is None:
            return masked_attention(q, keys, values, slots, lengths)
        return ring_attention(q, keys, values, slots, lengths, max_len)
