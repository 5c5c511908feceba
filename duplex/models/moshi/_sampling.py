"""Per-row sampling with static shapes: greedy, or temperature + top-k from counter-based noise.

Every row samples by the exponential race ``argmax(p / E)`` with
``E = -log(U)`` (the reference's sync-free trick), over the full vocabulary
with probabilities outside the row's top-k zeroed. ``U`` comes from
`counter_uniform` (a hash of the slot's seed and frame counter), so a row's
token depends only on its own logits, parameters, seed and frame: slot
isolation holds for sampled output, not just greedy, and the function has no
host syncs, no per-row loops and no generator state, so a CUDA graph can
capture it. Rows with temperature 0 are exactly ``argmax(logits)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import torch

from duplex.exceptions import ConfigError

__all__ = ["SamplingParams", "effective_top_k", "sample_tokens"]


@final
@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one stream is sampled; ``temperature == 0`` is greedy, ``top_k == 0`` keeps all."""

    temperature: float
    top_k: int

    def __post_init__(self) -> None:
        if self.temperature < 0 or self.top_k < 0:
            raise ConfigError("SamplingParams temperature and top_k must be >= 0")

    @property
    def greedy(self) -> bool:
        """Argmax, no randomness."""
        return self.temperature == 0


def effective_top_k(params: SamplingParams, vocab: int) -> int:
    """How many tokens ``params`` can draw from (1 when greedy: no top-k needed)."""
    if params.greedy:
        return 1
    return min(params.top_k, vocab) if params.top_k > 0 else vocab


def sample_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    uniform: torch.Tensor,
    top_k_cap: int,
) -> torch.Tensor:
    """Pick one token per row, with shapes fixed by ``logits`` and ``top_k_cap`` only.

    Args:
        logits: ``[B, V]`` float32.
        temperature: ``[B]``; rows with 0 are greedy.
        top_k: ``[B]``; 0 keeps the whole vocabulary.
        uniform: ``[B, V]`` noise in (0, 1) (see `counter_uniform`).
        top_k_cap: at least every sampled row's effective k (a host constant, so
            ``topk`` has a static width; the result does not depend on it).

    Returns:
        ``[B]`` int64 tokens.
    """
    vocab = logits.shape[-1]
    cap = max(1, min(top_k_cap, vocab))
    greedy = temperature <= 0
    scale = torch.where(greedy, 1.0, temperature)
    probs = torch.softmax(logits / scale[:, None], dim=-1)
    k = torch.where(top_k > 0, top_k, vocab).clamp(1, cap)
    kth = probs.topk(cap, dim=-1).values.gather(-1, (k - 1)[:, None])
    kept = torch.where(probs >= kth, probs, 0.0)
    sampled = (kept / -torch.log(uniform)).argmax(dim=-1)
    return torch.where(greedy, logits.argmax(dim=-1), sampled)
