"""What a generation request will cost, and whether the process can pay it (sans-I/O).

Each limit of a media request (size, frames, images, steps) is sane alone; their
product is not: 2048x2048 x 16 frames held 8 GB, one 512x512 image took ten minutes
on a 2-core CPU. So every request-batched route estimates a request's memory and time
**before** it accepts it and asks a `CostBudget`:

- memory: what the whole process may hold at once for media work
  (``media.memory_budget_mb``); a request that alone is over it is refused 413,
  one that would take the budget past it while others run is refused 429 with
  ``Retry-After`` and fits once they end;
- time: a ceiling on one request (``media.max_request_s``), refused 400.

Refusals name the field the client can change (``param``) and the limit. A lease is
held until its work has ended (answered, failed, cancelled), so concurrent requests
cannot add up past the budget.

Diffusion's time is learned as the slack learns its units (`duplex.models.UnitEstimate`):
a `DiffusionCost` starts from a prior measured on the tiny pipeline on this project's
CPU, and each finished request that ran alone gives it a new rate (seconds per work
unit, a high quantile of the recent ones), so on a GPU or a bigger checkpoint the
estimate follows what the device does. Work grows with pixels squared above a knee
(self-attention over the latent). Memory is a prior per output pixel and frame.

Speech's cost is its audio: characters / speaking rate / ``speed`` seconds, times the
output sample rate; a request or batch whose audio would pass
``speech.max_audio_s`` is refused before any of it is made.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, final

from duplex.refusals import Refusal

__all__ = [
    "CHARS_PER_SECOND",
    "DIFFUSION_BYTES_PER_PIXEL",
    "DIFFUSION_CALL_UNITS",
    "DIFFUSION_KNEE_PIXELS",
    "DIFFUSION_SECONDS_PER_UNIT",
    "Cost",
    "CostBudget",
    "CostLease",
    "CostStatistics",
    "DiffusionCost",
    "DiffusionShape",
    "default_media_memory_bytes",
    "speech_audio_refusal",
    "speech_audio_seconds",
]

DIFFUSION_BYTES_PER_PIXEL: Final = 128
"""Host memory one output pixel of one frame holds while its pipeline call runs (latents,
VAE activations, the decoded float image): the tiny pipeline on CPU held +7.9 GB for
2048x2048 x 16 frames (118 B) and +3.9 GB for 10 images of 2048x2048 (93 B)."""
DIFFUSION_KNEE_PIXELS: Final = 4096
"""Output pixels where a step's attention term (pixels squared) equals its linear term:
the tiny pipeline's step took 0.06 s at 64x64, 0.48 s at 128x128, 8 s at 256x256."""
DIFFUSION_CALL_UNITS: Final = 8192
"""Work units of a pipeline call's step whatever its size (module calls, the scheduler): a
64x64 step of the tiny pipeline costs about as much as its pixels."""
DIFFUSION_SECONDS_PER_UNIT: Final = 7.2e-6
"""The prior: seconds per work unit (`DiffusionShape.work`) of the tiny pipeline on one core
of this project's 2-core CPU, before any request has been measured."""
CHARS_PER_SECOND: Final = 12.0
"""Characters of text per second of speech at ``speed`` 1 (espeak-ng at 175 words per
minute speaks about 14; the lower figure makes the estimate an upper bound)."""
PCM_BYTES_PER_SAMPLE: Final = 2


@final
@dataclass(frozen=True, slots=True)
class Cost:
    """A request's estimate: host bytes held while it runs, seconds it runs alone."""

    memory_bytes: int
    seconds: float


@final
@dataclass(frozen=True, slots=True)
class DiffusionShape:
    """What a diffusion request asks: ``n`` outputs of ``frames`` frames, ``steps`` steps.

    ``param`` names the field a refusal points at (``size`` on HTTP, ``width`` on the
    video stream)."""

    width: int
    height: int
    steps: int
    frames: int = 1
    n: int = 1
    param: str = "size"

    @property
    def pixels(self) -> int:
        return self.width * self.height

    @property
    def work(self) -> float:
        """Work units of one step over the whole request: a call's own, then pixels plus the
        attention term of each frame and image."""
        pixels = self.pixels
        each = pixels + pixels * pixels / DIFFUSION_KNEE_PIXELS
        return DIFFUSION_CALL_UNITS + self.n * self.frames * each

    def describe(self) -> str:
        parts = [f"{self.width}x{self.height}", f"{self.steps} steps"]
        if self.frames > 1:
            parts.append(f"{self.frames} frames")
        if self.n > 1:
            parts.append(f"{self.n} images")
        return ", ".join(parts)


@final
class DiffusionCost:
    """One pipeline's cost model: memory by pixels, time by a learned rate.

    Args:
        seconds_per_unit: the prior rate, used until a request has been measured.
        bytes_per_pixel: host memory per output pixel and frame.
        window: how many recent measured rates count.
        horizon_s: how long a measured rate counts.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        *,
        seconds_per_unit: float = DIFFUSION_SECONDS_PER_UNIT,
        bytes_per_pixel: int = DIFFUSION_BYTES_PER_PIXEL,
        window: int = 20,
        horizon_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.prior = seconds_per_unit
        self.bytes_per_pixel = bytes_per_pixel
        self._rates: deque[tuple[float, float]] = deque(maxlen=window)
        self._horizon_s = horizon_s
        self._clock = clock

    @property
    def seconds_per_unit(self) -> float:
        """The second highest of the recent measured rates (the prior before any): high,
        so the ceiling errs on refusing, but not the highest, so one request slowed by a
        busy host does not shut out the rest."""
        oldest = self._clock() - self._horizon_s
        rates = sorted(rate for at, rate in self._rates if at >= oldest)
        if not rates:
            return self.prior
        return rates[min(len(rates) - 1, int(0.9 * len(rates)))]

    def estimate(self, shape: DiffusionShape) -> Cost:
        memory = shape.n * shape.frames * shape.pixels * self.bytes_per_pixel
        # the steps, and the final decode at about one step's cost
        seconds = (shape.steps + 1) * shape.work * self.seconds_per_unit
        return Cost(int(memory), seconds)

    def observe(self, shape: DiffusionShape, seconds: float) -> None:
        """A request of ``shape`` ran alone in ``seconds`` (its runner call): a new rate."""
        units = (shape.steps + 1) * shape.work
        if units > 0 and seconds > 0 and math.isfinite(seconds):
            self._rates.append((self._clock(), seconds / units))


@final
@dataclass(frozen=True, slots=True)
class CostStatistics:
    """A budget's record: what is held now, and what it refused."""

    held_bytes: int
    leases: int
    peak_bytes: int
    refused_memory: int
    refused_busy: int
    refused_time: int


@final
@dataclass(eq=False, slots=True)
class CostLease:
    """Memory held for one admitted request until `CostBudget.release`."""

    cost: Cost
    released: bool = False


def _gib(count: int) -> str:
    return f"{count / 2**30:.2f} GiB"


@final
class CostBudget:
    """The process's media budget: memory held at once, seconds per request.

    Args:
        memory_bytes: what every admitted request together may hold.
        max_seconds: the most one request may take alone.
        retry_after_s: ``Retry-After`` of a refusal while others hold the memory.
    """

    def __init__(self, *, memory_bytes: int, max_seconds: float, retry_after_s: float = 5.0):
        if memory_bytes <= 0 or not max_seconds > 0:
            raise ValueError("a cost budget needs memory_bytes > 0 and max_seconds > 0")
        self.memory_bytes = memory_bytes
        self.max_seconds = max_seconds
        self.retry_after_s = retry_after_s
        self._held = 0
        self._leases = 0
        self._peak = 0
        self._refused_memory = 0
        self._refused_busy = 0
        self._refused_time = 0

    def admit(self, cost: Cost, shape: DiffusionShape | None = None, *, param: str = "size") -> (
        CostLease | Refusal
    ):  # fmt: skip
        """A lease for ``cost``, or the refusal: 413 alone over the memory budget, 400 over
        the time ceiling, 429 while others hold the memory it needs."""
        what = f" ({shape.describe()})" if shape is not None else ""
        param = shape.param if shape is not None else param
        if cost.memory_bytes > self.memory_bytes:
            self._refused_memory += 1
            return Refusal(
                413,
                f"This request would hold an estimated {_gib(cost.memory_bytes)} of memory"
                f"{what}; the server's media memory budget is {_gib(self.memory_bytes)} "
                "(media.memory_budget_mb). Ask for a smaller size, fewer frames or "
                "fewer images.",
                "request_too_large",
                param=param,
            )
        if cost.seconds > self.max_seconds:
            self._refused_time += 1
            return Refusal(
                400,
                f"This request would take an estimated {cost.seconds:.0f} s on this server"
                f"{what}; the most one request may take is {self.max_seconds:g} s "
                "(media.max_request_s). Ask for a smaller size or fewer steps.",
                "request_too_slow",
                param=param,
            )
        if self._held + cost.memory_bytes > self.memory_bytes:
            self._refused_busy += 1
            return Refusal(
                429,
                f"Other requests hold {_gib(self._held)} of the media memory budget "
                f"({_gib(self.memory_bytes)}); this one needs {_gib(cost.memory_bytes)}"
                f"{what}. Retry when they end.",
                "rate_limited",
                param=param,
                retry_after_s=self.retry_after_s,
            )
        self._held += cost.memory_bytes
        self._leases += 1
        self._peak = max(self._peak, self._held)
        return CostLease(cost)

    def release(self, lease: CostLease) -> None:
        """The lease's work has ended: its memory is free (a second call does nothing)."""
        if lease.released:
            return
        lease.released = True
        self._held -= lease.cost.memory_bytes
        self._leases -= 1

    def statistics(self) -> CostStatistics:
        return CostStatistics(
            held_bytes=self._held,
            leases=self._leases,
            peak_bytes=self._peak,
            refused_memory=self._refused_memory,
            refused_busy=self._refused_busy,
            refused_time=self._refused_time,
        )


def default_media_memory_bytes(total_bytes: int) -> int:
    """The default media memory budget: a quarter of the machine's memory (the sessions,
    the engines and the other processes keep the rest), at least 256 MiB."""
    return max(256 * 2**20, total_bytes // 4)


def speech_audio_seconds(chars: int, speed: float) -> float:
    """Seconds of audio ``chars`` characters make at ``speed`` (an upper estimate)."""
    return chars / (CHARS_PER_SECOND * speed)


def speech_audio_refusal(
    items: Sequence[tuple[int, float]], sample_rate: int, max_audio_s: float
) -> Refusal | None:
    """``None`` if the audio of ``items`` (characters, speed), a request or a batch, fits
    ``max_audio_s``; else a 400 naming ``input`` and the limit, before any is made."""
    seconds = sum(speech_audio_seconds(chars, speed) for chars, speed in items)
    if seconds <= max_audio_s:
        return None
    limit_bytes = int(max_audio_s * sample_rate * PCM_BYTES_PER_SAMPLE)
    return Refusal(
        400,
        f"This request would make an estimated {seconds:.0f} s of audio; the most one request "
        f"or batch may make is {max_audio_s:g} s ({limit_bytes / 2**20:.1f} MiB of PCM at "
        f"{sample_rate} Hz; speech.max_audio_s). Send less text or a higher speed.",
        "audio_too_long",
        param="input",
    )
