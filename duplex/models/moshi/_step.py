"""The whole LM step as one function of device tensors: what a CUDA graph captures.

`SlotState` holds every per-slot tensor on the device, with one extra row (the
*scratch* slot, index ``max_slots``) that padding rows of a batch step instead
of a real slot: nothing it computes is ever read by a real slot.

`LMStep` runs one frame for a batch of rows: user codes into the token ring,
the temporal input column, the temporal transformer, text sampling, the
``agent_q`` depth steps, the token ring update and the frame counters. Its
inputs are device tensors and host constants only (the top-k caps, and
``max_len`` for the dynamic reference path), so with ``max_len=None`` it has
static shapes, no host syncs and no host-to-device copies: the same code runs
eagerly on the CPU (tests) and inside a captured graph on CUDA.

Token ring (per slot, ``num_streams x (max_delay + 2 + user_lag)`` columns):
at a slot's frame ``n``, user codebook ``q`` is written at column
``n + user_lag + delay[q]``; the temporal input is column ``n``, with stream
start tokens while ``n <= delay``; the sampled text and agent codebooks go to
column ``n + 1``; the output is the de-delayed column
``n + 1 - max_delay + delay`` (text and the semantic codebook sampled one
frame ago, acoustic codebooks sampled now), flagged invalid (``-2``) for the
first ``max_delay`` frames as in the reference ``LMGen``.
"""

from __future__ import annotations

from typing import final

import torch

from ._config import MoshiConfig
from ._kv import KVRing
from ._lm import MoshiLM
from ._rng import counter_uniform
from ._sampling import sample_tokens

__all__ = ["UNGENERATED", "LMStep", "SlotState", "packed_width"]

UNGENERATED = -2
"""Token value of outputs that do not exist yet (the reference's ``ungenerated_token_id``)."""


def packed_width(config: MoshiConfig) -> int:
    """Columns of `LMStep`'s output: text, audio, valid, sampled text, sampled audio."""
    return 2 * config.agent_q + 3


@final
class SlotState:
    """Per-slot device tensors for ``max_slots`` slots plus the scratch slot.

    ``temperature`` / ``top_k`` are ``[slots, 2]`` (column 0: text, 1: audio);
    ``seeds`` and ``frames`` feed the counter-based noise and the positions.
    """

    def __init__(
        self,
        config: MoshiConfig,
        *,
        max_slots: int,
        device: torch.device,
        kv_dtype: torch.dtype,
    ) -> None:
        rows = max_slots + 1
        self.scratch = max_slots
        self.columns = config.max_delay + 2 + config.user_lag
        self.ring = KVRing(
            num_layers=config.num_layers,
            max_slots=rows,
            num_heads=config.num_heads,
            context=config.context,
            head_dim=config.head_dim,
            device=device,
            dtype=kv_dtype,
        )
        long = {"dtype": torch.long, "device": device}
        self.tokens = torch.full((rows, config.num_streams, self.columns), UNGENERATED, **long)
        self.frames = torch.zeros(rows, **long)
        self.seeds = torch.zeros(rows, **long)
        self.temperature = torch.zeros(rows, 2, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(rows, 2, **long)


@final
class LMStep:
    """One frame for a batch of rows of `SlotState` (see the module docstring)."""

    def __init__(self, model: MoshiLM, state: SlotState) -> None:
        config = model.config
        device = state.frames.device
        long = {"dtype": torch.long, "device": device}
        self.model = model
        self.state = state
        self._delays = torch.tensor(config.delays, **long)
        self._initial = torch.tensor(model.initial_tokens, **long)
        self._all_rows = torch.arange(config.num_streams, **long)
        self._agent_rows = torch.arange(1 + config.agent_q, **long)
        self._user_rows = torch.arange(1 + config.agent_q, config.num_streams, **long)

    def __call__(
        self,
        slots: torch.Tensor,
        user_codes: torch.Tensor,
        forced: torch.Tensor,
        top_k_caps: tuple[int, int],
        max_len: int | None = None,
    ) -> torch.Tensor:
        """Step ``slots`` one frame and advance their device frame counters.

        Args:
            slots: ``[B]`` slot per row; only the scratch slot may repeat.
            user_codes: ``[B, user_q]`` the user's Mimi codes for this frame.
            forced: ``[B, 1 + agent_q]`` tokens used instead of sampling where ``>= 0``.
            top_k_caps: (text, audio) upper bounds of the rows' effective top-k.
            max_len: None for the static path; else the host's ``max(fill)``, to
                attend with `ring_attention` (the dynamic reference).

        Returns:
            ``[B, packed_width]`` int64: de-delayed text, audio codes, valid flag, and
            this step's sampled text and audio codes.
        """
        config = self.model.config
        state = self.state
        columns = state.columns
        rows = slots[:, None]
        frames = state.frames[slots]

        user_delays = self._delays[self._user_rows]
        user_cols = (frames[:, None] + config.user_lag + user_delays[None, :]) % columns
        state.tokens[rows, self._user_rows[None, :], user_cols] = user_codes
        column = state.tokens[rows, self._all_rows[None, :], (frames % columns)[:, None]]
        starting = frames[:, None] <= self._delays[None, :]
        column = torch.where(starting, self._initial[None, :], column)

        hidden, text_logits = self.model.temporal_step(column, state.ring, slots, frames, max_len)
        seeds = state.seeds[slots]
        temperature = state.temperature[slots]
        top_k = state.top_k[slots]

        def sample(stream: int, logits: torch.Tensor) -> torch.Tensor:
            audio = int(stream > 0)
            uniform = counter_uniform(seeds, frames, stream, logits.shape[-1])
            token = sample_tokens(
                logits, temperature[:, audio], top_k[:, audio], uniform, top_k_caps[audio]
            )
            return torch.where(forced[:, stream] >= 0, forced[:, stream], token)

        text = sample(0, text_logits)
        audio = self.model.depth_step(hidden, text, lambda step, lg: sample(step + 1, lg))

        target = ((frames + 1) % columns)[:, None]
        state.tokens[rows, self._agent_rows[None, :], target] = torch.cat(
            [text[:, None], audio], dim=1
        )
        out_delays = self._delays[self._agent_rows]
        out_cols = (frames[:, None] + 1 - config.max_delay + out_delays[None, :]) % columns
        out = state.tokens[rows, self._agent_rows[None, :], out_cols]
        valid = frames + 1 > config.max_delay
        out = torch.where(valid[:, None], out, UNGENERATED)
        state.frames[slots] = frames + 1
        return torch.cat([out, valid[:, None].long(), text[:, None], audio], dim=1)
