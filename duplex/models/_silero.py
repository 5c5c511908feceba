"""`SileroRunner`: the silero VAD as a runner of the engine, one batched forward per step.

The weights are silero-vad's own TorchScript file, read from the installed
``silero-vad`` wheel (``silero_vad/data/silero_vad.jit``) by path, through the
wheel's metadata: the ``silero_vad`` package is never imported (its import sets
``torch.set_num_threads(1)`` for the whole process) and nothing is fetched, so
there is no hub or network path to turn off. The parameters are copied out of
the TorchScript module into `_SileroNet`, which runs the same network as
silero's 16 kHz model written as batched matrix products; the tests check it
against silero's own streaming model to 1e-6.

The VAD is one more model behind the same `Engine` and `EngineDriver` as
Moshi and the loopback (`silero_engine`): a session's stream is an engine slot,
a window is a frame of 512 samples at 16 kHz (32 ms), and its speech
probability comes back as ``FrameOutput.score``. Its spec (`silero_spec`) is a
scoring model's: the engine steps only the slots with a whole window queued
(``steps_on_input``), a tick catches a backlog up by up to 8 windows
(``max_steps_per_tick``), and no audio comes out (``outputs_audio=False``).

Slots share one pool of recurrent state: rows of an ``(max_slots, 128)`` LSTM
``h`` and ``c``. A step gathers the rows of the slots in its plan, runs one
forward, and scatters them back, the way vllm's runner keeps a persistent
batch. Each window is fed with the 64 samples before it as context, as silero's
streaming model does.

Input is mono float32 PCM at 16 kHz; the caller resamples (the session layer
owns `StreamingResampler`, and models may not import sessions). An output's
``position`` is where its window starts among the samples pushed to the slot,
so its times are exact on that stream's clock; windows refused on overflow or
cleared by a reset leave a gap, and the clock never drifts.

Threading is the engine's: the runner is touched by the step alone. Importing
this module does not import torch; building a `SileroRunner` does.
"""

from __future__ import annotations

import importlib.metadata
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, final

import numpy as np

from duplex.exceptions import ModelError

from ._engine import Engine, SlotHandle, SlotOutput
from ._interface import NO_AUDIO, FrameOutput, ModelSpec, StepOutput, StepPlan

if TYPE_CHECKING:
    import torch

    from ._driver import DriverStatistics

__all__ = [
    "VAD_MAX_STEPS_PER_TICK",
    "VAD_METRICS",
    "VAD_SAMPLE_RATE",
    "VAD_WINDOW_MS",
    "VAD_WINDOW_SAMPLES",
    "SileroRunner",
    "VadWindow",
    "silero_engine",
    "silero_spec",
    "silero_weights_path",
    "vad_metric",
]

VAD_SAMPLE_RATE = 16_000
"""Input sample rate of the VAD (`silero_spec`), in Hz."""
VAD_WINDOW_SAMPLES = 512
"""Samples per window: the unit of one probability."""
VAD_WINDOW_MS = VAD_WINDOW_SAMPLES * 1000 // VAD_SAMPLE_RATE
"""Window length in milliseconds (32)."""
VAD_MAX_STEPS_PER_TICK = 8
"""Windows a stream with a backlog catches up per tick (8x real time)."""
_CONTEXT = 64
"""Samples before each window that the model also sees (silero's ``context_size_samples``)."""
_HIDDEN = 128

_DISTRIBUTION = "silero-vad"
_JIT_FILE = "silero_vad/data/silero_vad.jit"


def silero_weights_path() -> Path:
    """The TorchScript file shipped in the installed ``silero-vad`` wheel.

    Raises:
        ModelError: the wheel is not installed or lacks the file.
    """
    try:
        dist = importlib.metadata.distribution(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelError("silero-vad is not installed (pip install silero-vad)") from exc
    path = Path(str(dist.locate_file(_JIT_FILE)))
    if not path.is_file():
        raise ModelError(f"silero-vad {dist.version} has no {_JIT_FILE}")
    return path


class _SileroNet:
    """silero-vad's 16 kHz network, batched, with the LSTM state passed in and out.

    STFT magnitude (a fixed 256-tap basis, hop 128, on the window reflect-padded
    by 64) -> four conv3 + ReLU layers (strides 1, 2, 2, 1) -> LSTM cell ->
    ReLU -> 1x1 conv -> sigmoid. Convolutions over the 4 STFT frames run as
    im2col matrix products, several times faster on CPU than ``conv1d`` here.
    """

    def __init__(self, path: Path) -> None:
        import torch

        with warnings.catch_warnings():
            # torch 2.13 deprecates TorchScript loading; silero ships its weights that way
            warnings.filterwarnings("ignore", "`torch.jit.load` is deprecated", DeprecationWarning)
            module = torch.jit.load(str(path), map_location="cpu")
        params = {k: v.detach().clone().float() for k, v in module.state_dict().items()}

        def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            tensor = params.get(f"_model.{name}")
            if tensor is None or tuple(tensor.shape) != shape:
                got = None if tensor is None else tuple(tensor.shape)
                raise ModelError(f"{path.name}: expected _model.{name} {shape}, got {got}")
            return tensor

        basis = take("stft.forward_basis_buffer", (258, 1, 256))
        self.basis = basis[:, 0, :].T.contiguous()  # (256, 258): frame -> [real | imag]
        self.convs: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        channels = (129, 128, 64, 64, 128)
        for i, stride in enumerate((1, 2, 2, 1)):
            cin, cout = channels[i], channels[i + 1]
            weight = take(f"encoder.{i}.reparam_conv.weight", (cout, cin, 3))
            bias = take(f"encoder.{i}.reparam_conv.bias", (cout,))
            # im2col layout: rows are (tap, in_channel), matching the unfolded input
            self.convs.append(
                (weight.permute(2, 1, 0).reshape(3 * cin, cout).contiguous(), bias, stride)
            )
        self.w_ih = take("decoder.rnn.weight_ih", (4 * _HIDDEN, _HIDDEN))
        self.w_hh = take("decoder.rnn.weight_hh", (4 * _HIDDEN, _HIDDEN))
        self.b_ih = take("decoder.rnn.bias_ih", (4 * _HIDDEN,))
        self.b_hh = take("decoder.rnn.bias_hh", (4 * _HIDDEN,))
        self.head_w = take("decoder.decoder.2.weight", (1, _HIDDEN, 1))[:, :, 0].contiguous()
        self.head_b = take("decoder.decoder.2.bias", (1,))

    def __call__(
        self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x`` (B, 576): context + window; returns probabilities (B,) and the new h, c."""
        import torch
        import torch.nn.functional as F

        batch = x.shape[0]
        padded = F.pad(x.unsqueeze(1), (0, _CONTEXT), mode="reflect")[:, 0]  # (B, 640)
        frames = padded.unfold(1, 256, 128)  # (B, 4, 256)
        spec = (frames.reshape(-1, 256) @ self.basis).reshape(batch, -1, 258)
        feats = torch.sqrt(spec[..., :129] ** 2 + spec[..., 129:] ** 2)  # (B, T, 129)
        for weight, bias, stride in self.convs:
            cols = F.pad(feats, (0, 0, 1, 1)).unfold(1, 3, stride)  # (B, T', C, 3)
            steps = cols.shape[1]
            cols = cols.transpose(2, 3).reshape(batch * steps, -1)
            feats = torch.relu(torch.addmm(bias, cols, weight)).reshape(batch, steps, -1)
        h, c = torch.lstm_cell(feats[:, 0], (h, c), self.w_ih, self.w_hh, self.b_ih, self.b_hh)
        prob = torch.sigmoid(F.linear(torch.relu(h), self.head_w, self.head_b))
        return prob[:, 0], h, c


def silero_spec(max_streams: int = 256) -> ModelSpec:
    """The silero VAD as an engine model: 16 kHz, one 512-sample window a frame, a score
    per window, stepped only on input."""
    return ModelSpec(
        "silero",
        sample_rate=VAD_SAMPLE_RATE,
        frame_samples=VAD_WINDOW_SAMPLES,
        max_slots=max_streams,
        steps_on_input=True,
        max_steps_per_tick=VAD_MAX_STEPS_PER_TICK,
        outputs_audio=False,
    )


@final
class SileroRunner:
    """silero-vad over a pool of slots: one batched forward over the plan's windows.

    Args:
        spec: a `silero_spec` (its ``max_slots`` sizes the state pool).
        weights: a silero-vad TorchScript file; the wheel's by default.
    """

    def __init__(self, spec: ModelSpec, *, weights: Path | None = None) -> None:
        import torch

        if spec.sample_rate != VAD_SAMPLE_RATE or spec.frame_samples != VAD_WINDOW_SAMPLES:
            raise ValueError(f"silero runs {VAD_WINDOW_SAMPLES} samples at {VAD_SAMPLE_RATE} Hz")
        self._spec = spec
        self._net = _SileroNet(weights if weights is not None else silero_weights_path())
        self._h = torch.zeros(spec.max_slots, _HIDDEN)
        self._c = torch.zeros(spec.max_slots, _HIDDEN)
        self._context = np.zeros((spec.max_slots, _CONTEXT), dtype=np.float32)

    @property
    def spec(self) -> ModelSpec:
        return self._spec

    def reset_slot(self, slot: int) -> None:
        """Fresh recurrent state and no context: the window after this one starts a stream."""
        self._h[slot].zero_()
        self._c[slot].zero_()
        self._context[slot] = 0.0

    def execute(self, plan: StepPlan) -> StepOutput:
        import torch

        ids = [item.slot for item in plan.inputs]
        slots = np.array(ids, dtype=np.int64)
        rows = np.empty((len(ids), _CONTEXT + VAD_WINDOW_SAMPLES), dtype=np.float32)
        rows[:, :_CONTEXT] = self._context[slots]
        for row, item in zip(rows, plan.inputs, strict=True):
            row[_CONTEXT:] = item.frame  # steps_on_input: every input is a whole window
        self._context[slots] = rows[:, -_CONTEXT:]
        index = torch.from_numpy(slots)
        with torch.no_grad():
            h, c = self._h.index_select(0, index), self._c.index_select(0, index)
            prob, h, c = self._net(torch.from_numpy(rows), h, c)
            self._h.index_copy_(0, index, h)
            self._c.index_copy_(0, index, c)
        return StepOutput(
            tuple(
                FrameOutput(slot, NO_AUDIO, score=p)
                for slot, p in zip(ids, prob.tolist(), strict=True)
            )
        )


def silero_engine(
    max_streams: int = 256,
    *,
    max_pending_ms: int = 1024,
    weights: Path | None = None,
    timer: Callable[[], float] = time.perf_counter,
) -> Engine:
    """An engine over a `SileroRunner`: the shared VAD of a session process.

    Args:
        max_streams: size of the slot pool (concurrent sessions).
        max_pending_ms: bound of each slot's queue of unscored windows: a window that
            finds it full is refused (counted, and reported to the pusher).
        weights: a silero-vad TorchScript file; the wheel's by default.
        timer: monotonic seconds, used only to measure step compute time.
    """
    if max_pending_ms < VAD_WINDOW_MS:
        raise ValueError(f"max_pending_ms must be at least one window ({VAD_WINDOW_MS} ms)")
    spec = silero_spec(max_streams)
    return Engine(
        SileroRunner(spec, weights=weights),
        max_input_frames=max_pending_ms // VAD_WINDOW_MS,
        max_lag_frames=0,
        timer=timer,
    )


@final
@dataclass(frozen=True, slots=True)
class VadWindow:
    """One scored window of a VAD engine's output, on its stream's clock (the session side
    reads these from a `SlotOutput`).

    Args:
        handle: the slot (stream) it was scored on.
        epoch: the slot's epoch when the window was taken.
        start: where the window starts among the samples pushed to the slot.
        probability: silero's speech probability in [0, 1].
    """

    handle: SlotHandle
    epoch: int
    start: int
    probability: float

    @classmethod
    def of(cls, output: SlotOutput) -> VadWindow:
        """The window a VAD engine's output scored.

        Raises:
            ValueError: the output carries no score (not a VAD's).
        """
        if output.frame.score is None:
            raise ValueError("not a VAD output: no score")
        return cls(output.handle, output.epoch, output.position, output.frame.score)

    @property
    def start_ms(self) -> int:
        """Start of the window, in ms of audio pushed to the stream."""
        return self.start * 1000 // VAD_SAMPLE_RATE

    @property
    def end_ms(self) -> int:
        """End of the window, in ms of audio pushed to the stream."""
        return (self.start + VAD_WINDOW_SAMPLES) * 1000 // VAD_SAMPLE_RATE


VAD_METRICS: tuple[tuple[str, str, str], ...] = (
    ("duplex_vad_streams", "gauge", "Sessions holding a stream on the shared VAD"),
    ("duplex_vad_capacity_streams", "gauge", "Size of the shared VAD's stream pool"),
    ("duplex_vad_late_ticks_total", "counter", "VAD ticks whose steps ended after the next tick"),
    ("duplex_vad_windows_dropped_total", "counter", "VAD windows dropped (queue or mailbox full)"),
    ("duplex_vad_step_seconds", "gauge", "Compute time of the last VAD forward"),
)
"""The shared VAD's metrics (name, kind, help), read from its driver's statistics by
`vad_metric`; the VAD's engine figures keep these names, apart from the model's."""


def vad_metric(statistics: DriverStatistics, name: str) -> float:
    """The value of ``VAD_METRICS`` entry ``name`` from the VAD engine driver's statistics."""
    engine = statistics.engine
    last = engine.scheduler.last_step_s
    values: dict[str, float] = {
        "duplex_vad_streams": engine.live_slots,
        "duplex_vad_capacity_streams": engine.scheduler.max_slots,
        "duplex_vad_late_ticks_total": statistics.late_ticks,
        "duplex_vad_windows_dropped_total": engine.frames_rejected + statistics.dropped_full,
        "duplex_vad_step_seconds": 0.0 if last is None else last,
    }
    return values[name]
