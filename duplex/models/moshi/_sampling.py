"""How a stream is sampled: per-slot parameters and the top-k a batch needs.

The sampling itself (greedy, or temperature + top-k from counter-based noise,
one way for every device) is `duplex.kernels.sample` and its torch reference
`duplex.kernels.sample_reference`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from duplex.exceptions import ConfigError

__all__ = ["SamplingParams", "effective_top_k"]


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
