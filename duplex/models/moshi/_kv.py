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

from typing import Final, final

import torch
import torch.nn.functional as F

from duplex.kernels import ring_attention, ring_attention_reference, triton_available
from duplex.kernels.kv_int4 import (
    GROUP,
    ZERO_BYTE,
    dequantize_int4,
    quantize_int4,
    ring_attention_int4,
    ring_attention_int4_reference,
    round_query,
    write_int4_rows,
)

__all__ = ["INT4", "KVDtype", "KVRing", "prefix_attention"]

INT4: Final = "int4"
"""The ring stored in 4 bits (``duplex.kernels.kv_int4``: int4 values, a float16 scale a
group of 32), the server's ``kv_cache_dtype = "int4"``."""
KVDtype = torch.dtype | str
"""A ring's storage: a torch float dtype, or `INT4`."""


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

    With ``dtype`` `INT4` the rows are stored in 4 bits: ``keys`` and ``values`` hold the
    packed values (``uint8 [..., head_dim / 2]``) and ``key_scales`` / ``value_scales``
    their float16 scales; a write quantizes, and the reads dequantize in registers (the
    Triton kernel on CUDA) or in torch (elsewhere).
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
        dtype: KVDtype = torch.float32,
    ) -> None:
        shape = (num_layers, max_slots, num_heads, context, head_dim)
        self.int4 = dtype == INT4
        self.group = GROUP
        self.key_scales: torch.Tensor | None = None
        self.value_scales: torch.Tensor | None = None
        if self.int4:
            packed_shape = (*shape[:-1], head_dim // 2)
            self.keys = torch.full(packed_shape, ZERO_BYTE, device=device, dtype=torch.uint8)
            self.values = torch.full_like(self.keys, ZERO_BYTE)
            self.group = min(GROUP, head_dim)  # a head narrower than a group: one scale a row
            scale_shape = (*shape[:-1], head_dim // self.group)
            self.key_scales = torch.zeros(scale_shape, device=device, dtype=torch.float16)
            self.value_scales = torch.zeros_like(self.key_scales)
        else:
            assert isinstance(dtype, torch.dtype), dtype
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
        if self.int4:
            self._write_int4(layer, slots, rows, k, v, active)
            return
        for store, new in ((self.keys, k), (self.values, v)):
            if active is not None:
                # where in the model dtype: torch.where has no float8 kernels, and an
                # fp8 -> bf16 -> fp8 round trip is exact
                old = store[layer, slots, :, rows].to(new.dtype)
                new = torch.where(active[:, None, None], new, old)
            store[layer, slots, :, rows] = new.to(store.dtype)

    def _write_int4(
        self,
        layer: int,
        slots: torch.Tensor,
        rows: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        active: torch.Tensor | None,
    ) -> None:
        assert self.key_scales is not None and self.value_scales is not None
        if k.is_cuda and triton_available():  # one launch for both: the torch form is ~40
            write_int4_rows(self._layer_int4(layer), (k, v), slots, rows, active, self.group)
            return
        pairs = ((self.keys, self.key_scales, k), (self.values, self.value_scales, v))
        for store, scales, new in pairs:
            packed, scale = quantize_int4(new, self.group)
            if active is not None:  # inactive rows keep their stored bytes exactly
                keep = active[:, None, None]
                packed = torch.where(keep, packed, store[layer, slots, :, rows])
                scale = torch.where(keep, scale, scales[layer, slots, :, rows])
            store[layer, slots, :, rows] = packed
            scales[layer, slots, :, rows] = scale

    def _layer_int4(
        self, layer: int, prefix: int | None = None
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        assert self.key_scales is not None and self.value_scales is not None
        end = self.keys.shape[1] if prefix is None else prefix
        return (
            (self.keys[layer, :end], self.key_scales[layer, :end]),
            (self.values[layer, :end], self.value_scales[layer, :end]),
        )

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        slots: torch.Tensor,
        lengths: torch.Tensor,
        max_len: int,
    ) -> torch.Tensor:
        """`ring_attention_reference` over one layer's rings of ``slots`` (the dynamic step)."""
        if self.int4:
            keys, values = self._layer_int4(layer)
            out = ring_attention_int4_reference(
                q, keys, values, lengths, slots, max_len, self.group
            )
            return out.to(q.dtype)
        return ring_attention_reference(
            q, self.keys[layer], self.values[layer], lengths, slots, max_len
        )

    def attend_prefix(self, layer: int, q: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """`prefix_attention` over one layer's rings of slots ``[0, len(q))``, in place."""
        prefix = q.shape[0]
        if not self.int4:
            keys, values = self.keys[layer, :prefix], self.values[layer, :prefix]
            return prefix_attention(q, keys, values, lengths)
        keys4, values4 = self._layer_int4(layer, prefix)
        if q.is_cuda and triton_available():
            return ring_attention_int4(q, keys4, values4, lengths, group=self.group)
        # off CUDA: the whole prefix dequantized, in torch
        keys = dequantize_int4(*keys4, self.group, q.dtype)
        values = dequantize_int4(*values4, self.group, q.dtype)
        return prefix_attention(round_query(q, self.group).to(q.dtype), keys, values, lengths)

    def clear(self, slot: int) -> None:
        """Zero every layer's rows of one slot, so masked reads of them stay finite."""
        if self.int4:
            assert self.key_scales is not None and self.value_scales is not None
            self.keys[:, slot].fill_(ZERO_BYTE)
            self.values[:, slot].fill_(ZERO_BYTE)
            self.key_scales[:, slot].zero_()
            self.value_scales[:, slot].zero_()
            return
        self.keys[:, slot].zero_()
        self.values[:, slot].zero_()
