"""Mimi's split residual vector quantizer (inference only: nearest-centroid codes).

Codebook ``q`` is ``embedding_sum / max(cluster_usage, 1e-5)``: the checkpoint
stores the EMA statistics the reference trained with, under
``quantizer.{rvq_first,rvq_rest}.vq.layers.{i}._codebook.{embedding_sum,
cluster_usage,_initialized}``, with ``input_proj`` / ``output_proj`` 1x1 convs
(``[codebook_dim, dimension, 1]`` and back). ``rvq_first`` holds the semantic
codebook (code row 0); ``rvq_rest`` the acoustic ones (rows 1..). Encoding is
residual: each codebook quantizes what the previous ones left; distances use
``torch.cdist`` like the reference, so nearest-centroid ties break the same way.
The codebooks and the distances stay float32 whatever the model's dtype (a bf16 Mimi
only computes its convolutions and transformers in bf16).
"""

from __future__ import annotations

from typing import final

import torch
import torch.nn.functional as F
from torch import nn

from ._mimi_config import MimiConfig

__all__ = ["SplitResidualVectorQuantizer"]

_USAGE_EPS = 1e-5


@final
class _Codebook(nn.Module):
    """EMA codebook buffers under their checkpoint names."""

    def __init__(self, bins: int, dim: int) -> None:
        super().__init__()
        self._initialized: torch.Tensor
        self.cluster_usage: torch.Tensor
        self.embedding_sum: torch.Tensor
        self.register_buffer("_initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(bins))
        self.register_buffer("embedding_sum", torch.zeros(bins, dim))

    def centroids(self) -> torch.Tensor:
        """``[bins, dim]`` codebook vectors."""
        return self.embedding_sum / self.cluster_usage.clamp(min=_USAGE_EPS)[:, None]


@final
class _Layer(nn.Module):
    def __init__(self, bins: int, dim: int) -> None:
        super().__init__()
        self._codebook = _Codebook(bins, dim)


@final
class _Layers(nn.Module):
    def __init__(self, count: int, bins: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Layer(bins, dim) for _ in range(count)])


@final
class ResidualVectorQuantizer(nn.Module):
    """Projections plus ``count`` residual codebooks."""

    def __init__(self, count: int, config: MimiConfig) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(config.dimension, config.codebook_dim, 1, bias=False)
        self.output_proj = nn.Conv1d(config.codebook_dim, config.dimension, 1, bias=False)
        self.vq = _Layers(count, config.bins, config.codebook_dim)

    def encode(self, latent: torch.Tensor, count: int) -> torch.Tensor:
        """``[B, dimension, T]`` -> ``[B, count, T]`` codes of the first ``count`` codebooks."""
        # distances in float32 (the codebooks stay float32 in any model dtype): a bf16
        # residual would round away the small margins between near centroids
        residual = self.input_proj(latent).transpose(1, 2).float()  # [B, T, D]
        batch, steps, dim = residual.shape
        codes = []
        for layer in list(self.vq.layers)[:count]:
            centroids = layer._codebook.centroids()
            flat = residual.reshape(-1, dim)
            index = torch.cdist(flat[None], centroids[None], p=2)[0].argmin(dim=-1)
            index = index.view(batch, steps)
            residual = residual - F.embedding(index, centroids)
            codes.append(index)
        return torch.stack(codes, dim=1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, K, T]`` codes -> ``[B, dimension, T]`` (sum of centroids, projected)."""
        total = torch.zeros((), device=codes.device)
        for q in range(codes.shape[1]):
            centroids = self.vq.layers[q]._codebook.centroids()
            total = total + F.embedding(codes[:, q], centroids).transpose(1, 2)
        return self.output_proj(total.to(self.output_proj.weight.dtype))


@final
class SplitResidualVectorQuantizer(nn.Module):
    """One semantic codebook (``rvq_first``) and ``n_q - 1`` acoustic ones (``rvq_rest``)."""

    def __init__(self, config: MimiConfig) -> None:
        super().__init__()
        self.n_q = config.n_q
        self.rvq_first = ResidualVectorQuantizer(1, config)
        self.rvq_rest = ResidualVectorQuantizer(config.n_q - 1, config)

    def encode(self, latent: torch.Tensor, num_codebooks: int) -> torch.Tensor:
        """``[B, dimension, T]`` -> ``[B, num_codebooks, T]`` (each quantizer sees the latent)."""
        codes = self.rvq_first.encode(latent, 1)
        if num_codebooks > 1:
            codes = torch.cat([codes, self.rvq_rest.encode(latent, num_codebooks - 1)], dim=1)
        return codes

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, K, T]`` codes (``1 <= K <= n_q``) -> ``[B, dimension, T]``."""
        latent = self.rvq_first.decode(codes[:, :1])
        if codes.shape[1] > 1:
            latent = latent + self.rvq_rest.decode(codes[:, 1:])
        return latent
