"""CUDA graphs for a pipeline's denoiser: one diffusion step becomes one graph replay.

Eager, a Stable-Diffusion-sized UNet step is bound by the CPU that launches its kernels
(about a thousand a step): measured on one H200 beside a 64-session Moshi engine, a
512x512 step took about 66 ms, wider than the 45 ms left between realtime ticks, so no
step fitted the slack; and the launching thread held the GIL the tick loop needed to hand
its outputs on. A captured graph replays the same kernels from one call.

Written here, not taken from ``torch.compile(mode="reduce-overhead")``: that compiles the
whole UNet first (minutes) and again per shape; a capture by hand needs no compiler and
costs two warm steps. Graphs are keyed by what fixes their kernels (the latents', the
prompt embeddings' and the timestep's shapes and dtypes); a shape seen first is captured
on its first use (that diffusion step runs long once), up to ``max_graphs``; any call the
capture does not cover (extra conditioning, ``return_dict=True``, CPU tensors, a full
table) runs eagerly, so the output is the eager pipeline's either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, final

__all__ = ["GraphedDenoiser"]

_Key = tuple[Any, ...]


@final
@dataclass(slots=True)
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph
    sample: Any
    timestep: Any
    context: Any
    out: Any


@final
class GraphedDenoiser:
    """Stands in for ``denoiser.forward``: replays a captured graph where one fits.

    Args:
        denoiser: the pipeline's UNet (a ``torch.nn.Module`` with diffusers'
            ``forward(sample, timestep, encoder_hidden_states, ..., return_dict)``).
        max_graphs: shapes kept captured; later new shapes run eagerly.
    """

    def __init__(self, denoiser: Any, *, max_graphs: int = 4) -> None:
        self._eager = denoiser.forward
        self._graphs: dict[_Key, _Graph] = {}
        self._max_graphs = max_graphs
        self.captures = 0
        self.replays = 0
        self.eager_calls = 0
        denoiser.forward = self  # the module's __call__ (hooks included) now lands here

    def __call__(
        self,
        sample: Any,
        timestep: Any,
        encoder_hidden_states: Any,
        *args: Any,
        return_dict: bool = True,
        **kwargs: Any,
    ) -> Any:
        import torch

        covered = (
            not args
            and not return_dict
            and all(value is None for value in kwargs.values())
            and sample.is_cuda
            and torch.is_tensor(timestep)
            and not torch.cuda.is_current_stream_capturing()
        )
        if not covered:
            self.eager_calls += 1
            return self._eager(
                sample, timestep, encoder_hidden_states, *args, return_dict=return_dict, **kwargs
            )
        timestep = timestep.to(sample.device)
        key = (
            tuple(sample.shape),
            sample.dtype,
            tuple(encoder_hidden_states.shape),
            encoder_hidden_states.dtype,
            tuple(timestep.shape),
            timestep.dtype,
        )
        graph = self._graphs.get(key)
        if graph is None:
            if len(self._graphs) >= self._max_graphs:
                self.eager_calls += 1
                return self._eager(sample, timestep, encoder_hidden_states, return_dict=False)
            graph = self._graphs[key] = self._capture(sample, timestep, encoder_hidden_states)
        graph.sample.copy_(sample)
        graph.timestep.copy_(timestep)
        graph.context.copy_(encoder_hidden_states)
        graph.graph.replay()
        self.replays += 1
        return (graph.out.clone(),)  # the next replay overwrites the static output

    def _capture(self, sample: Any, timestep: Any, context: Any) -> _Graph:
        import torch

        static = (sample.clone(), timestep.clone(), context.clone())
        side = torch.cuda.Stream(device=sample.device)
        side.wait_stream(torch.cuda.current_stream(sample.device))
        with torch.cuda.stream(side):  # warm-up: lazy inits and autotuning stay out of the graph
            for _ in range(2):
                self._eager(*static, return_dict=False)
        torch.cuda.current_stream(sample.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread-local: the realtime engine's thread keeps launching while this one captures
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = self._eager(*static, return_dict=False)[0]
        self.captures += 1
        return _Graph(graph, *static, out)
