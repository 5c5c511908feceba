"""Model names to specs and runner factories; ``duplex serve --model NAME`` looks here.

Fixed entries (``loopback``, tests' fakes) are registered by name. Names that
stand for a family of checkpoints (``tiny``, ``moshi-7b``, a folder path) are
resolved by the family's resolver, which checks the files exist and returns an
entry whose factory loads them with the given `ModelOptions`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from duplex.exceptions import ConfigError, UnknownModel

from ._interface import ModelRunner, ModelSpec, RunnerFactory
from ._loopback import LOOPBACK_SPEC, LoopbackRunner
from ._options import ModelOptions

__all__ = ["get_model", "model_names", "register_model"]

Resolver = Callable[[str, ModelOptions], tuple[ModelSpec, RunnerFactory] | None]


def _loopback(name: str, options: ModelOptions) -> tuple[ModelSpec, RunnerFactory] | None:
    if name != "loopback":
        return None
    if options.random_weights:
        raise ConfigError(
            "random_weights: model 'loopback' has no weights; it applies to the Moshi "
            "presets (tiny, moshi-7b, personaplex-7b)"
        )
    delay = options.loopback_delay_ms
    LoopbackRunner(dataclasses.replace(LOOPBACK_SPEC, max_slots=1), delay_ms=delay)  # fail now

    def build(spec: ModelSpec) -> ModelRunner:
        return LoopbackRunner(spec, delay_ms=delay)

    return LOOPBACK_SPEC, build


def _moshi(name: str, options: ModelOptions) -> tuple[ModelSpec, RunnerFactory] | None:
    from .moshi._models import resolve_moshi  # torch-heavy: imported when a name needs it

    return resolve_moshi(name, options)


_MODELS: dict[str, tuple[ModelSpec, RunnerFactory]] = {}
_RESOLVERS: tuple[tuple[tuple[str, ...], Resolver], ...] = (
    (("loopback",), _loopback),
    (("moshi-7b", "personaplex-7b", "tiny"), _moshi),
)
"""Each family's resolver and the names it answers without a path."""


def register_model(spec: ModelSpec, factory: RunnerFactory) -> None:
    """Make a model available under ``spec.name``.

    Raises:
        ValueError: the name is taken.
    """
    if spec.name in _MODELS or any(spec.name in names for names, _ in _RESOLVERS):
        raise ValueError(f"model {spec.name!r} is already registered")
    _MODELS[spec.name] = (spec, factory)


def get_model(name: str, options: ModelOptions | None = None) -> tuple[ModelSpec, RunnerFactory]:
    """The spec and runner factory for ``name`` (a registered name, a family name or a path).

    Raises:
        UnknownModel: nothing is registered or resolvable under that name.
        ConfigError: a family recognises the name but its files are missing.
    """
    if name in _MODELS:
        return _MODELS[name]
    for _names, resolve in _RESOLVERS:
        entry = resolve(name, options or ModelOptions())
        if entry is not None:
            return entry
    raise UnknownModel(
        f"unknown model {name!r}; known: {', '.join(model_names())}, or a checkpoint folder"
    )


def model_names() -> tuple[str, ...]:
    """Model names usable without a path, sorted."""
    return tuple(sorted({*_MODELS, *(n for names, _ in _RESOLVERS for n in names)}))
