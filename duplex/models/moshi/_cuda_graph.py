"""Slot-prefix buckets for the static LM step, replayed as CUDA graphs on the GPU.

The eager step is launch-bound (thousands of small kernels a frame). A CUDA
graph replays all of them with one host call, but only for fixed shapes and
fixed buffers. `LMStep` steps the slot prefix ``[0, P)`` (attention reads the
rings in place), so a step of slots ``S`` runs the smallest bucket ``P >=
max(S) + 1`` (powers of two below ``max_slots``, then ``max_slots``) with
``active`` marking ``S``: the other prefix rows are computed and discarded
and their slots' state is left as it was. The engine allocates the lowest
free slot first and steps every live slot each tick, so ``S`` is close to a
prefix; a lone session on a high slot id costs a large bucket.

Each bucket has static input buffers (active mask, user codes, forced
tokens, all indexed by slot); its graph is captured lazily on first use,
after warm-up runs on a side stream (as the PyTorch CUDA graph docs require)
with no row active, so warm-up changes no slot. All graphs share one memory
pool: they are replayed one at a time and their outputs are copied out before
the next replay. The top-k caps are part of the key (they fix ``topk``
widths), so a wider cap captures anew.

With ``use_graphs=False`` (the CPU, or ``cuda_graphs=False``) the same step
runs eagerly, so CPU tests cover the exact function that gets captured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

import numpy as np
import torch

from duplex.progress import note

from ._graph_capture import bucket_sizes, capture_graph, smallest_bucket
from ._step import LMStep

__all__ = ["CudaGraphStep"]


@dataclass(slots=True)
class _Bucket:
    """Static buffers of one (prefix size, top-k caps) and, once captured, its graph."""

    active: torch.Tensor
    user: torch.Tensor
    forced: torch.Tensor
    output: torch.Tensor | None = None
    graph: torch.cuda.CUDAGraph | None = field(default=None, repr=False)


@final
class CudaGraphStep:
    """Runs `LMStep` on the bucketed slot prefix of a batch, replaying a graph when enabled.

    Args:
        step: the static step (its `SlotState` gives the device).
        max_slots: slots in the pool (the largest bucket).
        use_graphs: capture and replay CUDA graphs (needs a CUDA device).
    """

    def __init__(self, step: LMStep, *, max_slots: int, use_graphs: bool) -> None:
        device = step.state.frames.device
        if use_graphs and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, the model is on {device}")
        self._step = step
        self._device = device
        self._sizes = bucket_sizes(max_slots)
        self._use_graphs = use_graphs
        self._buckets: dict[tuple[int, tuple[int, int]], _Bucket] = {}
        self._pool = torch.cuda.graph_pool_handle() if use_graphs else None

    @property
    def use_graphs(self) -> bool:
        """Whether steps replay captured graphs."""
        return self._use_graphs

    @property
    def captured(self) -> int:
        """Graphs captured so far (one per bucket size and top-k caps in use)."""
        return sum(b.graph is not None for b in self._buckets.values())

    def prepare(self, top_k_caps: tuple[int, int]) -> None:
        """Make (and on CUDA capture) every bucket for ``top_k_caps`` now, so no later
        step pays for a capture; no row is active, so no slot changes."""
        for i, size in enumerate(self._sizes, 1):
            note(
                f"capturing the LM step's CUDA graphs: bucket {size} ({i} of {len(self._sizes)})",
                done=i - 1,
                total=len(self._sizes),
            )
            self._bucket(size, top_k_caps)

    def bucket_for(self, prefix: int) -> int:
        """The bucket that runs slots ``[0, prefix)``: the smallest size >= ``prefix``."""
        return smallest_bucket(self._sizes, prefix)

    def __call__(
        self,
        slots: np.ndarray,
        user_codes: torch.Tensor,
        forced: torch.Tensor | None,
        top_k_caps: tuple[int, int],
    ) -> torch.Tensor:
        """Step ``slots`` (distinct); a copy of their packed output rows, in their order."""
        size = self.bucket_for(int(slots.max()) + 1)
        bucket = self._bucket(size, top_k_caps)
        mask = np.zeros(size, dtype=np.bool_)
        mask[slots] = True
        index = torch.from_numpy(slots).to(self._device)
        bucket.active.copy_(torch.from_numpy(mask))
        bucket.user.zero_()  # inactive rows: any valid codes (they are never stored)
        bucket.user.index_copy_(0, index, user_codes)
        bucket.forced.fill_(-1)
        if forced is not None:
            bucket.forced.index_copy_(0, index, forced)
        if bucket.graph is not None:
            bucket.graph.replay()
            assert bucket.output is not None
            output = bucket.output
        else:
            output = self._run(bucket, top_k_caps)
        return output.index_select(0, index)

    def _run(self, bucket: _Bucket, top_k_caps: tuple[int, int]) -> torch.Tensor:
        return self._step(bucket.active, bucket.user, bucket.forced, top_k_caps)

    def _bucket(self, size: int, top_k_caps: tuple[int, int]) -> _Bucket:
        key = (size, top_k_caps)
        bucket = self._buckets.get(key)
        if bucket is None:
            config = self._step.model.config
            long = {"dtype": torch.long, "device": self._device}
            bucket = _Bucket(
                active=torch.zeros(size, dtype=torch.bool, device=self._device),
                user=torch.zeros(size, config.user_q, **long),
                forced=torch.full((size, 1 + config.agent_q), -1, **long),
            )
            if self._use_graphs:
                self._capture(bucket, top_k_caps)
            self._buckets[key] = bucket
        return bucket

    def _capture(self, bucket: _Bucket, top_k_caps: tuple[int, int]) -> None:
        """Warm up and capture; no row is active, so no slot changes."""
        bucket.graph, bucket.output = capture_graph(
            lambda: self._run(bucket, top_k_caps), device=self._device, pool=self._pool
        )
