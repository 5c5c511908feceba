"""The token-level Moshi runner: per-slot state and one batched step over any slots.

`MoshiRunner` owns every per-slot tensor (KV rings, the delayed token ring,
frame counters, sampling generators) and steps any subset of slots given as
indices, so sessions join and leave at any frame while the others keep their
cadence. `reset_slot` touches only that slot's rows and is O(1): ring rows
past a slot's fill length are never read, so they are not cleared.

Token ring (per slot, ``num_streams x (max_delay + 2 + user_lag)`` columns):
at a slot's frame ``n``, user codebook ``q`` is written at column
``n + user_lag + delay[q]``; the temporal input is column ``n``, with stream
start tokens while ``n <= delay``; the sampled text and agent codebooks go to
column ``n + 1``; the output is the de-delayed column
``n + 1 - max_delay + delay`` (text and the semantic codebook sampled one
frame ago, acoustic codebooks sampled now), flagged invalid (``-2``) for the
first ``max_delay`` frames as in the reference ``LMGen``.

This runner speaks codes. `MoshiEngineRunner` (``_engine_runner.py``) wraps it
with the Mimi streams and the text table to make the engine's ``ModelRunner``
(PCM in, PCM and text out); it passes each session's `SlotSampling` (its seed)
through `reset_slot`. Still missing: prompt replay (PersonaPlex voice and text
prompts, through ``forced``) and a fused sampler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import final

import numpy as np
import torch

from .._interface import ModelSpec
from ._config import MoshiConfig
from ._kv import KVRing
from ._lm import MoshiLM
from ._sampling import SamplingParams, sample_rows

__all__ = ["GREEDY", "MoshiRunner", "SlotSampling", "StepTokens"]

_TEXT_DEFAULT = SamplingParams(0.7, 25)
_AUDIO_DEFAULT = SamplingParams(0.8, 250)
UNGENERATED = -2
"""Token value of outputs that do not exist yet (the reference's ``ungenerated_token_id``)."""


@final
@dataclass(frozen=True, slots=True)
class SlotSampling:
    """One slot's sampling: its generator seed and the text/audio parameters.

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
    """

    def __init__(
        self, model: MoshiLM, *, max_slots: int, kv_dtype: torch.dtype | None = None
    ) -> None:
        config = model.config
        weight = model.text_linear.weight
        self._model = model
        self._config = config
        self._device = weight.device
        self._spec = ModelSpec(
            name=config.name, supports_model_native_turn_policy=True, max_slots=max_slots
        )
        self._ring = KVRing(
            num_layers=config.num_layers,
            max_slots=max_slots,
            num_heads=config.num_heads,
            context=config.context,
            head_dim=config.head_dim,
            device=self._device,
            dtype=kv_dtype or weight.dtype,
        )
        self._columns = config.max_delay + 2 + config.user_lag
        self._tokens = torch.full(
            (max_slots, config.num_streams, self._columns),
            UNGENERATED,
            dtype=torch.long,
            device=self._device,
        )
        self._frames = np.zeros(max_slots, dtype=np.int64)
        self._sampling = [SlotSampling()] * max_slots
        self._generators = [torch.Generator(self._device) for _ in range(max_slots)]
        for slot in range(max_slots):
            self._generators[slot].manual_seed(self._sampling[slot].seed)
        long = {"dtype": torch.long, "device": self._device}
        self._delays = torch.tensor(config.delays, **long)
        self._initial = torch.tensor(model.initial_tokens, **long)
        self._all_rows = torch.arange(config.num_streams, **long)
        self._agent_rows = torch.arange(1 + config.agent_q, **long)
        self._user_rows = torch.arange(1 + config.agent_q, config.num_streams, **long)

    @property
    def spec(self) -> ModelSpec:
        """Name and slot pool (sample rate and 80 ms frames are Mimi's)."""
        return self._spec

    @property
    def config(self) -> MoshiConfig:
        """The LM's configuration."""
        return self._config

    @property
    def kv_ring(self) -> KVRing:
        """The per-slot KV rings (tests poke unfilled rows through this)."""
        return self._ring

    def frames(self, slot: int) -> int:
        """Frames the slot has stepped since its last reset."""
        return int(self._frames[slot])

    def reset_slot(self, slot: int, sampling: SlotSampling | None = None) -> None:
        """Make one slot fresh (frame 0, reseeded generator); no other slot is touched."""
        self._check_slot(slot)
        self._frames[slot] = 0
        self._tokens[slot] = UNGENERATED
        self._sampling[slot] = sampling or SlotSampling()
        self._generators[slot].manual_seed(self._sampling[slot].seed)

    def seek(self, slot: int, frame: int) -> None:
        """Move one slot's frame counter to ``frame``, as if it had already run that long.

        For benchmarks: the next step attends over ``min(frame + 1, context)`` ring
        rows of the slot (whatever they hold; no real history is restored) and its
        RoPE position is ``frame``. The slot's token ring is set to token 0 in every
        stream, so once past ``max_delay`` its outputs are valid codes from the
        first step on. No other slot is touched.

        Raises:
            ValueError: bad slot or negative frame.
        """
        self._check_slot(slot)
        if frame < 0:
            raise ValueError(f"frame must be >= 0, got {frame}")
        self._frames[slot] = frame
        self._tokens[slot] = 0

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
                (PersonaPlex text prompt, silence codes) will build on this.

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
        frames_np = self._frames[slot_np]
        slot_t = torch.as_tensor(slot_np, device=self._device)
        frames = torch.as_tensor(frames_np, device=self._device)
        columns = self._columns
        rows = slot_t[:, None]

        user_delays = self._delays[self._user_rows]
        user_cols = (frames[:, None] + config.user_lag + user_delays[None, :]) % columns
        self._tokens[rows, self._user_rows[None, :], user_cols] = user_codes.to(self._device)
        column = self._tokens[rows, self._all_rows[None, :], (frames % columns)[:, None]]
        starting = frames[:, None] <= self._delays[None, :]
        column = torch.where(starting, self._initial[None, :], column)

        max_len = int(min(frames_np.max() + 1, config.context))
        hidden, text_logits = self._model.temporal_step(column, self._ring, slot_t, frames, max_len)
        sampling = [self._sampling[s] for s in slots]
        generators = [self._generators[s] for s in slots]
        text = self._sample(text_logits, [p.text for p in sampling], generators)
        if forced is not None:
            forced = forced.to(self._device)
            text = torch.where(forced[:, 0] >= 0, forced[:, 0], text)
        audio_params = [p.audio for p in sampling]

        def choose(step: int, logits: torch.Tensor) -> torch.Tensor:
            token = self._sample(logits, audio_params, generators)
            if forced is not None:
                token = torch.where(forced[:, step + 1] >= 0, forced[:, step + 1], token)
            return token

        audio = self._model.depth_step(hidden, text, choose)

        target = ((frames + 1) % columns)[:, None]
        self._tokens[rows, self._agent_rows[None, :], target] = torch.cat(
            [text[:, None], audio], dim=1
        )
        out_delays = self._delays[self._agent_rows]
        out_cols = (frames[:, None] + 1 - config.max_delay + out_delays[None, :]) % columns
        out = self._tokens[rows, self._agent_rows[None, :], out_cols]
        valid = frames + 1 > config.max_delay
        out = torch.where(valid[:, None], out, UNGENERATED)
        self._frames[slot_np] += 1
        return StepTokens(
            slots=tuple(int(s) for s in slots),
            text=out[:, 0],
            audio=out[:, 1:],
            valid=valid,
            sampled_text=text,
            sampled_audio=audio,
        )

    def _sample(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator],
    ) -> torch.Tensor:
        temperature = torch.tensor([p.temperature for p in params], device=self._device)
        top_k = torch.tensor([p.top_k for p in params], device=self._device)
        sampled = [row for row, p in enumerate(params) if not p.greedy]
        vocab = logits.shape[-1]
        widest = max((params[r].top_k or vocab for r in sampled), default=1)
        return sample_rows(logits, temperature, top_k, generators, sampled, widest)

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self._spec.max_slots:
            raise ValueError(f"slot {slot} is outside the pool of {self._spec.max_slots}")
