"""`EngineRecorder`: the latency histograms an engine's tick loop feeds.

The driver tells it each tick's lateness and each prompted slot's time to ready
(taken to the first output after its replay), and the engine each step's compute
time and batch size. Both calls land in `HistogramCell` s taken once, when the
recorder is made: one bisect and one increment per tick, nothing per slot, no
label lookup on the step's thread. The recorder outlives the drivers (the
server makes one and hands it to every engine it builds, restarts included), so
the histograms keep counting across an engine restart.

An engine in its own process records into a private registry and ships
`EngineRecorder.snapshot` (cumulative counts) in its status to the session
processes, which export it with an ``engine`` label (`RecorderSnapshot.samples`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import final

from duplex.metrics import HistogramCell, MetricsRegistry, Sample, histogram_samples

__all__ = [
    "ENGINE_HISTOGRAMS",
    "READY_BUCKETS",
    "STEP_BUCKETS",
    "TICK_LATENESS_BUCKETS",
    "EngineRecorder",
    "RecorderSnapshot",
]

TICK_LATENESS_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28,
)  # fmt: skip
"""Seconds a tick started after its place on the grid (one frame is 0.08)."""

STEP_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.0225, 0.025,
    0.0275, 0.03, 0.0325, 0.035, 0.0375, 0.04, 0.045, 0.05, 0.06, 0.07, 0.08, 0.1, 0.15,
    0.2, 0.5, 1.0,
)  # fmt: skip
"""Seconds of one batched step's compute; 0.08 is the frame period. 2.5 ms apart where
steps fall (a shift of a few milliseconds, what batch work beside the steps costs them,
shows in a percentile read from the buckets)."""

READY_BUCKETS: tuple[float, ...] = (
    0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0, 30.0, 60.0,
)  # fmt: skip
"""Seconds from a prompted slot's acquisition to its first output that takes input next (a
10 s voice and a short persona replayed one frame per tick take about 14 s)."""

ENGINE_HISTOGRAMS: tuple[tuple[str, str], ...] = (
    (
        "duplex_engine_tick_lateness_seconds",
        "How long after its scheduled time each engine tick started (catching up included)",
    ),
    (
        "duplex_engine_step_seconds",
        "Compute time of one batched engine step, by batch-size bucket (warm-up steps left out)",
    ),
    (
        "duplex_engine_prompt_ready_seconds",
        "Time from a prompted slot's acquisition to the end of its prompt replay (ready)",
    ),
)
"""The engine's histograms (name, help); labels: ``model``, and ``batch`` for step time."""


@final
@dataclass(frozen=True, slots=True)
class RecorderSnapshot:
    """An `EngineRecorder`'s counts at one moment, as plain data that pickles small.

    Cumulative since the recorder was made, so a snapshot that is lost (or arrives
    late) loses nothing: the next one has every observation.
    """

    lateness: tuple[tuple[int, ...], float]
    """Tick lateness: per-bucket counts (the last: above every bound) and sum."""
    steps: tuple[tuple[tuple[int, ...], float], ...]
    """Step time, one entry per batch cell (cell ``i``: batch label ``2**i``)."""
    ready: tuple[tuple[int, ...], float] = ((0,) * (len(READY_BUCKETS) + 1), 0.0)
    """Prompted slots' time to ready: per-bucket counts and sum."""

    def samples(self, name: str, labels: dict[str, str]) -> Iterator[Sample]:
        """Histogram ``name``'s samples (one of `ENGINE_HISTOGRAMS`), each with ``labels``
        (step time adds ``batch``)."""
        (late_name, _), (step_name, _), (ready_name, _) = ENGINE_HISTOGRAMS
        if name == late_name:
            yield from histogram_samples(name, TICK_LATENESS_BUCKETS, labels, *self.lateness)
        elif name == ready_name:
            yield from histogram_samples(name, READY_BUCKETS, labels, *self.ready)
        elif name == step_name:
            for i, (counts, total) in enumerate(self.steps):
                batch = {**labels, "batch": str(1 << i)}
                yield from histogram_samples(name, STEP_BUCKETS, batch, counts, total)
        else:
            raise ValueError(f"{name} is not an engine histogram")


def batch_bucket(batch: int) -> int:
    """The label a batch of ``batch`` slots is counted under: the smallest power of two at
    least that large (the batch buckets CUDA graphs are captured for)."""
    return 1 << (batch - 1).bit_length()


@final
class EngineRecorder:
    """Histogram cells for one model's tick lateness and step time.

    Args:
        model: the ``model`` label.
        max_slots: the largest batch a step can have (its bucket is the last cell).
        registry: where the histograms are exported; ``None``: a private one (tests,
            benchmarks that read the cells directly).
    """

    def __init__(self, model: str, max_slots: int, registry: MetricsRegistry | None = None):
        if max_slots < 1:
            raise ValueError(f"max_slots must be >= 1, got {max_slots}")
        registry = registry if registry is not None else MetricsRegistry()
        (late_name, late_help), (step_name, step_help), (ready_name, ready_help) = ENGINE_HISTOGRAMS
        lateness = registry.histogram(late_name, late_help, ["model"], TICK_LATENESS_BUCKETS)
        self.lateness: HistogramCell = lateness.labels(model=model)
        steps = registry.histogram(step_name, step_help, ["model", "batch"], STEP_BUCKETS)
        self.steps: list[HistogramCell] = [
            steps.labels(model=model, batch=str(1 << i))
            for i in range((max_slots - 1).bit_length() + 1)
        ]
        """Cell ``i`` counts steps of 2**(i-1) + 1 .. 2**i slots (cell 0: one slot)."""
        ready = registry.histogram(ready_name, ready_help, ["model"], READY_BUCKETS)
        self.ready: HistogramCell = ready.labels(model=model)

    def snapshot(self) -> RecorderSnapshot:
        """The counts so far (read without a lock: a step observed meanwhile from its thread
        lands in this snapshot or the next)."""
        return RecorderSnapshot(
            (tuple(self.lateness.counts), self.lateness.sum),
            tuple((tuple(cell.counts), cell.sum) for cell in self.steps),
            (tuple(self.ready.counts), self.ready.sum),
        )

    def tick(self, lateness_s: float) -> None:
        """A tick started ``lateness_s`` after its scheduled time (trio thread)."""
        self.lateness.observe(lateness_s)

    def prompt_ready(self, seconds: float) -> None:
        """A prompted slot finished its replay ``seconds`` after it was taken (trio thread)."""
        self.ready.observe(seconds)

    def step(self, batch: int, seconds: float) -> None:
        """A step of ``batch`` slots computed for ``seconds`` (the step's thread)."""
        self.steps[(batch - 1).bit_length()].observe(seconds)
