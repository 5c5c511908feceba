"""The ``--model`` values that name Moshi models, as registry entries (spec + factory).

``tiny`` is built (seeded, cached) and loaded; ``moshi-7b``, ``personaplex-7b``,
``PATH`` and ``PRESET:PATH`` are found by `find_checkpoint` and loaded. Finding
happens when the name is resolved (startup checks it, so a missing folder stops
``duplex serve`` with one line); building and loading happen in the factory,
when the engine starts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from duplex.exceptions import ConfigError

from .._interface import ModelRunner, ModelSpec, RunnerFactory
from .._options import ModelOptions
from ._checkpoint import (
    HF_REPOS,
    MoshiCheckpoint,
    find_checkpoint,
    load_checkpoint,
    tiny_checkpoint,
)
from ._config import moshi_preset
from ._engine_runner import MoshiEngineRunner

__all__ = ["MOSHI_MODEL_NAMES", "moshi_spec", "resolve_moshi"]

MOSHI_MODEL_NAMES = ("tiny", *HF_REPOS)
"""Names resolved without a path; any folder path (or ``PRESET:PATH``) works too."""

_MAX_SLOTS = {"tiny": 16, "tiny-personaplex": 16}
_DEFAULT_MAX_SLOTS = 32  # 7B: ~1.6 GB of bf16 KV ring a slot next to ~15 GB of weights


def moshi_spec(preset: str) -> ModelSpec:
    """The engine spec of a Moshi preset: 24 kHz, 80 ms frames, model-native turns;
    PersonaPlex presets (``user_lag == 1``) take prompts."""
    return ModelSpec(
        name=preset,
        sample_rate=24_000,
        frame_samples=1_920,
        supports_video_input=False,
        supports_model_native_turn_policy=True,
        max_slots=_MAX_SLOTS.get(preset, _DEFAULT_MAX_SLOTS),
        supports_prompts=moshi_preset(preset).user_lag == 1,
    )


def _check_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"model device {device!r} requested but no CUDA device is available")


def resolve_moshi(name: str, options: ModelOptions) -> tuple[ModelSpec, RunnerFactory] | None:
    """The spec and factory for a Moshi ``--model`` value, or ``None`` if it is not one.

    Raises:
        ConfigError: a Moshi checkpoint is named but missing or incomplete, or the
            device is unavailable.
    """
    if name == "tiny":
        _check_device(options.device)
        cache = options.cache_folder

        def locate() -> MoshiCheckpoint:
            return tiny_checkpoint(cache, options.seed)

        return moshi_spec("tiny"), _factory(locate, options)
    found = find_checkpoint(name)
    if found is None:
        return None
    _check_device(options.device)
    return moshi_spec(found.lm.name), _factory(lambda: found, options)


def _factory(locate: Callable[[], MoshiCheckpoint], options: ModelOptions) -> RunnerFactory:
    def build(spec: ModelSpec) -> ModelRunner:
        checkpoint = locate()
        cuda = options.device.startswith("cuda")
        loaded = load_checkpoint(
            checkpoint,
            device=options.device,
            lm_dtype=torch.bfloat16 if cuda else torch.float32,
        )
        return MoshiEngineRunner(loaded, spec, seed=options.seed)

    return build
