"""Lazy CUDA graph capture of one static-buffer function (warm-up on a side stream)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

__all__ = ["bucket_sizes", "capture_graph", "smallest_bucket"]

T = TypeVar("T")


def bucket_sizes(max_slots: int) -> tuple[int, ...]:
    """Padded batch sizes: 1, 2, 4, ... below ``max_slots``, then ``max_slots``."""
    sizes = []
    size = 1
    while size < max_slots:
        sizes.append(size)
        size *= 2
    return (*sizes, max_slots)


def smallest_bucket(sizes: tuple[int, ...], rows: int) -> int:
    """The smallest bucket size that holds ``rows``.

    Raises:
        ValueError: ``rows`` is larger than the largest bucket.
    """
    for size in sizes:
        if size >= rows:
            return size
    raise ValueError(f"{rows} rows exceed the largest bucket of {sizes[-1]} slots")


WARMUP_RUNS = 2
"""Eager runs before capture: they initialize cuBLAS / cuDNN handles and autotuning."""


def capture_graph(
    fn: Callable[[], T],
    *,
    device: torch.device,
    pool: tuple[int, int] | None,
    warmup: int = WARMUP_RUNS,
) -> tuple[torch.cuda.CUDAGraph, T]:
    """Warm ``fn`` up on a side stream (as the PyTorch docs require), then capture one call.

    ``fn`` must read and write only fixed buffers and make no host sync; its
    warm-up runs really execute, so it must be harmless to run (e.g. touch
    only a scratch slot). Returns the graph and the call's output, whose
    memory each replay overwrites.
    """
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        output = fn()
    return graph, output
