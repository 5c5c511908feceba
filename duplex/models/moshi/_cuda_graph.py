"""Batch-size buckets for the static LM step, replayed as CUDA graphs on the GPU.

The eager step is launch-bound (thousands of small kernels a frame). A CUDA
graph replays all of them with one host call, but only for fixed shapes and
fixed buffers. So a batch of ``B`` rows is padded to the smallest bucket
(powers of two below ``max_slots``, then ``max_slots``) with rows that step
the *scratch* slot (`SlotState.scratch`): their outputs are dropped and they
read and write only the scratch slot's rows, so real slots never see them.

Each bucket has static input buffers (slot indices, user codes, forced
tokens); its graph is captured lazily on first use, after warm-up runs on a
side stream (as the PyTorch CUDA graph docs require) that step only the
scratch slot. All graphs share one memory pool: they are replayed one at a
time and their outputs are copied out before the next replay. The top-k caps
are part of the key (they fix ``topk`` widths), so a wider cap captures anew.

With ``use_graphs=False`` (the CPU, or ``cuda_graphs=False``) the same padded
step runs eagerly, so CPU tests cover the exact function that gets captured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

import numpy as np
import torch

from ._step import LMStep

__all__ = ["CudaGraphStep", "bucket_sizes"]

_WARMUP_RUNS = 2


def bucket_sizes(max_slots: int) -> tuple[int, ...]:
    """Padded batch sizes: 1, 2, 4, ... below ``max_slots``, then ``max_slots``."""
    sizes = []
    size = 1
    while size < max_slots:
        sizes.append(size)
        size *= 2
    return (*sizes, max_slots)


@dataclass(slots=True)
class _Bucket:
    """Static buffers of one (bucket size, top-k caps) and, once captured, its graph."""

    slots: torch.Tensor
    user: torch.Tensor
    forced: torch.Tensor
    output: torch.Tensor | None = None
    graph: torch.cuda.CUDAGraph | None = field(default=None, repr=False)


@final
class CudaGraphStep:
    """Pads a batch to its bucket and runs `LMStep` there, replaying a graph when enabled.

    Args:
        step: the static step (its `SlotState` gives the scratch slot and device).
        max_slots: real slots in the pool (the largest bucket).
        use_graphs: capture and replay CUDA graphs (needs a CUDA device).
    """

    def __init__(self, step: LMStep, *, max_slots: int, use_graphs: bool) -> None:
        device = step.state.frames.device
        if use_graphs and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, the model is on {device}")
        self._step = step
        self._device = device
        self._scratch = step.state.scratch
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

    def bucket_for(self, batch: int) -> int:
        """The padded size of a batch of ``batch`` rows."""
        for size in self._sizes:
            if size >= batch:
                return size
        raise ValueError(f"batch of {batch} exceeds the pool of {self._sizes[-1]} slots")

    def __call__(
        self,
        slots: np.ndarray,
        user_codes: torch.Tensor,
        forced: torch.Tensor | None,
        top_k_caps: tuple[int, int],
    ) -> torch.Tensor:
        """Step ``slots`` (distinct, real ones); a copy of their ``B`` packed output rows."""
        batch = len(slots)
        size = self.bucket_for(batch)
        bucket = self._bucket(size, top_k_caps)
        padded = np.full(size, self._scratch, dtype=np.int64)
        padded[:batch] = slots
        bucket.slots.copy_(torch.from_numpy(padded), non_blocking=False)
        bucket.user[:batch].copy_(user_codes)
        if forced is None:
            bucket.forced.fill_(-1)
        else:
            bucket.forced[:batch].copy_(forced)
            bucket.forced[batch:].fill_(-1)
        if bucket.graph is not None:
            bucket.graph.replay()
            assert bucket.output is not None
            output = bucket.output
        else:
            output = self._run(bucket, top_k_caps)
        return output[:batch].clone()

    def _run(self, bucket: _Bucket, top_k_caps: tuple[int, int]) -> torch.Tensor:
        return self._step(bucket.slots, bucket.user, bucket.forced, top_k_caps)

    def _bucket(self, size: int, top_k_caps: tuple[int, int]) -> _Bucket:
        key = (size, top_k_caps)
        bucket = self._buckets.get(key)
        if bucket is None:
            config = self._step.model.config
            long = {"dtype": torch.long, "device": self._device}
            bucket = _Bucket(
                slots=torch.full((size,), self._scratch, **long),
                user=torch.zeros(size, config.user_q, **long),
                forced=torch.full((size, 1 + config.agent_q), -1, **long),
            )
            if self._use_graphs:
                self._capture(bucket, top_k_caps)
            self._buckets[key] = bucket
        return bucket

    def _capture(self, bucket: _Bucket, top_k_caps: tuple[int, int]) -> None:
        """Warm up on a side stream, then capture; the buffers still point at the scratch slot."""
        side = torch.cuda.Stream(self._device)
        side.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(side):
            for _ in range(_WARMUP_RUNS):
                self._run(bucket, top_k_caps)
        torch.cuda.current_stream(self._device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            bucket.output = self._run(bucket, top_k_caps)
        bucket.graph = graph
