"""`VadDriver`: the trio loop around the shared `SileroVad`.

Tick k is scheduled at ``t0 + k * period`` on trio's clock (no drift, runs
under ``MockClock``). A tick with no full window pending runs nothing. Else it
leaves the trio thread once and runs up to ``max_steps_per_tick`` steps there
(each step scores one window per ready stream, so a stream with a backlog
catches up at that many windows per tick), then hands every `VadWindow` to its
stream's subscriber with ``send_nowait``: a full channel drops the window and
counts it, so a slow session never holds up the others. A tick whose work ends
after the next tick's scheduled time is late and counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import final

import numpy as np
import numpy.typing as npt
import trio

from ._driver import Offload
from ._silero import (
    VAD_SAMPLE_RATE,
    VAD_WINDOW_SAMPLES,
    SileroVad,
    VadHandle,
    VadPush,
    VadStatistics,
    VadWindow,
)
from ._ticker import Fanout, Subscriber, Ticker, loop_counters

__all__ = ["VadDriver", "VadDriverStatistics"]


@final
@dataclass(frozen=True, slots=True)
class VadDriverStatistics:
    """Tick-loop and delivery counters, with the VAD's own record.

    Args:
        ticks: loop iterations (idle ones included).
        idle_ticks: iterations with no full window pending.
        late_ticks: ticks whose steps finished after the next tick's scheduled time.
        subscribers: attached streams.
        delivered: windows handed to subscriber channels.
        dropped_full: windows dropped because a subscriber's channel was full.
        dropped_closed: windows dropped because a subscriber closed its channel
            (its stream is then detached).
        orphaned: windows of streams detached while their step was running.
        vad: the VAD's statistics.
    """

    ticks: int
    idle_ticks: int
    late_ticks: int
    subscribers: int
    delivered: int
    dropped_full: int
    dropped_closed: int
    orphaned: int
    vad: VadStatistics

    def metric(self, name: str) -> float:
        """The value of ``VAD_METRICS`` entry ``name``."""
        values: dict[str, float] = {
            "duplex_vad_streams": self.vad.streams,
            "duplex_vad_capacity_streams": self.vad.max_streams,
            "duplex_vad_late_ticks_total": self.late_ticks,
            "duplex_vad_windows_dropped_total": self.vad.windows_dropped + self.dropped_full,
            "duplex_vad_step_seconds": self.vad.last_step_s,
        }
        return values[name]


VAD_METRICS: tuple[tuple[str, str, str], ...] = (
    ("duplex_vad_streams", "gauge", "Sessions holding a stream on the shared VAD"),
    ("duplex_vad_capacity_streams", "gauge", "Size of the shared VAD's stream pool"),
    ("duplex_vad_late_ticks_total", "counter", "VAD ticks whose steps ended after the next tick"),
    ("duplex_vad_windows_dropped_total", "counter", "VAD windows dropped (queue or mailbox full)"),
    ("duplex_vad_step_seconds", "gauge", "Compute time of the last VAD forward"),
)
"""The shared VAD's metrics (name, kind, help), read from `VadDriverStatistics.metric`."""


@final
class VadDriver:
    """Steps one shared `SileroVad` on a fixed cadence and fans windows out to sessions.

    Every method but `run` is sync and non-blocking.

    Args:
        vad: the batched VAD.
        period_s: tick period; one window (32 ms) by default.
        max_steps_per_tick: most steps (windows per stream) one tick runs.
        offload: how steps leave the trio thread; tests may pass an inline runner.
    """

    def __init__(
        self,
        vad: SileroVad,
        *,
        period_s: float = VAD_WINDOW_SAMPLES / VAD_SAMPLE_RATE,
        max_steps_per_tick: int = 8,
        offload: Offload = trio.to_thread.run_sync,
    ) -> None:
        if max_steps_per_tick <= 0:
            raise ValueError("max_steps_per_tick must be positive")
        self._vad = vad
        self._max_steps = max_steps_per_tick
        self._offload = offload
        self._ticker = Ticker(period_s)
        self._fanout: Fanout[VadHandle, VadWindow] = Fanout(self.detach)

    def attach(self, owner: str, send_channel: Subscriber[VadWindow]) -> VadHandle | None:
        """Open a stream and deliver its windows to ``send_channel``.

        The channel stays the caller's: the driver never closes it. Size it for
        a tick's worth of windows (``max_steps_per_tick`` or more); windows that
        find it full are dropped and counted.

        Returns:
            The stream's handle, or ``None`` when the pool is full.
        """
        handle = self._vad.acquire(owner)
        if handle is not None:
            self._fanout.subscribers[handle] = send_channel
        return handle

    def detach(self, handle: VadHandle) -> bool:
        """Close the stream; windows of a step already running are dropped as orphaned.

        Returns:
            ``True`` if released now, ``False`` if it already was.
        """
        self._fanout.subscribers.pop(handle, None)
        return self._vad.release(handle)

    def push(self, handle: VadHandle, pcm: npt.NDArray[np.float32]) -> VadPush:
        """Queue 16 kHz mono float32 audio; see `SileroVad.push`."""
        return self._vad.push(handle, pcm)

    def reset(self, handle: VadHandle, epoch: int, *, clear_input: bool = True) -> None:
        """Fresh state for one stream from the next step; see `SileroVad.reset`."""
        self._vad.reset(handle, epoch, clear_input=clear_input)

    def statistics(self) -> VadDriverStatistics:
        """Snapshot of the loop and delivery counters."""
        return VadDriverStatistics(
            **loop_counters(self._ticker, self._fanout), vad=self._vad.statistics()
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Tick forever; run it in a nursery. VAD errors propagate.

        Cancelling waits for steps in flight to finish, so none outlives the loop.
        """
        await self._ticker.run(self._vad.has_pending, self._tick, task_status=task_status)

    async def _tick(self, scheduled: float) -> None:
        for window in await self._offload(partial(self._steps, self._max_steps)):
            self._fanout.send(window.handle, window)

    def _steps(self, limit: int) -> list[VadWindow]:
        """Worker thread: up to ``limit`` steps, stopping early when nothing is pending."""
        windows: list[VadWindow] = []
        for _ in range(limit):
            scored = self._vad.step()
            if not scored:
                break
            windows.extend(scored)
        return windows
