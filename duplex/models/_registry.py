"""Model names to specs and runner factories; ``duplex serve --model NAME`` looks here."""

from __future__ import annotations

from duplex.exceptions import UnknownModel

from ._interface import ModelRunner, ModelSpec, RunnerFactory
from ._loopback import LOOPBACK_SPEC, LoopbackRunner

__all__ = ["get_model", "model_names", "register_model"]


def _loopback(spec: ModelSpec) -> ModelRunner:
    return LoopbackRunner(spec)


_MODELS: dict[str, tuple[ModelSpec, RunnerFactory]] = {"loopback": (LOOPBACK_SPEC, _loopback)}


def register_model(spec: ModelSpec, factory: RunnerFactory) -> None:
    """Make a model available under ``spec.name``.

    Raises:
        ValueError: the name is taken.
    """
    if spec.name in _MODELS:
        raise ValueError(f"model {spec.name!r} is already registered")
    _MODELS[spec.name] = (spec, factory)


def get_model(name: str) -> tuple[ModelSpec, RunnerFactory]:
    """The spec and runner factory registered under ``name``.

    Raises:
        UnknownModel: nothing is registered under that name.
    """
    try:
        return _MODELS[name]
    except KeyError:
        raise UnknownModel(f"unknown model {name!r}; known: {', '.join(model_names())}") from None


def model_names() -> tuple[str, ...]:
    """Registered model names, sorted."""
    return tuple(sorted(_MODELS))
