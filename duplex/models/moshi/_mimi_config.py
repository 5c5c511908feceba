"""Mimi neural audio codec configuration and presets.

One frozen value class describes the SEANet encoder/decoder, the two projected
transformers, the 25 Hz -> 12.5 Hz resampling convolutions and the split
residual vector quantizer. ``mimi`` follows the reference ``loaders._mimi_config``
(``moshi==0.2.13``); ``tiny`` keeps the structure and the 1920-sample frame, so
it plugs into the same 80 ms engine tick, but runs in milliseconds on a CPU.

Fixed by the architecture (not fields): causal convolutions, ELU activations,
true skip connections, LayerNorm (eps 1e-5) transformers with GELU FFNs, layer
scale and interleaved RoPE, one semantic codebook, learnt resampling convs
(the upsampling one channel-wise, the reference's ``upsample_channel_wise_bug``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import final

from duplex.exceptions import ConfigError

__all__ = ["MIMI_PRESETS", "MimiConfig", "mimi_preset"]


@final
@dataclass(frozen=True, slots=True)
class MimiConfig:
    """Shapes of one Mimi codec.

    Args:
        name: preset or model name.
        sample_rate: audio rate in Hz (mono).
        frame_rate: code frames per second (12.5 Hz: 1920 samples per frame at 24 kHz).
        n_filters: SEANet base width (doubles after every stride).
        ratios: SEANet strides in decoder order; the encoder uses them reversed.
        dimension: latent width (SEANet output, transformer width, quantizer input).
        n_residual_layers: residual blocks per SEANet stage (dilation ``dilation_base**j``).
        kernel_size, residual_kernel_size, last_kernel_size: SEANet kernel sizes.
        dilation_base: dilation growth inside a stage.
        compress: residual branch width divisor.
        transformer_layers, transformer_heads, transformer_ffn: each projected transformer.
        context: attention window in 25 Hz latent steps (250 = 10 s).
        max_period: RoPE base.
        codebook_dim: quantizer width (input/output projections map ``dimension`` to it).
        bins: entries per codebook (equals the LM's ``card``).
        n_q: codebooks stored (1 semantic + ``n_q - 1`` acoustic).
        num_codebooks: codebooks used at inference unless overridden (Moshi uses 8).
    """

    name: str
    n_filters: int
    dimension: int
    transformer_layers: int
    transformer_heads: int
    transformer_ffn: int
    codebook_dim: int
    bins: int
    n_q: int
    num_codebooks: int = 8
    context: int = 250
    sample_rate: int = 24_000
    frame_rate: float = 12.5
    ratios: tuple[int, ...] = (8, 6, 5, 4)
    n_residual_layers: int = 1
    kernel_size: int = 7
    residual_kernel_size: int = 3
    last_kernel_size: int = 3
    dilation_base: int = 2
    compress: int = 2
    max_period: float = 10_000.0

    def __post_init__(self) -> None:
        positive = {
            "n_filters": self.n_filters,
            "dimension": self.dimension,
            "transformer_layers": self.transformer_layers,
            "transformer_heads": self.transformer_heads,
            "transformer_ffn": self.transformer_ffn,
            "codebook_dim": self.codebook_dim,
            "bins": self.bins,
            "n_q": self.n_q,
            "num_codebooks": self.num_codebooks,
            "context": self.context,
            "sample_rate": self.sample_rate,
            "n_residual_layers": self.n_residual_layers,
            "kernel_size": self.kernel_size,
            "residual_kernel_size": self.residual_kernel_size,
            "last_kernel_size": self.last_kernel_size,
            "dilation_base": self.dilation_base,
            "compress": self.compress,
        }
        for key, value in positive.items():
            if value <= 0:
                raise ConfigError(f"MimiConfig.{key} must be positive, got {value}")
        if not self.ratios or min(self.ratios) <= 0:
            raise ConfigError("MimiConfig.ratios must be positive strides")
        if self.frame_rate <= 0 or self.max_period <= 0:
            raise ConfigError("MimiConfig.frame_rate and max_period must be positive")
        if self.sample_rate / self.frame_rate != self.frame_size:
            raise ConfigError("MimiConfig.sample_rate / frame_rate must be a whole frame size")
        if self.frame_size % self.hop_length:
            raise ConfigError(
                f"MimiConfig frame size {self.frame_size} must be a multiple of the SEANet hop "
                f"{self.hop_length} (product of ratios)"
            )
        if self.resample_stride < 2:
            raise ConfigError("MimiConfig needs the latent rate above frame_rate (stride >= 2)")
        heads = self.transformer_heads
        if self.dimension % heads or (self.dimension // heads) % 2:
            raise ConfigError("MimiConfig.dimension must split into transformer_heads even heads")
        if self.n_filters % self.compress:
            raise ConfigError("MimiConfig.n_filters must be divisible by compress")
        if self.n_q < 2:
            raise ConfigError("MimiConfig.n_q must be at least 2 (1 semantic + acoustic)")
        if not 1 <= self.num_codebooks <= self.n_q:
            raise ConfigError(f"MimiConfig.num_codebooks must be in 1..n_q={self.n_q}")

    @property
    def frame_size(self) -> int:
        """Samples per code frame (1920 at 24 kHz / 12.5 Hz)."""
        return int(self.sample_rate / self.frame_rate)

    @property
    def hop_length(self) -> int:
        """Samples per SEANet latent step (960: 25 Hz at 24 kHz)."""
        return math.prod(self.ratios)

    @property
    def latent_steps(self) -> int:
        """SEANet latent steps per code frame (2)."""
        return self.frame_size // self.hop_length

    @property
    def resample_stride(self) -> int:
        """Stride of the latent -> frame-rate downsampling conv (and of the upsampling one)."""
        return self.latent_steps

    @property
    def head_dim(self) -> int:
        """Per-head width of the transformers."""
        return self.dimension // self.transformer_heads

    def kv_bytes_per_slot(self, bytes_per_value: int = 4) -> int:
        """Bytes of one slot's KV rings (both transformers, keys and values)."""
        return 2 * 2 * self.transformer_layers * self.context * self.dimension * bytes_per_value


MIMI_PRESETS: dict[str, MimiConfig] = {
    "mimi": MimiConfig(
        name="mimi",
        n_filters=64,
        dimension=512,
        transformer_layers=8,
        transformer_heads=8,
        transformer_ffn=2048,
        codebook_dim=256,
        bins=2048,
        n_q=32,
    ),
    # context 16 (8 frames) so short CPU tests and the parity fixture wrap the KV ring.
    "tiny": MimiConfig(
        name="tiny",
        n_filters=4,
        dimension=32,
        transformer_layers=2,
        transformer_heads=2,
        transformer_ffn=64,
        codebook_dim=16,
        bins=32,
        n_q=8,
        context=16,
    ),
}


def mimi_preset(name: str) -> MimiConfig:
    """The Mimi preset called ``name``.

    Raises:
        ConfigError: no such preset.
    """
    try:
        return MIMI_PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown Mimi preset {name!r}; known: {', '.join(sorted(MIMI_PRESETS))}"
        ) from None
