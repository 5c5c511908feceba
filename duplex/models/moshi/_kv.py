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
"""

from __future__ import annotations

import math
from typing import final

import torch

__all__ = ["KVRing", "ring_attention"]


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
        max_len: int,
    ) -> torch.Tensor:
        """`ring_attention` over one layer's rings."""
        return ring_attention(q, self.keys[layer], self.values[layer], slots, lengths, max_len)
