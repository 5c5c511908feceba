"""Deterministic signals and fakes shared by the models tests (imported by name)."""

from __future__ import annotations

import numpy as np

from duplex.models import Engine, LoopbackRunner, ModelSpec, StepOutput, StepPlan

FRAME = 1920
SPEC = ModelSpec(name="loopback", supports_video_input=True, max_slots=8)


class WrappedLoopback:
    """The loopback runner behind a subclass's `execute` (a fault, a slow step, ...)."""

    def __init__(self, spec: ModelSpec):
        self.inner = LoopbackRunner(spec)
        self.spec = spec

    def reset_slot(self, slot: int) -> None:
        self.inner.reset_slot(slot)

    def execute(self, plan: StepPlan) -> StepOutput:
        return self.inner.execute(plan)


class FakeTimer:
    """A timer the test advances; the engine measures step time with it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def tone(seed: int, k: int) -> np.ndarray:
    """Frame k of a deterministic stream: noise bursts of 5 frames, then 5 of silence."""
    if (k // 5) % 2 == 1:
        return np.zeros(FRAME, dtype=np.float32)
    rng = np.random.default_rng([seed, k])
    return (0.1 * rng.standard_normal(FRAME)).astype(np.float32)


def loopback_engine(
    *, delay_ms: int = 240, spec: ModelSpec = SPEC, timer: FakeTimer | None = None, **options: int
) -> Engine:
    """A loopback engine over `SPEC`; ``options`` are `Engine`'s queue bounds."""
    runner = LoopbackRunner(spec, delay_ms=delay_ms)
    if timer is None:
        return Engine(runner, **options)
    return Engine(runner, timer=timer, **options)
