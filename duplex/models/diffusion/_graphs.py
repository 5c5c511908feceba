"""CUDA graphs for an image pipeline's three networks: each call becomes one graph replay.

Eager, a Stable-Diffusion-sized UNet step is bound by the CPU that launches its kernels
(about a thousand a step): measured on one H200 beside a 64-session Moshi engine, a
512x512 step took about 66 ms, wider than the 45 ms left between realtime ticks, so no
step fitted the slack; and the launching thread held the GIL the tick loop needed to hand
its outputs on. A captured graph replays the same kernels from one call. With the UNet
graphed, the text encoder (two calls an image with guidance) and the VAE decode (a few
hundred launches) were what was left of an image's Python between kernels, the time the
pipeline's thread holds the GIL the engine process's tick loop also needs: they are
graphed the same way.

Written here, not taken from ``torch.compile(mode="reduce-overhead")``: that compiles each
network first (minutes) and again per shape; a capture by hand needs no compiler and
costs two warm calls. A `GraphTable` keys its graphs by what fixes their kernels (the input
tensors' shapes and dtypes); a shape seen first is captured on its first use (that call
runs long once), up to ``max_graphs``; any call the capture does not cover (extra
arguments, CPU tensors, a full table, VAE tiling) runs eagerly, so the output is the eager
pipeline's either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, final

__all__ = [
    "GraphTable",
    "GraphedDecoder",
    "GraphedDenoiser",
    "GraphedTextEncoder",
    "graph_pipeline",
]


@final
@dataclass(slots=True)
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph
    inputs: tuple[Any, ...]
    out: Any


def _cloned(out: Any) -> Any:
    """``out`` (a tensor, a tuple of them or a transformers ``ModelOutput``) with its
    tensors copied out of the graph's memory: the next replay overwrites them."""
    import torch

    if torch.is_tensor(out):
        return out.clone()
    if isinstance(out, tuple):
        return tuple(_cloned(item) for item in out)
    return type(out)(**{key: _cloned(value) for key, value in out.items()})


@final
class GraphTable:
    """``fn(*tensors)`` replayed from a graph captured per input shape and dtype.

    Args:
        fn: a function of CUDA tensors only, with no host-side control flow that depends
            on their values (the networks' forwards are).
        max_graphs: shapes kept captured; later new shapes run eagerly.
    """

    def __init__(self, fn: Callable[..., Any], *, max_graphs: int = 4) -> None:
        self._fn = fn
        self._graphs: dict[tuple[Any, ...], _Graph] = {}
        self._max_graphs = max_graphs
        self.captures = 0
        self.replays = 0
        self.eager_calls = 0

    def __call__(self, *tensors: Any) -> Any:
        import torch

        # CPU first: a CPU-only torch cannot even ask whether a stream captures
        if not all(t.is_cuda for t in tensors) or torch.cuda.is_current_stream_capturing():
            return self.eager(*tensors)
        key = tuple((tuple(t.shape), t.dtype) for t in tensors)
        graph = self._graphs.get(key)
        if graph is None:
            if len(self._graphs) >= self._max_graphs:
                return self.eager(*tensors)
            graph = self._graphs[key] = self._capture(tensors)
        for static, value in zip(graph.inputs, tensors, strict=True):
            static.copy_(value)
        graph.graph.replay()
        self.replays += 1
        return _cloned(graph.out)

    def eager(self, *args: Any) -> Any:
        """A call outside the graphs (counted)."""
        self.eager_calls += 1
        return self._fn(*args)

    def _capture(self, tensors: tuple[Any, ...]) -> _Graph:
        import torch

        device = tensors[0].device
        static = tuple(t.clone() for t in tensors)
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up: lazy inits and autotuning stay out of the graph
            for _ in range(2):
                self._fn(*static)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread-local: the realtime engine's thread keeps launching while this one captures
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = self._fn(*static)
        self.captures += 1
        return _Graph(graph, static, out)


@final
class GraphedDenoiser:
    """Stands in for ``unet.forward`` (diffusers' ``forward(sample, timestep,
    encoder_hidden_states, ..., return_dict)``): graphed where only those three come."""

    def __init__(self, denoiser: Any, *, max_graphs: int = 4) -> None:
        eager = denoiser.forward

        def step(sample: Any, timestep: Any, context: Any) -> Any:
            return eager(sample, timestep, context, return_dict=False)[0]

        self.table = GraphTable(step, max_graphs=max_graphs)
        self._eager = eager
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
            and torch.is_tensor(timestep)
        )
        if not covered:
            self.table.eager_calls += 1
            return self._eager(
                sample, timestep, encoder_hidden_states, *args, return_dict=return_dict, **kwargs
            )
        # a host timestep (`_timesteps_on_host`) goes over without waiting for the device
        timestep = timestep.to(sample.device, non_blocking=True)
        return (self.table(sample, timestep, encoder_hidden_states),)


@final
class GraphedTextEncoder:
    """Stands in for a transformers text encoder's ``forward(input_ids, ...)``: graphed when
    only the token ids come (the pipeline's call without ``clip_skip`` or a mask)."""

    def __init__(self, encoder: Any, *, max_graphs: int = 4) -> None:
        self._eager = encoder.forward
        self.table = GraphTable(self._eager, max_graphs=max_graphs)
        encoder.forward = self

    def __call__(self, input_ids: Any = None, *args: Any, **kwargs: Any) -> Any:
        if args or input_ids is None or any(value is not None for value in kwargs.values()):
            self.table.eager_calls += 1
            return self._eager(input_ids, *args, **kwargs)
        return self.table(input_ids)


@final
class GraphedDecoder:
    """Stands in for an ``AutoencoderKL``'s ``decode(z, return_dict, generator)`` (the
    generator is unused by that VAE): graphed unless tiling or slicing is on, or a dict is
    asked for."""

    def __init__(self, vae: Any, *, max_graphs: int = 4) -> None:
        eager = vae.decode
        self._vae = vae
        self._eager = eager
        self.table = GraphTable(lambda z: eager(z, return_dict=False)[0], max_graphs=max_graphs)
        vae.decode = self

    def __call__(self, z: Any, return_dict: bool = True, generator: Any = None) -> Any:
        split = getattr(self._vae, "use_tiling", False) or getattr(self._vae, "use_slicing", False)
        if return_dict or split:
            self.table.eager_calls += 1
            return self._eager(z, return_dict=return_dict, generator=generator)
        return (self.table(z),)


def graph_pipeline(pipeline: Any) -> list[GraphTable]:
    """Graph what an image pipeline has of the three: its ``unet``, its ``text_encoder``
    (a transformers model) and its ``vae`` (an ``AutoencoderKL``). Returns their tables."""
    tables = []
    if getattr(pipeline, "unet", None) is not None:
        tables.append(GraphedDenoiser(pipeline.unet).table)
    encoder = getattr(pipeline, "text_encoder", None)
    if encoder is not None and hasattr(encoder, "config"):
        tables.append(GraphedTextEncoder(encoder).table)
    vae = getattr(pipeline, "vae", None)
    if vae is not None and type(vae).__name__ == "AutoencoderKL":
        tables.append(GraphedDecoder(vae).table)
    return tables
