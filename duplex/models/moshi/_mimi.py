"""The Mimi codec math: SEANet, projected transformers, resampling convs, split RVQ.

Encode: waveform -> SEANet encoder (25 Hz latent) -> encoder transformer ->
causal stride-2 conv (12.5 Hz, replicate-padded) -> codes. Decode: codes ->
centroid sum -> channel-wise transposed conv (25 Hz) -> decoder transformer ->
SEANet decoder -> waveform. ``state_dict()`` keys are the names of Kyutai's
``tokenizer-e351c8d8-checkpoint125.safetensors``; attention uses the file's
``self_attn.in_proj_weight`` / ``self_attn.out_proj.weight`` (the reference
module renames them to ``in_projs.0`` / ``out_projs.0`` when loading).

Attention windows. The reference streams each frame's two latent steps
through a KV ring of ``context`` rows: both steps are written before either
attends, so once the ring is full the first step of a frame no longer sees the
key ``context`` steps back (it was just overwritten). `MimiTransformer.forward`
takes ``chunk`` to express either window: ``None`` is the reference's
whole-signal mask (``0 <= q - k < context``); ``chunk=2`` is the streaming
mask (``k <= q`` and ``k > last step of q's frame - context``), which the
streaming path reproduces exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import final

import torch
import torch.nn.functional as F
from torch import nn

from duplex.kernels import ring_attention

from ._layers import Attention, apply_rope
from ._mimi_config import MimiConfig
from ._quantizer import SplitResidualVectorQuantizer
from ._seanet import (
    CausalConv1d,
    CausalConvTranspose1d,
    ConvState,
    SEANetDecoder,
    SEANetEncoder,
    StatefulConv,
)

__all__ = ["KVRingView", "MimiModel", "MimiTransformer"]

_LAYER_NORM_EPS = 1e-5


@final
@dataclass(frozen=True, slots=True)
class KVRingView:
    """The listed slots' rows of one transformer's KV rings for one streaming call.

    Args:
        keys, values: ``[layers, slots, heads, context, head_dim]`` rings (written in place).
        slots: ``[B]`` slot of each batch row.
        offsets: ``[B]`` latent steps each row has already streamed (its next position).
        kernel: attend with the ring kernel (below).
    """

    keys: torch.Tensor
    values: torch.Tensor
    slots: torch.Tensor
    offsets: torch.Tensor
    kernel: bool = False
    """Attend with `ring_attention` reading the rings in place (CUDA, or Triton's
    interpreter), instead of gathering each row's ring, zeroing what it has not written and
    calling SDPA: the same keys for every query, with no copy of the rings."""


@final
class _LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


@final
class _TransformerLayer(nn.Module):
    """Pre-norm layer: LayerNorm, RoPE attention, layer scale; LayerNorm, GELU FFN, layer scale."""

    def __init__(self, config: MimiConfig) -> None:
        super().__init__()
        dim = config.dimension
        self.self_attn = Attention(dim, config.transformer_heads)
        self.norm1 = nn.LayerNorm(dim, eps=_LAYER_NORM_EPS)
        self.norm2 = nn.LayerNorm(dim, eps=_LAYER_NORM_EPS)
        self.linear1 = nn.Linear(dim, config.transformer_ffn, bias=False)
        self.linear2 = nn.Linear(config.transformer_ffn, dim, bias=False)
        self.layer_scale_1 = _LayerScale(dim)
        self.layer_scale_2 = _LayerScale(dim)

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        update = self.linear2(F.gelu(self.linear1(self.norm2(x))))
        return x + self.layer_scale_2(update)


@final
class MimiTransformer(nn.Module):
    """Causal transformer over ``[B, T, dimension]`` latents (``.layers.{i}`` in the file)."""

    def __init__(self, config: MimiConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(
            [_TransformerLayer(config) for _ in range(config.transformer_layers)]
        )

    def forward(self, x: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        """Whole sequence from position 0 (see the module docstring for ``chunk``)."""
        steps = x.shape[1]
        context = self.config.context
        positions = torch.arange(steps, device=x.device)
        delta = positions[:, None] - positions[None, :]
        allowed = (delta >= 0) & (delta < context)
        if chunk is not None:
            last = (positions // chunk) * chunk + chunk - 1
            allowed = (delta >= 0) & (positions[None, :] > last[:, None] - context)
        mask = allowed[None, None]
        for layer in self.layers:
            q, k, v = self._qkv(layer, x, positions[None])
            out = F.scaled_dot_product_attention(q, k, v, mask)
            x = self._finish(layer, x, out)
        return x

    def step(self, x: torch.Tensor, ring: KVRingView) -> torch.Tensor:
        """Stream ``[B, T, dimension]`` for the ring's rows: write ``T`` keys, then attend.

        Rows of a slot's ring that it has not written since its reset are masked
        out by position (and zeroed before use, or never read by the ring kernel), so a
        reset never clears the ring.
        """
        steps = x.shape[1]
        positions = ring.offsets[:, None] + torch.arange(steps, device=x.device)[None, :]
        rows = positions % self.config.context  # [B, T]
        attend = self._in_place(ring, positions) if ring.kernel else self._gathered(ring, positions)
        slot_rows = ring.slots[:, None]
        for index, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, positions)
            ring.keys[index, slot_rows, :, rows] = k.transpose(1, 2).to(ring.keys.dtype)
            ring.values[index, slot_rows, :, rows] = v.transpose(1, 2).to(ring.values.dtype)
            x = self._finish(layer, x, attend(index, q))
        return x

    def _gathered(
        self, ring: KVRingView, positions: torch.Tensor
    ) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """Layer ``index``'s attention of ``q`` ``[B, H, T, D]``: each row's ring gathered,
        its unwritten rows zeroed, and SDPA under the chunked window's mask."""
        steps, context = positions.shape[1], self.config.context
        # Absolute position held by each ring row after this write (reference RingKVCache).
        last = ring.offsets + steps - 1
        ring_ids = torch.arange(context, device=positions.device)
        delta = ring_ids[None, :] - (last % context)[:, None]
        held = torch.where(delta <= 0, last[:, None] + delta, last[:, None] + delta - context)
        valid = held >= 0  # [B, C]
        gap = positions[:, :, None] - held[:, None, :]  # [B, T, C]
        mask = (valid[:, None, :] & (gap >= 0) & (gap < context))[:, None]
        unwritten = ~valid[:, None, :, None]

        def attend(index: int, q: torch.Tensor) -> torch.Tensor:
            keys = ring.keys[index, ring.slots].to(q.dtype)  # [B, H, C, D]
            values = ring.values[index, ring.slots].to(q.dtype)
            # A Python scalar fill: no host tensor, so no copy for CUDA graph capture to refuse.
            keys = keys.masked_fill(unwritten, 0.0)
            values = values.masked_fill(unwritten, 0.0)
            return F.scaled_dot_product_attention(q, keys, values, mask)

        return attend

    def _in_place(
        self, ring: KVRingView, positions: torch.Tensor
    ) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """Layer ``index``'s attention of ``q`` with the ring kernel, each query reading its
        slot's ring in place.

        Query ``t`` at position ``p`` sees what `_gathered`'s mask lets it see: before the
        ring wraps, rows ``0..p`` (its length); after, every row but the one a later query
        of this call just wrote (``skip``), whose key replaced the oldest of the window the
        call shares (the reference's chunked window). One row a query: at most two steps a
        call (Mimi streams two a frame).
        """
        steps, context = positions.shape[1], self.config.context
        if steps > 2:
            raise ValueError(f"the ring kernel streams at most 2 steps a call, got {steps}")
        lengths = torch.clamp(positions + 1, max=context)  # [B, T]
        later = torch.arange(steps, device=positions.device)[None, :] < steps - 1
        skip = torch.where(later, (positions + 1) % context, -1)

        def attend(index: int, q: torch.Tensor) -> torch.Tensor:
            keys, values = ring.keys[index], ring.values[index]
            outs = [
                ring_attention(q[:, :, t], keys, values, lengths[:, t], ring.slots, skip=skip[:, t])
                for t in range(steps)
            ]
            return torch.stack(outs, dim=2)

        return attend

    def _qkv(
        self, layer: _TransformerLayer, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Projected heads ``[B, H, T, D]``; RoPE at ``positions`` ``[B or 1, T]``."""
        q, k, v = layer.self_attn.qkv(layer.norm1(x))  # [B, T, H, D]
        q, k = apply_rope(q, k, positions, self.config.max_period)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _finish(self, layer: _TransformerLayer, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        x = x + layer.layer_scale_1(layer.self_attn.out(out.transpose(1, 2)))
        return layer.feed_forward(x)


@final
class _ProjectedTransformer(nn.Module):
    """The reference ``ProjectedTransformer`` with equal widths (no projections)."""

    def __init__(self, config: MimiConfig) -> None:
        super().__init__()
        self.transformer = MimiTransformer(config)


@final
class _Downsample(nn.Module):
    def __init__(self, config: MimiConfig) -> None:
        super().__init__()
        stride = config.resample_stride
        dim = config.dimension
        self.conv = CausalConv1d(dim, dim, 2 * stride, stride=stride, bias=False, replicate=True)


@final
class _Upsample(nn.Module):
    def __init__(self, config: MimiConfig) -> None:
        super().__init__()
        stride = config.resample_stride
        dim = config.dimension
        self.convtr = CausalConvTranspose1d(
            dim, dim, 2 * stride, stride=stride, groups=dim, bias=False
        )


@final
class MimiModel(nn.Module):
    """Mimi encoder, decoder and quantizer under the official tensor names.

    `encode` / `decode` process whole signals with the reference's
    non-streaming semantics; `MimiStreams` runs frames per slot through
    `encode_frames` / `decode_frames`.
    """

    def __init__(self, config: MimiConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = SEANetEncoder(config)
        self.decoder = SEANetDecoder(config)
        self.encoder_transformer = _ProjectedTransformer(config)
        self.decoder_transformer = _ProjectedTransformer(config)
        self.quantizer = SplitResidualVectorQuantizer(config)
        self.downsample = _Downsample(config)
        self.upsample = _Upsample(config)

    @property
    def encoder_convs(self) -> list[StatefulConv]:
        """Stateful convolutions of the encode path, in `ConvState` order."""
        return [*self.encoder.stateful, self.downsample.conv]

    @property
    def decoder_convs(self) -> list[StatefulConv]:
        """Stateful convolutions of the decode path, in `ConvState` order."""
        return [self.upsample.convtr, *self.decoder.stateful]

    def check_codebooks(self, num_codebooks: int | None) -> int:
        """``num_codebooks`` (default: the config's), validated against ``n_q``."""
        count = self.config.num_codebooks if num_codebooks is None else num_codebooks
        if not 1 <= count <= self.config.n_q:
            raise ValueError(f"num_codebooks must be in 1..{self.config.n_q}, got {count}")
        return count

    @torch.no_grad()
    def encode(self, pcm: torch.Tensor, num_codebooks: int | None = None) -> torch.Tensor:
        """Codes of a whole signal (zero-padded to whole frames), as the reference's ``encode``.

        Args:
            pcm: ``[B, samples]`` float waveform at ``sample_rate``.
            num_codebooks: codebooks to return (default ``config.num_codebooks``).

        Returns:
            ``[B, num_codebooks, frames]`` int64 codes.
        """
        count = self.check_codebooks(num_codebooks)
        frame = self.config.frame_size
        x = F.pad(pcm, (0, -pcm.shape[-1] % frame))[:, None]
        state = self._fresh(self.encoder_convs, x)
        latent = self.encoder(x, state)
        latent = self.encoder_transformer.transformer(latent.transpose(1, 2)).transpose(1, 2)
        return self.quantizer.encode(self.downsample.conv(latent, state), count)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Waveform ``[B, frames * frame_size]`` of ``[B, K, frames]`` codes (as the reference)."""
        latent = self.quantizer.decode(codes)
        state = self._fresh(self.decoder_convs, latent)
        latent = self.upsample.convtr(latent, state)
        latent = self.decoder_transformer.transformer(latent.transpose(1, 2)).transpose(1, 2)
        return self.decoder(latent, state)[:, 0]

    def encode_frames(
        self, pcm: torch.Tensor, convs: ConvState, ring: KVRingView, num_codebooks: int
    ) -> torch.Tensor:
        """One streaming step: ``[B, 1, n * frame_size]`` -> ``[B, num_codebooks, n]``."""
        latent = self.encoder(pcm, convs)
        latent = self.encoder_transformer.transformer.step(latent.transpose(1, 2), ring)
        return self.quantizer.encode(
            self.downsample.conv(latent.transpose(1, 2), convs), num_codebooks
        )

    def decode_frames(
        self, codes: torch.Tensor, convs: ConvState, ring: KVRingView
    ) -> torch.Tensor:
        """One streaming step: ``[B, K, n]`` codes -> ``[B, 1, n * frame_size]``."""
        latent = self.upsample.convtr(self.quantizer.decode(codes), convs)
        latent = self.decoder_transformer.transformer.step(latent.transpose(1, 2), ring)
        return self.decoder(latent.transpose(1, 2), convs)

    @staticmethod
    def _fresh(layers: list[StatefulConv], like: torch.Tensor) -> ConvState:
        return ConvState.fresh(layers, like.shape[0], device=like.device, dtype=like.dtype)
