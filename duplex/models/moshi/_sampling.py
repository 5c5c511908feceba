"""Per-row sampling: greedy, or temperature + top-k with each slot's own generator.

Each row draws its noise from its slot's ``torch.Generator`` and sees only its
own logits and parameters, so a slot's tokens do not depend on which other
slots share the batch (slot isolation holds for sampled output too, not just
greedy). A row samples by the exponential race ``argmax(p / E)``, ``E ~ Exp(1)``
(the reference's sync-free trick), over the full vocabulary with probabilities
outside the row's top-k zeroed, so the number of draws per row is fixed.

This is the torch reference; a fused Triton per-row sampler comes later.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import final

import torch

from duplex.exceptions import ConfigError

__all__ = ["SamplingParams", "sample_rows"]


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


def sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    generators: Sequence[torch.Generator],
    sampled_rows: Sequence[int],
    max_top_k: int | None = None,
) -> torch.Tensor:
    """Pick one token per row.

    Args:
        logits: ``[B, V]`` float32.
        temperature: ``[B]``; rows with 0 are greedy.
        top_k: ``[B]``; 0 keeps the whole vocabulary.
        generators: one generator per row (its slot's).
        sampled_rows: rows with ``temperature > 0``, known on the host.
        max_top_k: the largest effective k among sampled rows if known on the host
            (avoids a device sync); computed from ``top_k`` otherwise.

    Returns:
        ``[B]`` int64 tokens.
    """
    tokens = logits.argmax(dim=-1)
    if not sampled_rows:
        return tokens
    rows = torch.as_tensor(sampled_rows, device=logits.device)
    sub = logits[rows] / temperature[rows, None]
    probs = torch.softmax(sub, dim=-1)
    vocab = probs.shape[-1]
    k = torch.where(top_k[rows] > 0, top_k[rows].clamp(max=vocab), vocab)
    widest = min(max_top_k, vocab) if max_top_k else int(k.max())
    kth = probs.topk(widest, dim=-1).values.gather(-1, (k - 1)[:, None])
    probs = torch.where(probs >= kth, probs, 0.0)
    noise = torch.stack(
        [
            torch.empty(vocab, device=logits.device).exponential_(generator=generators[r])
            for r in sampled_rows
        ]
    )
    tokens[rows] = (probs / noise).argmax(dim=-1)
    return tokens
