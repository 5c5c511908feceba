"""A streaming polyphase resampler between the client rates and the model rate.

Stateful so chunk boundaries are seamless: feeding a signal in pieces gives
the same output as feeding it at once. Kaiser-windowed sinc low-pass at 90 %
of the lower Nyquist; the latency is a constant ``delay_samples`` (output rate).

A leaf module (numpy only), like `duplex.pcm`: the session core resamples client audio
with it, and so does the client (`duplex talk`'s WAV files and sound devices).
"""

from __future__ import annotations

import math
from math import gcd

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from duplex.pcm import float_to_pcm16, pcm16_to_float

__all__ = ["StreamingResampler", "resample_pcm16"]

Pcm = npt.NDArray[np.float32]
_PIECE = 8192  # input samples resampled at a time (at most 1 MiB of products at 32 taps)


class StreamingResampler:
    """Rational-ratio resampler (``out/in = up/down``) that keeps its own history.

    Args:
        in_rate: input sample rate in Hz.
        out_rate: output sample rate in Hz.
        taps_per_phase: filter taps per polyphase branch (quality vs. cost).
    """

    def __init__(self, in_rate: int, out_rate: int, *, taps_per_phase: int = 32) -> None:
        if in_rate <= 0 or out_rate <= 0 or taps_per_phase <= 0:
            raise ValueError("rates and taps_per_phase must be positive")
        g = gcd(in_rate, out_rate)
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._up = out_rate // g
        self._down = in_rate // g
        self._taps = taps_per_phase
        n = taps_per_phase * self._up
        cutoff = 0.45 * min(in_rate, out_rate) / (in_rate * self._up)  # cycles per sample
        t = np.arange(n) - (n - 1) / 2.0
        h = 2.0 * cutoff * np.sinc(2.0 * cutoff * t) * np.kaiser(n, 8.0)
        h *= self._up / h.sum()  # unity DC gain after zero-stuffing
        # phases[p, m] = h[p + m * up]; reversed so a window oldest-first dots straight in.
        self._phases = np.ascontiguousarray(h.reshape(taps_per_phase, self._up).T[:, ::-1])
        self._phases = self._phases.astype(np.float32)
        self._history = np.zeros(taps_per_phase - 1, dtype=np.float32)
        self._consumed = 0  # input samples seen
        self._produced = 0  # output samples made

    @property
    def identity(self) -> bool:
        """Rates are equal: input passes through unchanged."""
        return self._up == self._down

    @property
    def delay_samples(self) -> float:
        """Group delay in output samples (0 for identity)."""
        if self.identity:
            return 0.0
        return (self._taps * self._up - 1) / 2.0 / self._down

    @property
    def produced(self) -> int:
        """Output samples made so far (where the next chunk's output starts)."""
        return self._produced

    def output_count(self, n_in: int) -> int:
        """How many samples `process` would return for ``n_in`` more input samples."""
        if self.identity:
            return n_in
        total = self._consumed + n_in
        return -(-total * self._up // self._down) - self._produced

    def process(self, pcm: Pcm) -> Pcm:
        """Resample one chunk (any length, 1-D float32).

        A chunk over `_PIECE` samples is resampled a piece at a time, which gives the
        same output (the filter state carries over) and bounds the scratch arrays: in
        one step, the input copy and the (outputs, taps) products of a 16 MiB append
        would be 32 times its samples.
        """
        x = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if self.identity:
            self._consumed += x.size
            self._produced += x.size
            return x.copy()
        if x.size <= _PIECE:
            return self._process(x)
        out = np.empty(self.output_count(x.size), dtype=np.float32)
        done = 0
        for start in range(0, x.size, _PIECE):
            part = self._process(x[start : start + _PIECE])
            out[done : done + part.size] = part
            done += part.size
        return out

    def _process(self, x: Pcm) -> Pcm:
        count = self.output_count(x.size)
        buf = np.concatenate([self._history, x])
        base = self._consumed - (self._taps - 1)  # input index of buf[0]
        self._consumed += x.size
        if count <= 0:
            self._history = buf[buf.size - (self._taps - 1) :]
            return np.zeros(0, dtype=np.float32)
        # Output k uses filter phase (k * down) % up on the input window ending at
        # (k * down) // up. Outputs ``up`` apart share a phase and their windows are
        # ``down`` inputs apart, so each phase's windows are a strided view of ``buf``:
        # no (count, taps) index, window or filter arrays are built, and the loop runs
        # ``up`` times (at most 6 between the supported rates). Products and row sums
        # are the same float32 operations, so the output is the same bits.
        up, down, taps = self._up, self._down, self._taps
        windows = sliding_window_view(buf, taps)
        out = np.empty(count, dtype=np.float32)
        for first in range(min(up, count)):
            pos = (self._produced + first) * down
            start = pos // up - base - (taps - 1)  # index in buf of its oldest input
            rows = (count - first + up - 1) // up
            phase_windows = windows[start : start + (rows - 1) * down + 1 : down]
            products = phase_windows * self._phases[pos % up]
            out[first::up] = products.sum(axis=1, dtype=np.float32)
        self._produced += count
        self._history = buf[buf.size - (taps - 1) :]
        return out


def resample_pcm16(
    pcm: npt.NDArray[np.int16], in_rate: int, out_rate: int, *, taps_per_phase: int = 32
) -> npt.NDArray[np.int16]:
    """A whole clip (mono int16 at ``in_rate``) at ``out_rate``, through a
    `StreamingResampler` with its group delay compensated: the output lines up with the
    input and has ``round(n * out_rate / in_rate)`` samples. The one whole-clip resampler
    (speech answers, voice files, ``duplex talk``'s WAV files)."""
    if in_rate == out_rate or pcm.size == 0:
        return np.asarray(pcm, dtype=np.int16).copy()
    resampler = StreamingResampler(in_rate, out_rate, taps_per_phase=taps_per_phase)
    want = round(pcm.size * out_rate / in_rate)
    skip = round(resampler.delay_samples)
    pad = math.ceil((skip + 2) * in_rate / out_rate) + 1
    y = resampler.process(np.concatenate([pcm16_to_float(pcm), np.zeros(pad, np.float32)]))
    return float_to_pcm16(y[skip : skip + want])
