"""The whole LM step as one function of device tensors: what a CUDA graph captures.

`SlotState` holds every per-slot tensor on the device.

`LMStep` runs one frame for a batch of rows: user codes into the token ring,
the temporal input column, the temporal transformer, text sampling, the
``agent_q`` depth steps, the token ring update and the frame counters.

The static step (`LMStep.__call__`) always runs the slot *prefix* ``[0, P)``,
so attention reads each layer's rings in place (`prefix_attention`, no
gather). Rows of the prefix that were not asked for (``active`` False: free
slots, holes, live slots skipped this tick) are computed on whatever they
hold and then discarded: every state write is a ``where(active, new, old)``,
so their rings, token rings and frame counters stay exactly as they were, and
rows never mix (NaN in an inactive row's ring stays in that row). Its inputs
are device tensors and host constants only (the top-k caps), so it has static
shapes, no host syncs and no host-to-device copies: the same code runs
eagerly on the CPU (tests) and inside a captured graph on CUDA.
`LMStep.reference` is the dynamic reference: any slots, in any order, host
``max_len`` and `ring_attention_reference`.

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

from duplex.kernels import sample as sample_kernel
from duplex.kernels import sample_reference, triton_available

from ._config import MoshiConfig
from ._kv import KVDtype, KVRing
from ._lm import MoshiLM

__all__ = ["UNGENERATED", "LMStep", "SlotState", "packed_width"]

UNGENERATED = -2
"""Token value of outputs that do not exist yet (the reference's ``ungenerated_token_id``)."""


def packed_width(config: MoshiConfig) -> int:
    """Columns of `LMStep`'s output: text, audio, valid, sampled text, sampled audio."""
    return 2 * config.agent_q + 3


@final
class SlotState:
    """Per-slot device tensors for ``max_slots`` slots.

    ``temperature`` / ``top_k`` are ``[slots, 2]`` (column 0: text, 1: audio);
    ``seeds`` and ``frames`` feed the counter-based noise and the positions.
    """

    def __init__(
        self,
        config: MoshiConfig,
        *,
        max_slots: int,
        device: torch.device,
        kv_dtype: KVDtype,
    ) -> None:
        self.columns = config.max_delay + 2 + config.user_lag
        self.ring = KVRing(
            num_layers=config.num_layers,
            max_slots=max_slots,
            num_heads=config.num_heads,
            context=config.context,
            head_dim=config.head_dim,
            device=device,
            dtype=kv_dtype,
        )
        long = {"dtype": torch.long, "device": device}
        self.tokens = torch.full((max_slots, config.num_streams, self.columns), UNGENERATED, **long)
        self.frames = torch.zeros(max_slots, **long)
        self.seeds = torch.zeros(max_slots, **long)
        self.temperature = torch.zeros(max_slots, 2, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(max_slots, 2, **long)


def _keep(active: torch.Tensor | None, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """``new`` on active rows, ``old`` elsewhere (``active`` broadcasts from the left)."""
    if active is None:
        return new
    return torch.where(active.view(-1, *[1] * (new.dim() - 1)), new, old)


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
        active: torch.Tensor,
        user_codes: torch.Tensor,
        forced: torch.Tensor,
        top_k_caps: tuple[int, int],
    ) -> torch.Tensor:
        """Step slots ``[0, P)`` one frame; only ``active`` rows change their slot's state.

        Args:
            active: ``[P]`` bool, the slots asked for; the others are computed (on any
                input) and discarded.
            user_codes: ``[P, user_q]`` the user's Mimi codes for this frame.
            forced: ``[P, 1 + agent_q]`` tokens used instead of sampling where ``>= 0``.
            top_k_caps: (text, audio) upper bounds of the rows' effective top-k.

        Returns:
            ``[P, packed_width]`` int64 (see `reference`); inactive rows are garbage.
        """
        slots = torch.arange(active.shape[0], device=active.device)
        return self._run(slots, active, user_codes, forced, top_k_caps, None)

    def reference(
        self,
        slots: torch.Tensor,
        user_codes: torch.Tensor,
        forced: torch.Tensor,
        top_k_caps: tuple[int, int],
        max_len: int,
    ) -> torch.Tensor:
        """Step ``slots`` (distinct, any order) one frame with `ring_attention_reference`.

        Args:
            slots: ``[B]`` slot per row.
            user_codes: ``[B, user_q]`` the user's Mimi codes for this frame.
            forced: ``[B, 1 + agent_q]`` tokens used instead of sampling where ``>= 0``.
            top_k_caps: (text, audio) upper bounds of the rows' effective top-k.
            max_len: the host's ``max(fill)`` of ``slots``: ring rows read per slot.

        Returns:
            ``[B, packed_width]`` int64: de-delayed text, audio codes, valid flag, and
            this step's sampled text and audio codes.
        """
        return self._run(slots, None, user_codes, forced, top_k_caps, max_len)

    def _run(
        self,
        slots: torch.Tensor,
        active: torch.Tensor | None,
        user_codes: torch.Tensor,
        forced: torch.Tensor,
        top_k_caps: tuple[int, int],
        max_len: int | None,
    ) -> torch.Tensor:
        config = self.model.config
        state = self.state
        columns = state.columns
        rows = slots[:, None]
        frames = state.frames[slots]

        user_delays = self._delays[self._user_rows]
        user_cols = (frames[:, None] + config.user_lag + user_delays[None, :]) % columns
        user_index = (rows, self._user_rows[None, :], user_cols)
        state.tokens[user_index] = _keep(active, user_codes, state.tokens[user_index])
        column = state.tokens[rows, self._all_rows[None, :], (frames % columns)[:, None]]
        starting = frames[:, None] <= self._delays[None, :]
        column = torch.where(starting, self._initial[None, :], column)

        hidden, text_logits = self.model.temporal_step(
            column, state.ring, slots, frames, max_len, active
        )
        seeds = state.seeds[slots]
        temperature = state.temperature[slots]
        top_k = state.top_k[slots]

        def sample(stream: int, logits: torch.Tensor) -> torch.Tensor:
            audio = int(stream > 0)
            # one fused launch per stream on CUDA; the same tokens from torch elsewhere
            fn = sample_kernel if logits.is_cuda and triton_available() else sample_reference
            token = fn(
                logits,
                temperature[:, audio],
                top_k[:, audio],
                seeds,
                frames,
                stream,
                top_k_caps[audio],
            )
            return torch.where(forced[:, stream] >= 0, forced[:, stream], token)

        text = sample(0, text_logits)
        audio = self.model.depth_step(hidden, text, lambda step, lg: sample(step + 1, lg))

        target = ((frames + 1) % columns)[:, None]
        agent_index = (rows, self._agent_rows[None, :], target)
        chosen = torch.cat([text[:, None], audio], dim=1)
        state.tokens[agent_index] = _keep(active, chosen, state.tokens[agent_index])
        out_delays = self._delays[self._agent_rows]
        out_cols = (frames[:, None] + 1 - config.max_delay + out_delays[None, :]) % columns
        out = state.tokens[rows, self._agent_rows[None, :], out_cols]
        valid = frames + 1 > config.max_delay
        out = torch.where(valid[:, None], out, UNGENERATED)
        state.frames[slots] = frames + (1 if active is None else active.long())
        return torch.cat([out, valid[:, None].long(), text[:, None], audio], dim=1)
