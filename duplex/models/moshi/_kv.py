"""Per-slot KV rings of the temporal transformer and the attention that reads them.

Every slot owns ``context`` rows per layer; frame ``n`` of a slot writes row
``n % context``. A slot's fill length is ``min(n + 1, context)`` after the
write. Because RoPE is applied before keys are stored, attention is invariant
to the order of rows in the ring; once a slot wraps, its ring holds exactly
the last ``context`` frames, which is the reference's ``delta < context`` window.

`ring_attention_reference` (duplex/kernels) is the torch oracle: it gathers
only the filled rows of the slots it is given and ignores whatever the other
rows hold; the dynamic reference step uses it.

`prefix_attention` is what the static step (and its CUDA graph) runs: the
batch is the prefix of slots ``[0, P)``, so one layer's keys and values are
read in place as views ``[P, H, context, D]``, with no gather (gathering every
row's ring cost about 3 GB of copies per layer at P = 64). On CUDA it is the
Triton kernel `ring_attention` (duplex/kernels), which loads only each slot's
filled rows, in the ring's own dtype (fp8 at one byte an element). Elsewhere
it is ``scaled_dot_product_attention`` with a boolean fill mask: masked rows
are still *read*, and garbage there is not harmless (``NaN + -inf`` is NaN,
and ``0 * inf`` is NaN), so a slot's rows must be finite. `KVRing.clear`
zeroes a slot's rows in every layer and the runner calls it on every reset
(one memset of ``kv_bytes_per_slot``, about 1.5 GB and half a millisecond on an
H200 for the 7B). Rows never attend across slots: NaN in slot ``i``'s rings
can only reach row ``i``'s output.
"""

from __future__ import annotations

from typing import final

import torch
import torch.nn.functional as F

from duplex.kernels import ring_attention, ring_attention_reference, triton_available

__all__ = ["KVRing", "prefix_attention"]


def prefix_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
) -> torch.Tensor:
    """Attention of the slot prefix ``[0, P)`` over its rings, in place and with static shapes.

    CUDA: the Triton kernel (filled rows only). Elsewhere every ring row is
    read and rows at or past a slot's fill are masked, so they must hold
    finite values (`KVRing.clear` zeroes them on reset).

    Args:
        q: ``[P, H, D]`` queries (RoPE applied); row ``i`` is slot ``i``.
        keys, values: one layer's rings of slots ``[0, P)``, ``[P, H, context, D]``
            (views; any float dtype, converted to ``q``'s when it differs).
        lengths: ``[P]`` filled rows per slot (at least 1), computed on the device.

    Returns:
        ``[P, H, D]`` attention output in ``q``'s dtype.
    """
    if q.is_cuda and triton_available():
        return ring_attention(q, keys, values, lengths)
    positions = torch.arange(keys.shape[2], device=q.device)
    mask = (positions[None, :] < lengths[:, None])[:, None, None, :]  # [P, 1, 1, context]
    k, v = keys.to(q.dtype), values.to(q.dtype)  # no copy unless the ring is fp8
    return F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask)[:, :, 0]


@final
class KVRing:
    """Keys and values of every layer for a fixed pool of slots.

    Storage is ``[layers, slots, heads, context, head_dim]`` (about 1.5 GiB per
    slot for the 7B config in bf16). The runner owns it and the slot frame counters.
    Rows start at zero and `clear` re-zeroes a slot: off CUDA `prefix_attention`
    reads masked rows too, so no row may hold NaN or inf from an earlier owner.
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
        active: torch.Tensor | None = None,
    ) -> None:
        """Store one frame's ``[B, H, D]`` keys/values at row ``frame % context`` of each slot.

        Rows where ``active`` is False write back what the ring held (they are
        stepped only to fill a static batch and must leave their slot as it was).
        """
        rows = frames % self.context
        for store, new in ((self.keys, k), (self.values, v)):
            if active is not None:
                # where in the model dtype: torch.where has no float8 kernels, and an
                # fp8 -> bf16 -> fp8 round trip is exact
                old = store[layer, slots, :, rows].to(new.dtype)
                new = torch.where(active[:, None, None], new, old)
            store[layer, slots, :, rows] = new.to(store.dtype)

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        slots: torch.Tensor,
        lengths: torch.Tensor,
        max_len: int,
    ) -> torch.Tensor:
        """`ring_attention_reference` over one layer's rings of ``slots`` (the dynamic step)."""
        return ring_attention_reference(
            q, self.keys[layer], self.values[layer], lengths, slots, max_len
        )

    def attend_prefix(self, layer: int, q: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """`prefix_attention` over one layer's rings of slots ``[0, len(q))``, in place."""
        prefix = q.shape[0]
        return prefix_attention(q, self.keys[layer, :prefix], self.values[layer, :prefix], lengths)

    def clear(self, slot: int) -> None:
        """Zero every layer's rows of one slot, so masked reads of them stay finite."""
        self.keys[:, slot].zero_()
        self.values[:, slot].zero_()
