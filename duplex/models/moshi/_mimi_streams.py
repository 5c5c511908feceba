"""Per-slot streaming state of the Mimi codec, stepped for any subset of slots.

`MimiStreams` owns every per-slot tensor of one `MimiModel`: the conv
left-context and transposed-conv overlap buffers of each direction (packed in
one ``[max_slots + 1, n]`` row per slot, so a step is one gather and one
scatter), the KV rings of the encoder and decoder transformers (``context``
latent steps per slot) and the device frame counters that give RoPE positions
and the first-frame replicate padding. Encode and decode have separate
counters: a slot may start decoding later than it starts encoding.

`reset_slot` zeroes that slot's conv row and counters and nothing else; ring
rows the slot has not written since are masked by position (as in `KVRing`),
so the rings are never cleared. Each listed slot advances by exactly one
80 ms frame per call, equal to the reference ``MimiModel`` under
``streaming(batch_size)`` fed one frame at a time.

CUDA graphs. The eager frame is launch-bound (hundreds of small kernels), so
on CUDA each direction's frame replays a graph per batch bucket (the LM's
`bucket_sizes`; decode also per code count ``K``). A frame is a fixed
function of static buffers: the bucket's slot ids and inputs, the state rows
it gathers by slot id and scatters back, and the device counters; nothing in
it reads the host. A batch of ``B`` rows is padded to its bucket with rows
of the *scratch* slot (row ``max_slots`` of every state tensor, zero input):
their outputs are dropped, they read and write only the scratch rows, and
every frame ends by making the scratch slot fresh again, so it never drifts.
Graphs are captured lazily on a bucket's first use, after warm-up runs that
step only the scratch slot. With ``cuda_graphs=False`` (or on the CPU) the
same padded frame runs eagerly, so CPU tests cover what gets captured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import final

import numpy as np
import torch

from duplex.kernels import triton_available
from duplex.progress import note

from ._graph_capture import bucket_sizes, capture_graph, smallest_bucket
from ._mimi import KVRingView, MimiModel
from ._seanet import ConvState, StatefulConv

__all__ = ["MimiStreams"]


@final
class _Direction:
    """Conv buffers, KV ring and frame counters of one direction (encode or decode).

    Every state tensor has ``max_slots + 1`` slot rows: the last is the scratch slot.
    """

    def __init__(
        self,
        layers: list[StatefulConv],
        model: MimiModel,
        max_slots: int,
        device: torch.device,
        dtype: torch.dtype,
        kv_dtype: torch.dtype,
        ring_kernel: bool,
    ) -> None:
        config = model.config
        self.ring_kernel = ring_kernel
        rows = max_slots + 1
        self.scratch = max_slots
        self.shapes = [layer.state_shape for layer in layers]
        self.sizes = [c * n for c, n in self.shapes]
        self.convs = torch.zeros(rows, sum(self.sizes), device=device, dtype=dtype)
        ring = (
            config.transformer_layers,
            rows,
            config.transformer_heads,
            config.context,
            config.head_dim,
        )
        self.keys = torch.zeros(ring, device=device, dtype=kv_dtype)
        self.values = torch.zeros(ring, device=device, dtype=kv_dtype)
        self.frames = torch.zeros(rows, dtype=torch.long, device=device)
        self.host_frames = np.zeros(max_slots, dtype=np.int64)  # mirror for `frames()`
        self.latent_steps = config.latent_steps

    def reset(self, slot: int) -> None:
        """Zero one slot's conv row and counter (its ring rows are masked by position)."""
        self.convs[slot].zero_()
        self.frames[slot].zero_()
        self.host_frames[slot] = 0

    def step(
        self, slots: torch.Tensor, run: Callable[[ConvState, KVRingView], torch.Tensor]
    ) -> torch.Tensor:
        """One frame of ``run`` for device ``slots`` (padding rows: the scratch slot).

        Gathers the rows, runs, scatters them back and leaves the scratch slot
        fresh; no host sync, so it can be captured.
        """
        rows = self.convs.index_select(0, slots)
        frames = self.frames.index_select(0, slots)
        batch = rows.shape[0]
        buffers = [
            chunk.view(batch, *shape)
            for chunk, shape in zip(rows.split(self.sizes, dim=1), self.shapes, strict=True)
        ]
        state = ConvState(buffers, frames == 0)
        offsets = frames * self.latent_steps
        out = run(state, KVRingView(self.keys, self.values, slots, offsets, self.ring_kernel))
        packed = torch.cat([b.reshape(batch, -1) for b in state.buffers], dim=1)
        self.convs.index_copy_(0, slots, packed)
        self.frames.index_copy_(0, slots, frames + 1)
        self.convs[self.scratch].zero_()
        self.frames[self.scratch].zero_()
        return out


@dataclass(slots=True)
class _Bucket:
    """Static buffers of one (direction, bucket size, input width) and, once captured, its graph."""

    slots: torch.Tensor
    inputs: torch.Tensor
    output: torch.Tensor | None = None
    graph: torch.cuda.CUDAGraph | None = field(default=None, repr=False)


@final
class MimiStreams:
    """Streams 80 ms frames through one `MimiModel` for a fixed pool of slots.

    Args:
        model: the codec (its device and dtype are the streams').
        max_slots: slot pool size; ring memory is ``(max_slots + 1) * config.kv_bytes_per_slot()``
            (one scratch slot for bucket padding).
        num_codebooks: codes `encode` returns per frame (default ``config.num_codebooks``).
        kv_dtype: ring storage dtype (default: the model's).
        cuda_graphs: replay frames as CUDA graphs per batch bucket (default: on when the
            model is on CUDA).

    Raises:
        ValueError: ``max_slots < 1``, ``num_codebooks`` outside ``1..n_q``, or
            ``cuda_graphs=True`` off CUDA.
    """

    def __init__(
        self,
        model: MimiModel,
        *,
        max_slots: int,
        num_codebooks: int | None = None,
        kv_dtype: torch.dtype | None = None,
        cuda_graphs: bool | None = None,
        ring_kernel: bool | None = None,
    ) -> None:
        """``ring_kernel``: the transformers attend with the ring kernel, reading the rings
        in place (`KVRingView.kernel`); None means on CUDA with Triton for 16-bit rings,
        where it took Mimi's encode + decode at B=128 in bf16 from 9.7 to 6.6 ms on an H100
        (docs/benchmarks.md, "Values as words, and Mimi's rings read in place"). float32
        rings stay gathered until timed (the kernel's float32 products run without tensor
        cores), and off CUDA the rings are gathered for SDPA (Triton's interpreter would be
        far slower)."""
        if max_slots < 1:
            raise ValueError("max_slots must be at least 1")
        weight = next(model.parameters())
        on_cuda = weight.device.type == "cuda"
        if cuda_graphs and not on_cuda:
            raise ValueError(f"CUDA graphs need a CUDA device, the model is on {weight.device}")
        self._model = model
        self._config = model.config
        self._num_codebooks = model.check_codebooks(num_codebooks)
        self._max_slots = max_slots
        self._device = weight.device
        self._dtype = weight.dtype
        if ring_kernel is None:
            ring_bytes = (kv_dtype or weight.dtype).itemsize
            ring_kernel = on_cuda and triton_available() and ring_bytes == 2
        args = (
            model,
            max_slots,
            weight.device,
            weight.dtype,
            kv_dtype or weight.dtype,
            ring_kernel,
        )
        self._encode = _Direction(model.encoder_convs, *args)
        self._decode = _Direction(model.decoder_convs, *args)
        self._use_graphs = on_cuda if cuda_graphs is None else cuda_graphs
        self._sizes = bucket_sizes(max_slots)
        self._buckets: dict[tuple[str, int, int], _Bucket] = {}
        self._pool = torch.cuda.graph_pool_handle() if self._use_graphs else None

    @property
    def model(self) -> MimiModel:
        """The codec."""
        return self._model

    @property
    def max_slots(self) -> int:
        """Slot pool size."""
        return self._max_slots

    @property
    def num_codebooks(self) -> int:
        """Codes per frame that `encode` returns."""
        return self._num_codebooks

    @property
    def frame_size(self) -> int:
        """Samples per frame (1920)."""
        return self._config.frame_size

    @property
    def ring_kernel(self) -> bool:
        """Whether the transformers read their rings in place with the ring kernel."""
        return self._encode.ring_kernel

    @property
    def use_graphs(self) -> bool:
        """Whether frames replay captured CUDA graphs."""
        return self._use_graphs

    @property
    def captured(self) -> int:
        """Graphs captured so far (one per direction, bucket and decode code count in use)."""
        return sum(b.graph is not None for b in self._buckets.values())

    def prepare(self, decode_widths: Sequence[int]) -> None:
        """Make (and on CUDA capture) every encode bucket, and every decode bucket for
        each code count in ``decode_widths``, now; only the scratch slot is stepped."""
        for i, size in enumerate(self._sizes, 1):
            note(
                f"capturing Mimi's CUDA graphs: bucket {size} ({i} of {len(self._sizes)})",
                done=i - 1,
                total=len(self._sizes),
            )
            self._bucket("encode", size, self.frame_size)
            for width in decode_widths:
                self._bucket("decode", size, width)

    def bucket_for(self, batch: int) -> int:
        """Rows a batch of ``batch`` slots runs as: the smallest bucket size >= ``batch``."""
        return smallest_bucket(self._sizes, batch)

    def frames(self, slot: int) -> tuple[int, int]:
        """Frames the slot has encoded and decoded since its last reset."""
        self._check_slot(slot)
        return int(self._encode.host_frames[slot]), int(self._decode.host_frames[slot])

    def reset_slot(self, slot: int) -> None:
        """Make one slot fresh in both directions; no other slot is touched."""
        self._check_slot(slot)
        self._encode.reset(slot)
        self._decode.reset(slot)

    @torch.no_grad()
    def encode(self, slots: Sequence[int] | torch.Tensor, pcm: torch.Tensor) -> torch.Tensor:
        """Encode one frame for each listed slot.

        Args:
            slots: distinct slot ids (any subset, any order).
            pcm: ``[B, frame_size]`` float samples, one row per slot.

        Returns:
            ``[B, num_codebooks]`` int64 codes.

        Raises:
            ValueError: bad slots or shapes.
        """
        slot_np = self._slots(slots)
        if tuple(pcm.shape) != (len(slot_np), self.frame_size):
            raise ValueError(f"pcm must have shape ({len(slot_np)}, {self.frame_size})")
        size = self.bucket_for(len(slot_np))
        bucket = self._bucket("encode", size, self.frame_size)
        codes = self._run(bucket, slot_np, pcm, self._encode_frame)
        self._encode.host_frames[slot_np] += 1
        return codes[:, :, 0]

    @torch.no_grad()
    def decode(
        self,
        slots: Sequence[int] | torch.Tensor,
        codes: torch.Tensor,
        *,
        check_values: bool = True,
    ) -> torch.Tensor:
        """Decode one frame for each listed slot.

        Args:
            slots: distinct slot ids (any subset, any order).
            codes: ``[B, K]`` codes in ``[0, bins)``, ``1 <= K <= n_q`` (semantic first).
            check_values: verify the code range; that reads the codes on the host (a
                device sync), so a caller whose codes are in range by construction
                (the engine runner, sampling from ``card`` logits) turns it off.

        Returns:
            ``[B, frame_size]`` samples in the model's dtype.

        Raises:
            ValueError: bad slots, shapes, or code values (e.g. the LM's ``-2`` placeholders).
        """
        slot_np = self._slots(slots)
        n_q = self._config.n_q
        if codes.dim() != 2 or codes.shape[0] != len(slot_np) or not 1 <= codes.shape[1] <= n_q:
            raise ValueError(f"codes must have shape ({len(slot_np)}, K) with 1 <= K <= {n_q}")
        if codes.dtype.is_floating_point:
            raise ValueError("codes must be integers")
        if check_values and (int(codes.min()) < 0 or int(codes.max()) >= self._config.bins):
            raise ValueError(f"codes must lie in [0, {self._config.bins})")
        size = self.bucket_for(len(slot_np))
        bucket = self._bucket("decode", size, codes.shape[1])
        pcm = self._run(bucket, slot_np, codes, self._decode_frame)
        self._decode.host_frames[slot_np] += 1
        return pcm[:, 0]

    def _encode_frame(self, bucket: _Bucket) -> torch.Tensor:
        """The captured encode: ``[size, frame_size]`` pcm -> ``[size, num_codebooks, 1]``."""
        x = bucket.inputs[:, None]
        model, count = self._model, self._num_codebooks
        return self._encode.step(
            bucket.slots, lambda convs, ring: model.encode_frames(x, convs, ring, count)
        )

    def _decode_frame(self, bucket: _Bucket) -> torch.Tensor:
        """The captured decode: ``[size, K]`` codes -> ``[size, 1, frame_size]``."""
        x = bucket.inputs[:, :, None]
        model = self._model
        return self._decode.step(
            bucket.slots, lambda convs, ring: model.decode_frames(x, convs, ring)
        )

    def _run(
        self,
        bucket: _Bucket,
        slot_np: np.ndarray,
        inputs: torch.Tensor,
        frame: Callable[[_Bucket], torch.Tensor],
    ) -> torch.Tensor:
        """Fill the bucket (padding: scratch slot, zero input), run or replay, copy rows out."""
        batch = len(slot_np)
        padded = np.full(bucket.slots.shape[0], self._encode.scratch, dtype=np.int64)
        padded[:batch] = slot_np
        bucket.slots.copy_(torch.from_numpy(padded))
        bucket.inputs[batch:].zero_()
        bucket.inputs[:batch].copy_(inputs)
        if bucket.graph is None:
            return frame(bucket)[:batch]
        bucket.graph.replay()
        assert bucket.output is not None
        return bucket.output[:batch].clone()  # the next replay overwrites the output

    def _bucket(self, kind: str, size: int, width: int) -> _Bucket:
        key = (kind, size, width)
        bucket = self._buckets.get(key)
        if bucket is None:
            encode = kind == "encode"
            bucket = _Bucket(
                slots=torch.full((size,), self._encode.scratch, device=self._device),
                inputs=torch.zeros(
                    size,
                    width,
                    device=self._device,
                    dtype=self._dtype if encode else torch.long,
                ),
            )
            if self._use_graphs:
                frame = self._encode_frame if encode else self._decode_frame
                bucket.graph, bucket.output = capture_graph(
                    lambda: frame(bucket), device=self._device, pool=self._pool
                )
            self._buckets[key] = bucket
        return bucket

    def _slots(self, slots: Sequence[int] | torch.Tensor) -> np.ndarray:
        if isinstance(slots, torch.Tensor):
            slot_np = slots.detach().cpu().numpy().astype(np.int64).reshape(-1)
        else:
            slot_np = np.asarray(slots, dtype=np.int64).reshape(-1)
        if slot_np.size == 0 or len(np.unique(slot_np)) != slot_np.size:
            raise ValueError("need at least one slot and distinct slot ids")
        for slot in slot_np:
            self._check_slot(int(slot))
        return slot_np

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self._max_slots:
            raise ValueError(f"slot {slot} is outside the pool of {self._max_slots}")
