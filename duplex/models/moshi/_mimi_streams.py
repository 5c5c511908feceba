"""Per-slot streaming state of the Mimi codec, stepped for any subset of slots.

`MimiStreams` owns every per-slot tensor of one `MimiModel`: the conv
left-context and transposed-conv overlap buffers of each direction (packed in
one ``[max_slots, n]`` row per slot, so a step is one gather and one scatter),
the KV rings of the encoder and decoder transformers (``context`` latent steps
per slot) and the frame counters that give RoPE positions and the first-frame
replicate padding. Encode and decode have separate counters: a slot may start
decoding later than it starts encoding.

`reset_slot` zeroes that slot's conv row and counters and nothing else; ring
rows the slot has not written since are masked by position (as in `KVRing`),
so the rings are never cleared. Each listed slot advances by exactly one
80 ms frame per call, equal to the reference ``MimiModel`` under
``streaming(batch_size)`` fed one frame at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

import numpy as np
import torch

from ._mimi import KVRingView, MimiModel
from ._seanet import ConvState, StatefulConv

__all__ = ["MimiStreams"]


@final
class _Direction:
    """Conv buffers, KV ring and frame counters of one direction (encode or decode)."""

    def __init__(
        self,
        layers: list[StatefulConv],
        model: MimiModel,
        max_slots: int,
        device: torch.device,
        dtype: torch.dtype,
        kv_dtype: torch.dtype,
    ) -> None:
        config = model.config
        self.shapes = [layer.state_shape for layer in layers]
        self.sizes = [c * n for c, n in self.shapes]
        self.convs = torch.zeros(max_slots, sum(self.sizes), device=device, dtype=dtype)
        ring = (
            config.transformer_layers,
            max_slots,
            config.transformer_heads,
            config.context,
            config.head_dim,
        )
        self.keys = torch.zeros(ring, device=device, dtype=kv_dtype)
        self.values = torch.zeros(ring, device=device, dtype=kv_dtype)
        self.frames = np.zeros(max_slots, dtype=np.int64)
        self.latent_steps = config.latent_steps

    def gather(self, slots: torch.Tensor, frames: np.ndarray) -> tuple[ConvState, KVRingView]:
        rows = self.convs[slots]
        batch = rows.shape[0]
        buffers = [
            chunk.view(batch, *shape)
            for chunk, shape in zip(rows.split(self.sizes, dim=1), self.shapes, strict=True)
        ]
        first = torch.as_tensor(frames == 0, device=rows.device)
        offsets = torch.as_tensor(frames * self.latent_steps, device=rows.device)
        return ConvState(buffers, first), KVRingView(self.keys, self.values, slots, offsets)

    def scatter(self, slots: torch.Tensor, state: ConvState) -> None:
        batch = slots.shape[0]
        self.convs[slots] = torch.cat([b.reshape(batch, -1) for b in state.buffers], dim=1)


@final
class MimiStreams:
    """Streams 80 ms frames through one `MimiModel` for a fixed pool of slots.

    Args:
        model: the codec (its device and dtype are the streams').
        max_slots: slot pool size; ring memory is ``max_slots * config.kv_bytes_per_slot()``.
        num_codebooks: codes `encode` returns per frame (default ``config.num_codebooks``).
        kv_dtype: ring storage dtype (default: the model's).

    Raises:
        ValueError: ``max_slots < 1`` or ``num_codebooks`` outside ``1..n_q``.
    """

    def __init__(
        self,
        model: MimiModel,
        *,
        max_slots: int,
        num_codebooks: int | None = None,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        if max_slots < 1:
            raise ValueError("max_slots must be at least 1")
        weight = next(model.parameters())
        self._model = model
        self._config = model.config
        self._num_codebooks = model.check_codebooks(num_codebooks)
        self._max_slots = max_slots
        self._device = weight.device
        self._dtype = weight.dtype
        args = (model, max_slots, weight.device, weight.dtype, kv_dtype or weight.dtype)
        self._encode = _Direction(model.encoder_convs, *args)
        self._decode = _Direction(model.decoder_convs, *args)

    @property
    def model(self) -> MimiModel:
        """The codec."""
        return self._model

    @property
    def max_slots(self) -> int:
        """Slot pool size."""
        return self._max_slots

    @property
    def num_codebooks(self) -> int:
        """Codes per frame that `encode` returns."""
        return self._num_codebooks

    @property
    def frame_size(self) -> int:
        """Samples per frame (1920)."""
        return self._config.frame_size

    def frames(self, slot: int) -> tuple[int, int]:
        """Frames the slot has encoded and decoded since its last reset."""
        self._check_slot(slot)
        return int(self._encode.frames[slot]), int(self._decode.frames[slot])

    def reset_slot(self, slot: int) -> None:
        """Make one slot fresh in both directions; no other slot is touched."""
        self._check_slot(slot)
        for direction in (self._encode, self._decode):
            direction.convs[slot] = 0
            direction.frames[slot] = 0

    @torch.no_grad()
    def encode(self, slots: Sequence[int] | torch.Tensor, pcm: torch.Tensor) -> torch.Tensor:
        """Encode one frame for each listed slot.

        Args:
            slots: distinct slot ids (any subset, any order).
            pcm: ``[B, frame_size]`` float samples, one row per slot.

        Returns:
            ``[B, num_codebooks]`` int64 codes.

        Raises:
            ValueError: bad slots or shapes.
        """
        slot_np = self._slots(slots)
        if tuple(pcm.shape) != (len(slot_np), self.frame_size):
            raise ValueError(f"pcm must have shape ({len(slot_np)}, {self.frame_size})")
        direction = self._encode
        slot_t = torch.as_tensor(slot_np, device=self._device)
        convs, ring = direction.gather(slot_t, direction.frames[slot_np])
        x = pcm.to(device=self._device, dtype=self._dtype)[:, None]
        codes = self._model.encode_frames(x, convs, ring, self._num_codebooks)
        direction.scatter(slot_t, convs)
        direction.frames[slot_np] += 1
        return codes[:, :, 0]

    @torch.no_grad()
    def decode(
        self,
        slots: Sequence[int] | torch.Tensor,
        codes: torch.Tensor,
        *,
        check_values: bool = True,
    ) -> torch.Tensor:
        """Decode one frame for each listed slot.

        Args:
            slots: distinct slot ids (any subset, any order).
            codes: ``[B, K]`` codes in ``[0, bins)``, ``1 <= K <= n_q`` (semantic first).
            check_values: verify the code range; that reads the codes on the host (a
                device sync), so a caller whose codes are in range by construction
                (the engine runner, sampling from ``card`` logits) turns it off.

        Returns:
            ``[B, frame_size]`` samples in the model's dtype.

        Raises:
            ValueError: bad slots, shapes, or code values (e.g. the LM's ``-2`` placeholders).
        """
        slot_np = self._slots(slots)
        n_q = self._config.n_q
        if codes.dim() != 2 or codes.shape[0] != len(slot_np) or not 1 <= codes.shape[1] <= n_q:
            raise ValueError(f"codes must have shape ({len(slot_np)}, K) with 1 <= K <= {n_q}")
        if codes.dtype.is_floating_point:
            raise ValueError("codes must be integers")
        if check_values and (int(codes.min()) < 0 or int(codes.max()) >= self._config.bins):
            raise ValueError(f"codes must lie in [0, {self._config.bins})")
        direction = self._decode
        slot_t = torch.as_tensor(slot_np, device=self._device)
        convs, ring = direction.gather(slot_t, direction.frames[slot_np])
        x = codes.to(device=self._device, dtype=torch.long)[:, :, None]
        pcm = self._model.decode_frames(x, convs, ring)
        direction.scatter(slot_t, convs)
        direction.frames[slot_np] += 1
        return pcm[:, 0]

    def _slots(self, slots: Sequence[int] | torch.Tensor) -> np.ndarray:
        if isinstance(slots, torch.Tensor):
            slot_np = slots.detach().cpu().numpy().astype(np.int64).reshape(-1)
        else:
            slot_np = np.asarray(slots, dtype=np.int64).reshape(-1)
        if slot_np.size == 0 or len(np.unique(slot_np)) != slot_np.size:
            raise ValueError("need at least one slot and distinct slot ids")
        for slot in slot_np:
            self._check_slot(int(slot))
        return slot_np

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self._max_slots:
            raise ValueError(f"slot {slot} is outside the pool of {self._max_slots}")
