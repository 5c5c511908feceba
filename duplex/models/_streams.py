"""CUDA streams by priority class: a realtime step's kernels ahead of a batch unit's.

A batch unit that must fit the gap between two realtime ticks leaves the end of each
gap unused (a 15 ms diffusion step does not start 10 ms before a tick). On streams of
different priorities a unit may instead run on into the next step: the GPU's block
scheduler dispatches a pending realtime block before any batch block, so a realtime
kernel waits only for batch blocks already running to retire, not for whole batch
kernels (`Slack.acquire`'s ``beside_steps`` says how far this goes, and why not further).

Each runner issues all its device work on its own stream (`priority_stream`), made to
wait for what the default stream queued before (its weights' loads); a runner that
does so everywhere it touches the device needs no other synchronisation.
"""

from __future__ import annotations

from typing import Any

from ._batcher import Priority

__all__ = ["priority_stream"]


def priority_stream(device: Any, priority: Priority) -> Any | None:
    """A new stream on ``device`` at the highest priority for `Priority.REALTIME`, the lowest
    otherwise; ``None`` off CUDA (``torch.cuda.stream(None)`` is then a no-op)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    least, greatest = torch.cuda.Stream.priority_range()
    level = greatest if priority is Priority.REALTIME else least
    stream = torch.cuda.Stream(device=device, priority=level)
    stream.wait_stream(torch.cuda.current_stream(device))
    return stream
