"""Moshi / PersonaPlex language-model configuration and presets.

One frozen value class describes the temporal transformer, the depth
transformer and the token streams. The numbers of the 7B presets follow the
reference ``moshi_7b_202409`` config (``hidden_scale`` 4.125 with SiLU gating
gives the 11264 / 2816 gated hidden widths); ``tiny`` is a CPU-fast model with
the same stream layout for tests.

Streams: row 0 is text, rows ``1..agent_q`` are the audio codebooks the model
speaks, rows ``agent_q+1..n_q`` are the user's codebooks it listens to.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import final

from duplex.exceptions import ConfigError

__all__ = ["MOSHI_PRESETS", "MoshiConfig", "moshi_preset"]

_MOSHI_DELAYS = (0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1)


def _gated_hidden(dim: int, hidden_scale: float = 4.125) -> int:
    """Hidden width of the reference SiLU gating for ``dim_feedforward = hidden_scale * dim``."""
    feedforward = int(hidden_scale * dim)
    return (21 * dim) // 8 if feedforward == 4 * dim else (2 * feedforward) // 3


@final
@dataclass(frozen=True, slots=True)
class MoshiConfig:
    """Shapes and stream layout of one Moshi-architecture LM.

    Args:
        name: preset or model name.
        dim, num_layers, num_heads, ffn_hidden: temporal transformer (gated SiLU FFN width).
        context: KV ring length in frames per slot (3000 = 240 s at 12.5 Hz).
        max_period: RoPE base of the temporal transformer (the depth transformer has none).
        norm_eps: RMSNorm epsilon (the reference ``rms_norm_f32`` uses 1e-8, in float32).
        card: audio codebook size; token ``card`` is the audio start token.
        text_card: text vocabulary; token ``text_card`` is the text start token.
        n_q: audio codebooks in the input (agent + user).
        dep_q: depth-transformer weight steps stored in the checkpoint (8 Moshi, 16 PersonaPlex).
        agent_q: audio codebooks sampled per frame (the depth steps run at inference).
        delays: per-stream delay in frames, ``n_q + 1`` entries (text first).
        depformer_dim, depformer_num_layers, depformer_num_heads, depformer_ffn_hidden:
            the depth transformer.
        user_lag: extra frames before a user frame enters the temporal input
            (0 Moshi; 1 PersonaPlex, whose loop reads column ``offset - 1``).
        text_padding_id: the text PAD token (silence in the text stream).
    """

    name: str
    dim: int
    num_layers: int
    num_heads: int
    ffn_hidden: int
    context: int
    card: int
    text_card: int
    n_q: int
    dep_q: int
    agent_q: int
    delays: tuple[int, ...]
    depformer_dim: int
    depformer_num_layers: int
    depformer_num_heads: int
    depformer_ffn_hidden: int
    max_period: float = 10_000.0
    norm_eps: float = 1e-8
    user_lag: int = 0
    text_padding_id: int = 3

    def __post_init__(self) -> None:
        positive = {
            "dim": self.dim,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "ffn_hidden": self.ffn_hidden,
            "context": self.context,
            "card": self.card,
            "text_card": self.text_card,
            "n_q": self.n_q,
            "dep_q": self.dep_q,
            "agent_q": self.agent_q,
            "depformer_dim": self.depformer_dim,
            "depformer_num_layers": self.depformer_num_layers,
            "depformer_num_heads": self.depformer_num_heads,
            "depformer_ffn_hidden": self.depformer_ffn_hidden,
        }
        for key, value in positive.items():
            if value <= 0:
                raise ConfigError(f"MoshiConfig.{key} must be positive, got {value}")
        for dim, heads, what in (
            (self.dim, self.num_heads, ""),
            (self.depformer_dim, self.depformer_num_heads, "depformer_"),
        ):
            if dim % heads or (dim // heads) % 2:
                raise ConfigError(
                    f"MoshiConfig.{what}dim must split into {what}num_heads even-sized heads"
                )
        if not self.agent_q <= self.dep_q <= self.n_q:
            raise ConfigError("MoshiConfig needs agent_q <= dep_q <= n_q")
        if len(self.delays) != self.n_q + 1 or min(self.delays) < 0:
            raise ConfigError(f"MoshiConfig.delays needs n_q + 1 = {self.n_q + 1} values >= 0")
        if self.user_lag not in (0, 1):
            raise ConfigError("MoshiConfig.user_lag must be 0 (Moshi) or 1 (PersonaPlex)")
        if self.max_period <= 0 or self.norm_eps <= 0:
            raise ConfigError("MoshiConfig.max_period and norm_eps must be positive")
        if not 0 <= self.text_padding_id < self.text_card:
            raise ConfigError("MoshiConfig.text_padding_id must be a text token")

    @property
    def head_dim(self) -> int:
        """Per-head width of the temporal transformer."""
        return self.dim // self.num_heads

    @property
    def depformer_head_dim(self) -> int:
        """Per-head width of the depth transformer."""
        return self.depformer_dim // self.depformer_num_heads

    @property
    def num_streams(self) -> int:
        """Token rows per frame: text + ``n_q`` audio codebooks."""
        return self.n_q + 1

    @property
    def user_q(self) -> int:
        """User audio codebooks fed in per frame."""
        return self.n_q - self.agent_q

    @property
    def max_delay(self) -> int:
        """Largest stream delay; outputs lag the model by this many frames."""
        return max(self.delays)

    def kv_bytes_per_slot(self, bytes_per_value: float = 2) -> int:
        """Bytes of one slot's temporal KV ring (keys and values, every layer)."""
        return int(2 * self.num_layers * self.context * self.dim * bytes_per_value)


MOSHI_PRESETS: dict[str, MoshiConfig] = {
    "moshi-7b": MoshiConfig(
        name="moshi-7b",
        dim=4096,
        num_layers=32,
        num_heads=32,
        ffn_hidden=_gated_hidden(4096),
        context=3000,
        card=2048,
        text_card=32000,
        n_q=16,
        dep_q=8,
        agent_q=8,
        delays=_MOSHI_DELAYS,
        depformer_dim=1024,
        depformer_num_layers=6,
        depformer_num_heads=16,
        depformer_ffn_hidden=_gated_hidden(1024),
    ),
    "tiny": MoshiConfig(
        name="tiny",
        dim=64,
        num_layers=2,
        num_heads=4,
        ffn_hidden=_gated_hidden(64),
        context=64,
        card=32,
        text_card=64,
        n_q=16,
        dep_q=8,
        agent_q=8,
        delays=_MOSHI_DELAYS,
        depformer_dim=32,
        depformer_num_layers=2,
        depformer_num_heads=2,
        depformer_ffn_hidden=_gated_hidden(32),
    ),
}
MOSHI_PRESETS["personaplex-7b"] = replace(
    MOSHI_PRESETS["moshi-7b"], name="personaplex-7b", dep_q=16, user_lag=1
)
MOSHI_PRESETS["tiny-personaplex"] = replace(
    MOSHI_PRESETS["tiny"], name="tiny-personaplex", dep_q=16, user_lag=1
)


def moshi_preset(name: str) -> MoshiConfig:
    """The preset called ``name``.

    Raises:
        ConfigError: no such preset.
    """
    try:
        return MOSHI_PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown Moshi preset {name!r}; known: {', '.join(sorted(MOSHI_PRESETS))}"
        ) from None
