"""The Moshi LM: temporal transformer + text head + depth transformer (math only).

`MoshiLM` holds weights and computes; it keeps no per-slot state. The runner
passes in the KV rings, the slot indices and the frame positions of a batch,
so any set of slots can be stepped together at any frame (vllm's split: the
model is a function, the runner owns tensors).

Per frame, for a batch of rows:

1. `temporal_step`: sum of the text and ``n_q`` audio embeddings of the input
   column -> ``num_layers`` x (RMSNorm, RoPE attention over the slot's ring,
   RMSNorm, gated SiLU FFN) -> ``out_norm`` -> ``text_linear`` logits.
2. `depth_step`: ``agent_q`` autoregressive steps; step ``s`` adds
   ``depformer_in.{s}(hidden)`` to the embedding of the previous token (the
   text token for ``s = 0``), runs the depth layers with step ``s``'s weights
   attending to steps ``0..s`` of this frame only (no positional embedding),
   and ``linears.{s}`` gives codebook ``s``'s logits.

`forward_sequence` is the non-streaming oracle (full causal attention with
the same ``context`` window) used by tests and, later, by prompt prefill.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import final

import torch
import torch.nn.functional as F
from torch import nn

from duplex.kernels import ring_attention, triton_available

from ._config import MoshiConfig
from ._kv import KVRing
from ._layers import Attention, GatedFFN, RMSNorm, apply_rope, embed

__all__ = ["MoshiLM", "TokenChooser", "attended_lengths"]

TokenChooser = Callable[[int, torch.Tensor], torch.Tensor]
"""``(depth step, logits [B, card]) -> tokens [B]``: samples or forces the step's codebook."""


def attended_lengths(
    frames: torch.Tensor, context: int, active: torch.Tensor | None = None
) -> torch.Tensor:
    """Ring rows each row of a step attends over: its frames so far, at most ``context``.

    A row not ``active`` (a free slot inside the step's prefix: one a session left, a hole)
    is computed and discarded, so it reads one row, not the full ring its last session left:
    after sessions leave, a step's reads follow the live sessions, not the slots' history.
    """
    lengths = torch.clamp(frames + 1, max=context)
    if active is None:
        return lengths
    return torch.where(active, lengths, torch.ones_like(lengths))


@final
class _TemporalLayer(nn.Module):
    def __init__(self, config: MoshiConfig) -> None:
        super().__init__()
        self.norm1 = RMSNorm(config.dim, config.norm_eps)
        self.self_attn = Attention(config.dim, config.num_heads)
        self.norm2 = RMSNorm(config.dim, config.norm_eps)
        self.gating = GatedFFN(config.dim, config.ffn_hidden)


@final
class _DepthLayer(nn.Module):
    def __init__(self, config: MoshiConfig) -> None:
        super().__init__()
        dim = config.depformer_dim
        self.norm1 = RMSNorm(dim, config.norm_eps)
        self.self_attn = Attention(dim, config.depformer_num_heads, steps=config.dep_q)
        self.norm2 = RMSNorm(dim, config.norm_eps)
        self.gating = nn.ModuleList(
            GatedFFN(dim, config.depformer_ffn_hidden) for _ in range(config.dep_q)
        )


@final
class _Stack(nn.Module):
    """Holds ``layers`` so keys read ``transformer.layers.{i}`` / ``depformer.layers.{i}``."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)


@final
class MoshiLM(nn.Module):
    """Weights of one Moshi-architecture LM under the reference tensor names.

    Build it under ``torch.device("meta")`` to get names and shapes without
    memory; `load_lm` and `save_random_lm` fill it.
    """

    def __init__(self, config: MoshiConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.text_emb = nn.Embedding(c.text_card + 1, c.dim)
        self.emb = nn.ModuleList(nn.Embedding(c.card + 1, c.dim) for _ in range(c.n_q))
        self.transformer = _Stack([_TemporalLayer(c) for _ in range(c.num_layers)])
        self.out_norm = RMSNorm(c.dim, c.norm_eps)
        self.text_linear = nn.Linear(c.dim, c.text_card, bias=False)
        self.depformer_in = nn.ModuleList(
            nn.Linear(c.dim, c.depformer_dim, bias=False) for _ in range(c.dep_q)
        )
        self.depformer_text_emb = nn.Embedding(c.text_card + 1, c.depformer_dim)
        self.depformer_emb = nn.ModuleList(
            nn.Embedding(c.card + 1, c.depformer_dim) for _ in range(c.dep_q - 1)
        )
        self.depformer = _Stack([_DepthLayer(c) for _ in range(c.depformer_num_layers)])
        self.linears = nn.ModuleList(
            nn.Linear(c.depformer_dim, c.card, bias=False) for _ in range(c.dep_q)
        )

    @property
    def initial_tokens(self) -> list[int]:
        """Start token of every stream: ``text_card`` for text, ``card`` for audio."""
        return [self.config.text_card] + [self.config.card] * self.config.n_q

    def temporal_to_fp8(self) -> None:
        """Store the temporal transformer's linear weights in e4m3 with a scale a row
        (``weight_dtype = "fp8"``: most of the LM's bytes); the originals are dropped one
        matrix at a time, so the peak above the model is the float32 copies `quantize_rows`
        makes of one matrix (about 0.75 GB for the 7B's largest)."""
        for layer in self.transformer.layers:
            assert isinstance(layer, _TemporalLayer)
            layer.self_attn.to_fp8()
            layer.gating.to_fp8()

    def embed_column(self, tokens: torch.Tensor) -> torch.Tensor:
        """Sum of the stream embeddings of ``[..., K]`` token columns -> ``[..., dim]``."""
        x = embed(self.text_emb.weight, tokens[..., 0])
        for q, table in enumerate(self.emb):
            x = x + embed(table.weight, tokens[..., q + 1])
        return x

    def temporal_step(
        self,
        tokens: torch.Tensor,
        ring: KVRing,
        slots: torch.Tensor,
        frames: torch.Tensor,
        max_len: int | None = None,
        active: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One frame of the temporal transformer for a batch of slots.

        Args:
            tokens: ``[B, K]`` input column per row.
            ring: the runner's KV rings; this frame's keys/values are written into them.
            slots: ``[B]`` slot index per row; with ``max_len`` None it must be
                ``arange(B)`` (the static step runs the slot prefix ``[0, B)``).
            frames: ``[B]`` frame index per row (RoPE position; ring row ``frame % context``).
            max_len: ``max(min(frames + 1, context))`` computed on the host, to read only
                that many rows of the given slots (`ring_attention_reference`); None attends over
                the prefix's rings in place with a mask (`prefix_attention`: static
                shapes, no host sync, graph-capturable).
            active: ``[B]`` bool, rows whose keys/values are stored (None: all); the
                others leave their ring as it was.

        Returns:
            ``hidden [B, dim]`` after ``out_norm`` and ``text_logits [B, text_card]`` (float32).
        """
        lengths = attended_lengths(frames, ring.context, active)
        layers = self.transformer.layers
        # each residual add goes into the norm after it (one launch on CUDA): the next
        # layer's norm1, or out_norm after the last
        norms = [*(layer.norm1 for layer in layers), self.out_norm]
        x = self.embed_column(tokens)
        normed = norms[0](x)
        for index, layer in enumerate(layers):
            assert isinstance(layer, _TemporalLayer)
            q, k, v = layer.self_attn.qkv(normed)  # [B, H, D] each
            q, k = apply_rope(q, k, frames, self.config.max_period)
            ring.write(index, slots, frames, k, v, active)
            if max_len is None:
                attended = ring.attend_prefix(index, q, lengths)
            else:
                attended = ring.attend(index, q, slots, lengths, max_len)
            x, normed = layer.norm2.residual(x, layer.self_attn.out(attended))
            x, normed = norms[index + 1].residual(x, layer.gating(normed))
        return normed, self.text_linear(normed).float()

    def depth_step(
        self, hidden: torch.Tensor, text_token: torch.Tensor, choose: TokenChooser
    ) -> torch.Tensor:
        """Generate the ``agent_q`` audio codebooks of one frame.

        Args:
            hidden: ``[B, dim]`` temporal output of this frame.
            text_token: ``[B]`` this frame's text token (sampled or forced).
            choose: turns step ``s``'s float32 logits into the token fed to step ``s + 1``.

        Returns:
            ``[B, agent_q]`` chosen tokens.
        """
        c = self.config
        batch = hidden.shape[0]
        steps = c.agent_q
        layers = self.depformer.layers
        # every layer's keys and values of this frame's steps: ``[layer, B, 2, H, step, D]``,
        # a step's pair stored by one copy
        caches = hidden.new_zeros(
            len(layers), batch, 2, c.depformer_num_heads, steps, c.depformer_head_dim
        )
        scale = 1.0 / math.sqrt(c.depformer_head_dim)
        # on CUDA the ring attention kernel reads the frame's steps 0..s: one launch
        # pair instead of seven small ones per layer and step; each step's lengths a row
        fused = hidden.is_cuda and triton_available()
        if fused:
            filled = torch.arange(1, steps + 1, device=hidden.device)
            filled = filled[:, None].expand(steps, batch).contiguous()
        previous = text_token
        chosen: list[torch.Tensor] = []
        for step in range(steps):
            table = self.depformer_text_emb if step == 0 else self.depformer_emb[step - 1]
            assert isinstance(table, nn.Embedding)
            x, normed = layers[0].norm1.residual(
                F.linear(hidden, self.depformer_in[step].weight), embed(table.weight, previous)
            )
            for index, (layer, cache) in enumerate(zip(layers, caches, strict=True)):
                assert isinstance(layer, _DepthLayer)
                projected = layer.self_attn.projected(normed, step)  # [B, 3, H, D]
                cache[:, :, :, step] = projected[:, 1:]
                q, keys, values = projected[:, 0], cache[:, 0], cache[:, 1]
                if fused:
                    attended = ring_attention(q, keys, values, filled[step])
                else:
                    scores = torch.einsum(
                        "bhd,bhsd->bhs", q.float(), keys[:, :, : step + 1].float()
                    )
                    probs = torch.softmax(scores * scale, dim=-1)
                    attended = torch.einsum(
                        "bhs,bhsd->bhd", probs, values[:, :, : step + 1].float()
                    ).to(x.dtype)
                x, normed = layer.norm2.residual(x, layer.self_attn.out(attended, step))
                delta = layer.gating[step](normed)
                if index + 1 < len(layers):
                    x, normed = layers[index + 1].norm1.residual(x, delta)
                else:
                    x = x + delta
            logits = self.linears[step](x).float()
            previous = choose(step, logits)
            chosen.append(previous)
        return torch.stack(chosen, dim=1)

    def forward_sequence(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Non-streaming temporal pass over ``[B, T, K]`` input columns starting at frame 0.

        Attention is causal with the ring's window (a frame sees the last
        ``context`` frames, itself included), so it is the oracle for the ring.

        Returns:
            ``hidden [B, T, dim]`` and ``text_logits [B, T, text_card]`` (float32).
        """
        c = self.config
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)
        delta = positions[:, None] - positions[None, :]
        allowed = (delta >= 0) & (delta < c.context)
        x = self.embed_column(tokens)
        for layer in self.transformer.layers:
            assert isinstance(layer, _TemporalLayer)
            q, k, v = layer.self_attn.qkv(layer.norm1(x))  # [B, T, H, D]
            q, k = apply_rope(q, k, positions, c.max_period)
            scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float())
            scores = scores / math.sqrt(c.head_dim)
            probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
            attended = torch.einsum("bhqk,bkhd->bqhd", probs, v.float()).to(x.dtype)
            x = x + layer.self_attn.out(attended)
            x = x + layer.gating(layer.norm2(x))
        hidden = self.out_norm(x)
        return hidden, self.text_linear(hidden).float()
