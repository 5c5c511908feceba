"""`SileroVad`: one batched silero-vad forward per step over every session's stream.

The weights are silero-vad's own TorchScript file, read from the installed
``silero-vad`` wheel (``silero_vad/data/silero_vad.jit``) by path, through the
wheel's metadata: the ``silero_vad`` package is never imported (its import sets
``torch.set_num_threads(1)`` for the whole process) and nothing is fetched, so
there is no hub or network path to turn off. The parameters are copied out of
the TorchScript module into `_SileroNet`, which runs the same network as
silero's 16 kHz model written as batched matrix products; the tests check it
against silero's own streaming model to 1e-6.

Streams (one per session, like engine slots) share one pool of recurrent
state: rows of an ``(max_streams, 128)`` LSTM ``h`` and ``c``. A step takes the
oldest full window of every stream that has one, gathers those rows, runs one
forward, and scatters the rows back, the way vllm's runner keeps a persistent
batch. Each window is 512 samples at 16 kHz (32 ms) plus the 64 samples before
it as context, as silero's streaming model does.

Input is mono float32 PCM at 16 kHz; the caller resamples (the session layer
owns `StreamingResampler`, and models may not import sessions). Window ``k``
of a stream covers samples ``[512 k, 512 k + 512)`` of everything pushed to it,
so its times are exact milliseconds on that stream's clock; windows dropped by
overflow or by a reset keep their index, and the clock never drifts.

Threading is the engine's: the trio thread calls `acquire`, `push`, `reset`
and `release` while `step` runs on a worker thread. Bookkeeping is under a
short lock; the state tensors are touched by `step` alone. Importing this
module does not import torch; building a `SileroVad` does.
"""

from __future__ import annotations

import importlib.metadata
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, final

import numpy as np
import numpy.typing as npt

from duplex.exceptions import ModelError, SlotReleased

if TYPE_CHECKING:
    import torch

__all__ = [
    "VAD_SAMPLE_RATE",
    "VAD_WINDOW_MS",
    "VAD_WINDOW_SAMPLES",
    "SileroVad",
    "VadHandle",
    "VadPush",
    "VadStatistics",
    "VadStreamStatistics",
    "VadWindow",
    "silero_weights_path",
]

VAD_SAMPLE_RATE = 16_000
"""Input sample rate of `SileroVad` streams, in Hz."""
VAD_WINDOW_SAMPLES = 512
"""Samples per window: the unit of one probability."""
VAD_WINDOW_MS = VAD_WINDOW_SAMPLES * 1000 // VAD_SAMPLE_RATE
"""Window length in milliseconds (32)."""
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


@final
@dataclass(frozen=True, slots=True)
class VadHandle:
    """A claim on one VAD stream; ``generation`` tells a stale handle from the next owner."""

    slot: int
    owner: str
    generation: int


@final
@dataclass(frozen=True, slots=True)
class VadWindow:
    """One window's speech probability, on its stream's clock.

    Args:
        handle: the stream.
        epoch: the stream's epoch when the window was taken (see `SileroVad.reset`).
        index: window number: it covers samples ``[512 index, 512 index + 512)``
            of everything pushed to the stream.
        probability: silero's speech probability in [0, 1].
    """

    handle: VadHandle
    epoch: int
    index: int
    probability: float

    @property
    def start_ms(self) -> int:
        """Start of the window, in ms of audio pushed to the stream."""
        return self.index * VAD_WINDOW_MS

    @property
    def end_ms(self) -> int:
        """End of the window, in ms of audio pushed to the stream."""
        return (self.index + 1) * VAD_WINDOW_MS


@final
@dataclass(frozen=True, slots=True)
class VadPush:
    """What `SileroVad.push` did with a chunk; overflow is reported, never silent.

    Args:
        windows_queued: whole windows this call completed and queued.
        windows_dropped: queued windows dropped (oldest first) to make room.
        buffered_samples: samples waiting for the next whole window.
        queue_depth: windows waiting for a step after this call.
    """

    windows_queued: int
    windows_dropped: int
    buffered_samples: int
    queue_depth: int

    @property
    def overflowed(self) -> bool:
        """Some audio was never scored: the caller pushes faster than steps run."""
        return self.windows_dropped > 0


@final
@dataclass(frozen=True, slots=True)
class VadStreamStatistics:
    """Counters of one live stream."""

    handle: VadHandle
    epoch: int
    windows_pushed: int
    windows_scored: int
    windows_dropped: int
    queue_depth: int
    peak_queue_depth: int
    max_windows: int


@final
@dataclass(frozen=True, slots=True)
class VadStatistics:
    """Counters of the whole VAD; step times are measured compute time.

    Args:
        streams: live streams.
        max_streams: size of the stream pool.
        steps: steps that ran a forward.
        windows_scored: windows that got a probability.
        windows_dropped: windows dropped by queue overflow or by a clearing reset.
        last_batch: streams in the last forward.
        peak_batch: most streams in one forward.
        last_step_s: compute time of the last forward.
        total_step_s: compute time of all forwards.
    """

    streams: int
    max_streams: int
    steps: int
    windows_scored: int
    windows_dropped: int
    last_batch: int
    peak_batch: int
    last_step_s: float
    total_step_s: float


@dataclass(slots=True)
class _Stream:
    """Per-stream bookkeeping; its recurrent state is row ``handle.slot`` of the pool."""

    handle: VadHandle
    max_windows: int
    epoch: int = 0
    partial: npt.NDArray[np.float32] = field(
        default_factory=lambda: np.zeros(VAD_WINDOW_SAMPLES, dtype=np.float32)
    )
    filled: int = 0
    context: npt.NDArray[np.float32] = field(
        default_factory=lambda: np.zeros(_CONTEXT, dtype=np.float32)
    )
    queue: deque[tuple[int, npt.NDArray[np.float32]]] = field(default_factory=deque)
    pushed: int = 0
    scored: int = 0
    dropped: int = 0
    peak_queue_depth: int = 0


@final
class SileroVad:
    """Batched silero VAD over a pool of streams; synchronous, trio-free.

    Args:
        max_streams: size of the stream pool (concurrent sessions).
        max_pending_ms: bound of each stream's queue of unscored windows; a
            window that finds it full drops the oldest one (counted), so the
            stream stays near real time.
        weights: a silero-vad TorchScript file; the wheel's by default.
        timer: monotonic seconds, used only to measure step compute time.
    """

    def __init__(
        self,
        *,
        max_streams: int = 256,
        max_pending_ms: int = 1024,
        weights: Path | None = None,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        import torch

        if max_streams <= 0:
            raise ValueError("max_streams must be positive")
        if max_pending_ms < VAD_WINDOW_MS:
            raise ValueError(f"max_pending_ms must be at least one window ({VAD_WINDOW_MS} ms)")
        self._net = _SileroNet(weights if weights is not None else silero_weights_path())
        self._max_streams = max_streams
        self._max_windows = max_pending_ms // VAD_WINDOW_MS
        self._timer = timer
        self._h = torch.zeros(max_streams, _HIDDEN)
        self._c = torch.zeros(max_streams, _HIDDEN)
        self._lock = threading.Lock()
        self._stepping = threading.Lock()
        self._streams: dict[int, _Stream] = {}
        self._fresh: set[int] = set()
        """Slots whose state rows the next step zeroes (new streams and resets)."""
        self._generation = 0
        self._steps = 0
        self._scored = 0
        self._dropped = 0
        self._last_batch = 0
        self._peak_batch = 0
        self._last_step_s = 0.0
        self._total_step_s = 0.0

    @property
    def max_streams(self) -> int:
        """Size of the stream pool."""
        return self._max_streams

    def acquire(self, owner: str) -> VadHandle | None:
        """Open a stream with fresh state for ``owner``; ``None`` when the pool is full."""
        with self._lock:
            free = next((i for i in range(self._max_streams) if i not in self._streams), None)
            if free is None:
                return None
            self._generation += 1
            handle = VadHandle(free, owner, self._generation)
            self._streams[free] = _Stream(handle, self._max_windows)
            self._fresh.add(free)
            return handle

    def release(self, handle: VadHandle) -> bool:
        """Close a stream; a step already running may still score its last window.

        Returns:
            ``True`` if released now, ``False`` if it already was.
        """
        with self._lock:
            if self._live(handle) is None:
                return False
            del self._streams[handle.slot]
            return True

    def push(self, handle: VadHandle, pcm: npt.NDArray[np.float32]) -> VadPush:
        """Append mono float32 16 kHz audio of any length; it is cut into 512-sample windows.

        Raises:
            SlotReleased: the handle was released.
            TypeError: ``pcm`` is not a 1-D float32 array.
        """
        if not isinstance(pcm, np.ndarray) or pcm.dtype != np.float32 or pcm.ndim != 1:
            raise TypeError("pcm must be a 1-D float32 numpy array")
        with self._lock:
            stream = self._require(handle)
            queued = dropped = pos = 0
            while pos < len(pcm):
                take = min(VAD_WINDOW_SAMPLES - stream.filled, len(pcm) - pos)
                stream.partial[stream.filled : stream.filled + take] = pcm[pos : pos + take]
                stream.filled += take
                pos += take
                if stream.filled < VAD_WINDOW_SAMPLES:
                    break
                stream.filled = 0
                if len(stream.queue) == stream.max_windows:
                    _, oldest = stream.queue.popleft()
                    stream.context = oldest[-_CONTEXT:].copy()
                    dropped += 1
                stream.queue.append((stream.pushed, stream.partial.copy()))
                stream.pushed += 1
                queued += 1
            stream.dropped += dropped
            self._dropped += dropped
            stream.peak_queue_depth = max(stream.peak_queue_depth, len(stream.queue))
            return VadPush(queued, dropped, stream.filled, len(stream.queue))

    def reset(self, handle: VadHandle, epoch: int, *, clear_input: bool = True) -> None:
        """Start a new epoch: zero the stream's recurrent state and context at the next step.

        With ``clear_input`` the queued windows are dropped (counted; their
        indices stay used, so the clock keeps counting pushed audio). Samples of
        an incomplete window are kept either way. Windows of a step already
        running carry the previous epoch.

        Raises:
            SlotReleased: the handle was released.
        """
        with self._lock:
            stream = self._require(handle)
            if clear_input:
                stream.dropped += len(stream.queue)
                self._dropped += len(stream.queue)
                stream.queue.clear()
            stream.context = np.zeros(_CONTEXT, dtype=np.float32)
            stream.epoch = epoch
            self._fresh.add(handle.slot)

    def has_pending(self) -> bool:
        """Some stream has a full window waiting: `step` would run a forward."""
        with self._lock:
            return any(s.queue for s in self._streams.values())

    def step(self) -> tuple[VadWindow, ...]:
        """Score the oldest pending window of every stream that has one, in one forward.

        Returns:
            One `VadWindow` per scored stream (none when nothing was pending).

        Raises:
            RuntimeError: another step is already running.
        """
        if not self._stepping.acquire(blocking=False):
            raise RuntimeError("SileroVad.step is not reentrant")
        try:
            return self._step()
        finally:
            self._stepping.release()

    def statistics(self) -> VadStatistics:
        """Snapshot of the counters."""
        with self._lock:
            return VadStatistics(
                streams=len(self._streams),
                max_streams=self._max_streams,
                steps=self._steps,
                windows_scored=self._scored,
                windows_dropped=self._dropped,
                last_batch=self._last_batch,
                peak_batch=self._peak_batch,
                last_step_s=self._last_step_s,
                total_step_s=self._total_step_s,
            )

    def stream_statistics(self, handle: VadHandle) -> VadStreamStatistics:
        """Counters of one live stream.

        Raises:
            SlotReleased: the handle was released.
        """
        with self._lock:
            s = self._require(handle)
            return VadStreamStatistics(
                handle=handle,
                epoch=s.epoch,
                windows_pushed=s.pushed,
                windows_scored=s.scored,
                windows_dropped=s.dropped,
                queue_depth=len(s.queue),
                peak_queue_depth=s.peak_queue_depth,
                max_windows=s.max_windows,
            )

    # -- internals ---------------------------------------------------------

    def _live(self, handle: VadHandle) -> _Stream | None:
        stream = self._streams.get(handle.slot)
        return stream if stream is not None and stream.handle == handle else None

    def _require(self, handle: VadHandle) -> _Stream:
        stream = self._live(handle)
        if stream is None:
            raise SlotReleased(f"VAD stream {handle} was released")
        return stream

    def _schedule(
        self,
    ) -> tuple[list[int], npt.NDArray[np.float32], list[tuple[VadHandle, int, int]]]:
        """Under the lock: take one window per ready stream, and the slots to zero."""
        with self._lock:
            fresh = sorted(self._fresh)
            self._fresh.clear()
            ready = [s for _, s in sorted(self._streams.items()) if s.queue]
            rows = np.empty((len(ready), _CONTEXT + VAD_WINDOW_SAMPLES), dtype=np.float32)
            tags: list[tuple[VadHandle, int, int]] = []
            for row, stream in zip(rows, ready, strict=True):
                index, window = stream.queue.popleft()
                row[:_CONTEXT] = stream.context
                row[_CONTEXT:] = window
                stream.context = window[-_CONTEXT:].copy()
                stream.scored += 1
                tags.append((stream.handle, stream.epoch, index))
            return fresh, rows, tags

    def _step(self) -> tuple[VadWindow, ...]:
        import torch

        fresh, rows, tags = self._schedule()
        with torch.no_grad():
            if fresh:
                zero = torch.tensor(fresh, dtype=torch.long)
                self._h.index_fill_(0, zero, 0.0)
                self._c.index_fill_(0, zero, 0.0)
            if not tags:
                return ()
            started = self._timer()
            slots = torch.tensor([handle.slot for handle, _, _ in tags], dtype=torch.long)
            h = self._h.index_select(0, slots)
            c = self._c.index_select(0, slots)
            prob, h, c = self._net(torch.from_numpy(rows), h, c)
            self._h.index_copy_(0, slots, h)
            self._c.index_copy_(0, slots, c)
            probs = prob.tolist()
            duration = self._timer() - started
        with self._lock:
            self._steps += 1
            self._scored += len(tags)
            self._last_batch = len(tags)
            self._peak_batch = max(self._peak_batch, len(tags))
            self._last_step_s = duration
            self._total_step_s += duration
        return tuple(
            VadWindow(handle, epoch, index, p)
            for (handle, epoch, index), p in zip(tags, probs, strict=True)
        )
