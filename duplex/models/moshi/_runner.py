"""The token-level Moshi runner: per-slot state and one batched step over any slots.

`MoshiRunner` owns every per-slot tensor (KV rings, the delayed token ring,
frame counters, sampling seeds and parameters: a `SlotState` on the device)
and steps any subset of slots given as indices, so sessions join and leave at
any frame while the others keep their cadence. `reset_slot` touches only that
slot's rows; it zeroes the slot's KV rings in every layer (one memset of
``kv_bytes_per_slot``, about half a millisecond on an H200 for the 7B),
because the static step's attention reads masked ring rows in place and
they must be finite. The token ring layout and the delays are described in
``_step.py``.

A step is one `LMStep` call: static shapes, no host sync, sampling noise from
counter-based hashes of each slot's seed and frame (``duplex/kernels/sampling.py``). It runs
the slot prefix ``[0, P)`` for the bucket ``P >= max(slots) + 1`` through
`CudaGraphStep`, which replays a captured graph per bucket on CUDA
(``cuda_graphs``, on by default there) and runs the same step eagerly
elsewhere; prefix rows not asked for are computed and discarded and keep
their state, so the cost follows the highest slot id stepped (the engine's
scheduler hands out the lowest free slot first). ``static_shapes=False``
instead runs the dynamic reference path (any slots, host ``max_len``,
`ring_attention_reference`) that tests compare against.

This runner speaks codes. `MoshiEngineRunner` (``_engine_runner.py``) wraps it
with the Mimi streams and the text table to make the engine's ``ModelRunner``
(PCM in, PCM and text out); it passes each session's `SlotSampling` (its seed)
through `reset_slot`, and replays PersonaPlex prompts through ``forced``
(``_prompt.py``). Still missing: a fused sampler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import final

import numpy as np
import torch

from duplex.kernels.sampling import as_int64

from .._interface import ModelSpec
from ._config import MoshiConfig
from ._cuda_graph import CudaGraphStep
from ._kv import KVDtype, KVRing
from ._lm import MoshiLM
from ._sampling import SamplingParams, effective_top_k
from ._step import UNGENERATED, LMStep, SlotState

__all__ = ["GREEDY", "MoshiRunner", "SlotSampling", "StepTokens"]

_TEXT_DEFAULT = SamplingParams(0.7, 25)
_AUDIO_DEFAULT = SamplingParams(0.8, 250)


@final
@dataclass(frozen=True, slots=True)
class SlotSampling:
    """One slot's sampling: its noise seed (any int, used mod 2^64) and text/audio parameters.

    Defaults are the reference's (text 0.7 / top-25, audio 0.8 / top-250).
    """

    seed: int = 0
    text: SamplingParams = _TEXT_DEFAULT
    audio: SamplingParams = _AUDIO_DEFAULT


GREEDY = SlotSampling(text=SamplingParams(0.0, 0), audio=SamplingParams(0.0, 0))
"""Argmax for both streams (deterministic, used for parity and isolation tests)."""


@final
@dataclass(frozen=True, slots=True)
class StepTokens:
    """One step's result, one row per stepped slot, in the order the slots were given.

    Args:
        slots: the slots stepped.
        text: ``[B]`` de-delayed text token (``-2`` while ``valid`` is false).
        audio: ``[B, agent_q]`` de-delayed audio codes for Mimi (``-2`` while invalid).
        valid: ``[B]`` the slot is past its first ``max_delay`` frames.
        sampled_text: ``[B]`` the text token chosen this step (undelayed).
        sampled_audio: ``[B, agent_q]`` the codebooks chosen this step (undelayed).
    """

    slots: tuple[int, ...]
    text: torch.Tensor = field(repr=False)
    audio: torch.Tensor = field(repr=False)
    valid: torch.Tensor = field(repr=False)
    sampled_text: torch.Tensor = field(repr=False)
    sampled_audio: torch.Tensor = field(repr=False)


@final
class MoshiRunner:
    """Steps a fixed pool of slots through one `MoshiLM`.

    Args:
        model: the LM (its device and dtype are the runner's).
        max_slots: slot pool size; KV memory is ``max_slots * config.kv_bytes_per_slot()``.
        kv_dtype: ring storage dtype (default: the model's).
        cuda_graphs: replay one CUDA graph per batch bucket (default: on when the model
            is on CUDA; refused elsewhere).
        static_shapes: False runs the dynamic reference step instead (host ``max_len``,
            `ring_attention_reference`, no padding, no graphs); for tests.
    """

    def __init__(
        self,
        model: MoshiLM,
        *,
        max_slots: int,
        kv_dtype: KVDtype | None = None,
        cuda_graphs: bool | None = None,
        static_shapes: bool = True,
    ) -> None:
        config = model.config
        weight = model.text_linear.weight
        self._model = model
        self._config = config
        self._device = weight.device
        self._spec = ModelSpec(
            name=config.name, supports_model_native_turn_policy=True, max_slots=max_slots
        )
        self._state = SlotState(
            config, max_slots=max_slots, device=self._device, kv_dtype=kv_dtype or weight.dtype
        )
        self._step = LMStep(model, self._state)
        if cuda_graphs is None:
            cuda_graphs = self._device.type == "cuda" and static_shapes
        if cuda_graphs and not static_shapes:
            raise ValueError("cuda_graphs needs static_shapes")
        self._static = static_shapes
        self._graphs = CudaGraphStep(self._step, max_slots=max_slots, use_graphs=cuda_graphs)
        self._frames = np.zeros(max_slots, dtype=np.int64)  # host mirror of state.frames
        self._sampling = [SlotSampling()] * max_slots
        self._top_k_caps = (1, 1)
        for slot in range(max_slots):
            self._set_sampling(slot, self._sampling[slot])

    @property
    def spec(self) -> ModelSpec:
        """Name and slot pool (sample rate and 80 ms frames are Mimi's)."""
        return self._spec

    @property
    def config(self) -> MoshiConfig:
        """The LM's configuration."""
        return self._config

    @property
    def model(self) -> MoshiLM:
        """The LM it steps."""
        return self._model

    @property
    def kv_ring(self) -> KVRing:
        """The per-slot KV rings (tests poke unfilled rows through this)."""
        return self._state.ring

    @property
    def graph_step(self) -> CudaGraphStep:
        """The bucketed step (whether it replays graphs, how many it captured)."""
        return self._graphs

    def prepare_graphs(self) -> None:
        """Capture the step's graph for every bucket at the current top-k caps (those of
        the default sampling) now, instead of on each bucket's first use."""
        self._graphs.prepare(self._top_k_caps)

    @property
    def top_k_caps(self) -> tuple[int, int]:
        """The (text, audio) top-k widths the step is built for now; a slot's sampling
        above them widens them for good (and, with CUDA graphs, captures new ones)."""
        return self._top_k_caps

    def sampling(self, slot: int) -> SlotSampling:
        """The slot's current sampling (seed and parameters)."""
        self._check_slot(slot)
        return self._sampling[slot]

    def frames(self, slot: int) -> int:
        """Frames the slot has stepped since its last reset."""
        return int(self._frames[slot])

    def reset_slot(self, slot: int, sampling: SlotSampling | None = None) -> None:
        """Make one slot fresh (frame 0, zeroed KV rings, its seed and parameters).

        No other slot is touched.
        """
        self._check_slot(slot)
        self._state.ring.clear(slot)
        self._frames[slot] = 0
        self._state.frames[slot] = 0
        self._state.tokens[slot] = UNGENERATED
        self._set_sampling(slot, sampling or SlotSampling())

    def seek(self, slot: int, frame: int) -> None:
        """Move one slot's frame counter to ``frame``, as if it had already run that long.

        For benchmarks: the next step attends over ``min(frame + 1, context)`` ring
        rows of the slot (whatever they hold: zeros after a reset; no real history
        is restored) and its RoPE position is ``frame``. The slot's token ring is
        set to token 0 in every stream, so once past ``max_delay`` its outputs are
        valid codes from the first step on. No other slot is touched.

        Raises:
            ValueError: bad slot or negative frame.
        """
        self._check_slot(slot)
        if frame < 0:
            raise ValueError(f"frame must be >= 0, got {frame}")
        self._frames[slot] = frame
        self._state.frames[slot] = frame
        self._state.tokens[slot] = 0

    @torch.no_grad()
    def step(
        self,
        slots: Sequence[int],
        user_codes: torch.Tensor,
        forced: torch.Tensor | None = None,
    ) -> StepTokens:
        """Run one frame for ``slots``: temporal step, text sampling, depth steps.

        Args:
            slots: distinct slot ids to step (any subset, any order).
            user_codes: ``[B, user_q]`` the user's Mimi codes for this frame.
            forced: optional ``[B, 1 + agent_q]`` tokens used instead of sampling where
                ``>= 0`` (negative: sample). They are in column (delayed) layout: they
                replace this step's ``sampled_*`` values, feed the next depth step and
                reach the output ``max_delay - delay`` frames later. Prompt replay
                (`MoshiEngineRunner`, ``_prompt.py``) forces whole columns through it.

        Raises:
            ValueError: bad slots or shapes.
        """
        config = self._config
        batch = len(slots)
        if batch == 0 or len(set(slots)) != batch:
            raise ValueError("step needs at least one slot and distinct slot ids")
        for slot in slots:
            self._check_slot(slot)
        if tuple(user_codes.shape) != (batch, config.user_q):
            raise ValueError(f"user_codes must have shape ({batch}, {config.user_q})")
        if forced is not None and tuple(forced.shape) != (batch, 1 + config.agent_q):
            raise ValueError(f"forced must have shape ({batch}, {1 + config.agent_q})")
        slot_np = np.asarray(slots, dtype=np.int64)
        user = user_codes.to(self._device, torch.long)
        if forced is not None:
            forced = forced.to(self._device, torch.long)
        if self._static:
            packed = self._graphs(slot_np, user, forced, self._top_k_caps)
        else:
            max_len = int(min(self._frames[slot_np].max() + 1, config.context))
            slot_t = torch.as_tensor(slot_np, device=self._device)
            if forced is None:
                forced = torch.full((batch, 1 + config.agent_q), -1, device=self._device)
            packed = self._step.reference(slot_t, user, forced, self._top_k_caps, max_len)
        self._frames[slot_np] += 1
        agent = config.agent_q
        return StepTokens(
            slots=tuple(int(s) for s in slots),
            text=packed[:, 0],
            audio=packed[:, 1 : 1 + agent],
            valid=packed[:, 1 + agent].bool(),
            sampled_text=packed[:, 2 + agent],
            sampled_audio=packed[:, 3 + agent :],
        )

    def _set_sampling(self, slot: int, sampling: SlotSampling) -> None:
        """Write the slot's seed and parameters to the device; widen the top-k caps if needed."""
        self._sampling[slot] = sampling
        state = self._state
        state.seeds[slot] = as_int64(sampling.seed)
        params = (sampling.text, sampling.audio)
        state.temperature[slot] = torch.tensor([p.temperature for p in params])
        state.top_k[slot] = torch.tensor([p.top_k for p in params])
        text_cap, audio_cap = self._top_k_caps
        self._top_k_caps = (  # only ever widened: each new pair captures new graphs
            max(text_cap, effective_top_k(sampling.text, self._config.text_card)),
            max(audio_cap, effective_top_k(sampling.audio, self._config.card)),
        )

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self._spec.max_slots:
            raise ValueError(f"slot {slot} is outside the pool of {self._spec.max_slots}")
