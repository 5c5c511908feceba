"""What a session holds of an engine, wherever the engine runs, and how outputs reach it.

`SlotEngine` is the session side's view of one engine: the in-process
`EngineDriver` and the engine-process client (``duplex.topology``) both are one,
so a session actor never knows which it holds. `SlotDelivery` is the last hop
of every output, shared by both: a full subscriber drops the output (counted)
and the dropped output's input accounting rides on the slot's next delivered
one, so a session's input ledger never drifts.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol, final

from ._engine import InputPush, SlotHandle, SlotOutput
from ._interface import ModelSpec, PcmFrame, SlotPrompt
from ._scheduler import CapacityReport
from ._ticker import Fanout, Subscriber

if TYPE_CHECKING:
    from ._driver import DriverStatistics

__all__ = ["STALL_PERIODS", "SlotDelivery", "SlotEngine"]


class SlotEngine(Protocol):
    """One engine as a session holds it: a slot, its inputs, its outputs to a subscriber."""

    @property
    def spec(self) -> ModelSpec: ...

    async def open_slot(
        self, owner: str, subscriber: Subscriber[SlotOutput], *, prompt: SlotPrompt | None = None
    ) -> SlotHandle | None:
        """A slot delivering to ``subscriber``; ``None`` when the engine's admission says no.

        Raises:
            PromptUnsupported: a prompt the model does not take.
        """
        ...

    def detach(self, handle: SlotHandle) -> bool: ...

    def push_input(self, handle: SlotHandle, pcm: PcmFrame) -> InputPush: ...

    def push_video(self, handle: SlotHandle, frame_id: str, pts_ms: int, payload: bytes) -> int: ...

    def reset(self, handle: SlotHandle, epoch: int, *, clear_input: bool = True) -> None: ...

    def capacity(self) -> CapacityReport: ...

    def statistics(self) -> DriverStatistics | None:
        """The engine's counters (``None``: none known yet)."""
        ...

    def stalled(self, now: float) -> bool:
        """Slots are live and no tick has ended for `STALL_PERIODS` frame periods."""
        ...


STALL_PERIODS = 25
"""A tick this many frame periods late (2 s at 80 ms) is a stalled engine, not a slow one:
``/health`` says ``degraded`` and ``duplex_engine_stalled`` is 1 until a tick ends."""


@final
class SlotDelivery:
    """Per-slot subscribers, with the input accounting of dropped outputs carried forward."""

    def __init__(self, fanout: Fanout[SlotHandle, SlotOutput]) -> None:
        self.fanout = fanout
        self._carry: dict[SlotHandle, SlotOutput] = {}
        """The last dropped output per slot (already holding what it carried)."""

    def add(self, handle: SlotHandle, subscriber: Subscriber[SlotOutput]) -> None:
        self.fanout.subscribers[handle] = subscriber

    def remove(self, handle: SlotHandle) -> None:
        self.fanout.subscribers.pop(handle, None)
        self._carry.pop(handle, None)

    def deliver(self, handle: SlotHandle, output: SlotOutput) -> None:
        carried = self._carry.pop(handle, None)
        if carried is not None:
            output = _merge(carried, output)
        if not self.fanout.send(handle, output):
            self._carry[handle] = output


def _merge(dropped: SlotOutput, output: SlotOutput) -> SlotOutput:
    """``output`` plus the input accounting of outputs dropped before it."""
    frame = output.frame
    if dropped.frame.video_frame_ids:
        frame = dataclasses.replace(
            frame,
            video_frame_ids=(*dropped.frame.video_frame_ids, *frame.video_frame_ids),
            latest_video_pts_ms=(
                frame.latest_video_pts_ms
                if frame.latest_video_pts_ms is not None
                else dropped.frame.latest_video_pts_ms
            ),
        )
    return dataclasses.replace(
        output, input_samples=output.input_samples + dropped.input_samples, frame=frame
    )
