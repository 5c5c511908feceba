"""How the server asks for a model to be built: device, seed and cache folder.

A registry entry's factory closes over these, so one spec/factory pair per
``(name, options)``; models that need none of them (``loopback``) ignore them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import final

from duplex.exceptions import ConfigError

__all__ = ["ModelOptions", "default_cache_dir"]

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def default_cache_dir() -> Path:
    """Where built models go: ``$XDG_CACHE_HOME/duplex/models`` (``~/.cache`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "duplex" / "models"


@final
@dataclass(frozen=True, slots=True)
class ModelOptions:
    """Build options shared by every model.

    Args:
        device: torch device of the model's tensors: ``cpu``, ``cuda`` or ``cuda:N``.
        seed: base sampling seed; each session's sampling stream derives from it.
        cache_dir: folder for models built locally (the ``tiny`` checkpoint);
            `default_cache_dir` when ``None``.
        loopback_delay_ms: the ``loopback`` model's echo delay (whole 80 ms frames).
        kv_cache_dtype: KV ring storage of Moshi models: ``auto`` (the LM's dtype),
            ``fp8`` (float8 e4m3) or ``int4`` (4-bit values, a float16 scale a group of 32).
        weight_dtype: storage of a Moshi LM's temporal transformer weights: ``auto`` (the
            LM's dtype) or ``fp8`` (e4m3 with a float32 scale a row, activations quantized
            per token: `duplex.models.moshi._fp8`).
        codec_dtype: the dtype Moshi's codec (Mimi) computes in: ``float32`` or ``bf16``
            (its codebooks and code distances stay float32 either way).
        random_weights: build a Moshi preset's architecture with weights drawn from
            ``seed`` on ``device`` instead of loading them (benchmarks without a download);
            models without weights refuse it.
        voice_dir: the folder of uploaded voices, which a model that conditions on a voice
            sample (PersonaPlex) looks in after its checkpoint's own (``None``: none).

    Raises:
        ConfigError: the device string or a dtype is not one of the forms above.
    """

    device: str = "cpu"
    seed: int = 0
    cache_dir: Path | None = None
    loopback_delay_ms: int = 240
    kv_cache_dtype: str = "auto"
    weight_dtype: str = "auto"
    codec_dtype: str = "float32"
    random_weights: bool = False
    voice_dir: Path | None = None

    def __post_init__(self) -> None:
        if not _DEVICE.match(self.device):
            raise ConfigError(f"model device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.kv_cache_dtype not in ("auto", "fp8", "int4"):
            raise ConfigError(
                f"kv_cache_dtype must be auto, fp8 or int4, got {self.kv_cache_dtype!r}"
            )
        if self.weight_dtype not in ("auto", "fp8"):
            raise ConfigError(f"weight_dtype must be auto or fp8, got {self.weight_dtype!r}")
        if self.codec_dtype not in ("float32", "bf16"):
            raise ConfigError(f"codec_dtype must be float32 or bf16, got {self.codec_dtype!r}")

    @property
    def cache_folder(self) -> Path:
        """The cache folder to use."""
        return self.cache_dir if self.cache_dir is not None else default_cache_dir()
