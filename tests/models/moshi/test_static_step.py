"""The graph-capturable LM step on the CPU: counter-based sampling, prefix attention, holes.

The static step (`LMStep` through `CudaGraphStep`, eager here) is checked
against the dynamic reference step (host ``max_len``, `ring_attention`, no
padding), and its pieces against plain torch: the same code is what a CUDA
graph captures on the GPU.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from duplex.kernels import counter_uniform, ring_attention_reference, sample_tokens
from duplex.kernels.sampling import mix64
from duplex.models.moshi import (
    GREEDY,
    CudaGraphStep,
    MoshiLM,
    MoshiRunner,
    SamplingParams,
    SlotSampling,
    StepTokens,
    moshi_preset,
    prefix_attention,
    random_lm,
)
from duplex.models.moshi._graph_capture import bucket_sizes
from duplex.models.moshi._lm import attended_lengths
from duplex.models.moshi._step import LMStep, SlotState

SMALL = replace(moshi_preset("tiny"), context=8)
SAMPLED = SlotSampling(seed=11, text=SamplingParams(0.7, 25), audio=SamplingParams(0.8, 250))


@pytest.fixture(scope="module")
def small() -> MoshiLM:
    return random_lm(SMALL, seed=5)


def codes(frames: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, SMALL.card, (frames, SMALL.user_q), generator=generator)


def row(out: StepTokens, index: int) -> tuple[int, ...]:
    parts = (out.text[index : index + 1], out.audio[index], out.sampled_text[index : index + 1])
    return tuple(int(v) for part in (*parts, out.sampled_audio[index]) for v in part)


# --- counter-based noise -----------------------------------------------------------------


def test_mix64_is_splitmix64_with_wrapping_int64() -> None:
    mask = (1 << 64) - 1

    def reference(x: int) -> int:
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)

    values = [0, 1, 2**63 - 1, 2**63, mask, 0x0123456789ABCDEF]
    signed = [v - (1 << 64) if v >= 1 << 63 else v for v in values]
    got = mix64(torch.tensor(signed)).tolist()
    assert [g & mask for g in got] == [reference(v) for v in values]


def test_counter_uniform_is_a_pure_function_of_seed_frame_and_stream() -> None:
    seeds = torch.tensor([1, 1, 2, -5])
    frames = torch.tensor([0, 3, 0, 7])
    first = counter_uniform(seeds, frames, 0, 1000)
    assert torch.equal(first, counter_uniform(seeds, frames, 0, 1000))
    assert bool((first > 0).all() and (first < 1).all())
    # each row alone gives the same draws: nothing depends on the other rows
    for index in range(4):
        alone = counter_uniform(seeds[index : index + 1], frames[index : index + 1], 0, 1000)
        assert torch.equal(alone[0], first[index])
    other_stream = counter_uniform(seeds, frames, 1, 1000)
    assert not torch.equal(first, other_stream)
    assert len({tuple(r[:8].tolist()) for r in first}) == 4  # distinct (seed, frame) pairs
    assert abs(float(first.mean()) - 0.5) < 0.02


# --- sampling --------------------------------------------------------------------------------


def test_temperature_zero_is_exactly_argmax() -> None:
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(0))
    uniform = counter_uniform(torch.arange(6), torch.zeros(6, dtype=torch.long), 0, 300)
    tokens = sample_tokens(logits, torch.zeros(6), torch.tensor([0, 1, 5, 0, 9, 300]), uniform, 300)
    assert torch.equal(tokens, logits.argmax(-1))


def test_sampling_rows_are_isolated_and_top_k_is_respected() -> None:
    vocab, draws = 50, 2000
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(1))
    temperature = torch.tensor([0.0, 1.0, 2.0])
    top_k = torch.tensor([0, 4, 0])
    seeds = torch.tensor([7, 8, 9])
    allowed = set(logits[1].topk(4).indices.tolist())
    seen: set[int] = set()
    for frame in range(draws):
        frames = torch.full((3,), frame)
        uniform = counter_uniform(seeds, frames, 0, vocab)
        batch = sample_tokens(logits, temperature, top_k, uniform, 8)
        single = sample_tokens(logits[1:2], temperature[1:2], top_k[1:2], uniform[1:2], 4)
        assert int(batch[1]) == int(single[0])  # the cap and the neighbours do not matter
        assert int(batch[0]) == int(logits[0].argmax())
        seen.add(int(batch[1]))
    assert seen == allowed  # every top-k token drawn, nothing outside it


def test_sampling_frequencies_follow_the_softmax() -> None:
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    draws = 8000
    logits = (probs.log() * 2).expand(draws, 4).clone()  # temperature 2 undoes the doubling
    frames = torch.arange(draws)
    uniform = counter_uniform(torch.full((draws,), 3), frames, 2, 4)
    tokens = sample_tokens(logits, torch.full((draws,), 2.0), torch.zeros(draws).long(), uniform, 4)
    freq = np.bincount(tokens.numpy(), minlength=4) / draws
    assert np.abs(freq - probs.numpy()).max() < 0.02
    top2 = sample_tokens(logits, torch.full((draws,), 2.0), torch.full((draws,), 2), uniform, 4)
    freq2 = np.bincount(top2.numpy(), minlength=4) / draws
    assert freq2[:2].sum() == 0 and abs(freq2[3] - 4 / 7) < 0.02


# --- attention -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_prefix_attention_equals_ring_attention_over_filled_rows(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(2)
    slots_n, heads, context, dim = 5, 4, 16, 8
    keys = torch.randn(slots_n, heads, context, dim, generator=generator)
    values = torch.randn(slots_n, heads, context, dim, generator=generator)
    lengths = torch.tensor([1, 16, 7, 3, 12])
    for slot, length in enumerate(lengths.tolist()):
        # stale but finite in every dtype (e4m3 ends at 448; torch before 2.13 casts past it to
        # NaN): masked, never weighted
        keys[slot, :, length:] = 80.0 * (slot + 1)
        values[slot, :, length:] = 0.0
    keys, values = keys.to(dtype), values.to(dtype)  # an fp8 ring is read as bf16
    q_dtype = torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype
    q = torch.randn(slots_n, heads, dim, generator=generator)
    want = ring_attention_reference(q, keys.float(), values.float(), lengths)
    got = prefix_attention(q.to(q_dtype), keys, values, lengths)
    assert got.dtype == q_dtype and bool(torch.isfinite(got).all())
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), want, atol=tolerance, rtol=tolerance)


def test_prefix_attention_keeps_nan_in_its_own_row() -> None:
    """Garbage in one slot's ring (even NaN in masked rows) reaches only that slot's row."""
    generator = torch.Generator().manual_seed(3)
    keys = torch.randn(4, 2, 8, 4, generator=generator)
    values = torch.randn(4, 2, 8, 4, generator=generator)
    q = torch.randn(4, 2, 4, generator=generator)
    lengths = torch.tensor([3, 8, 1, 5])
    clean = prefix_attention(q, keys, values, lengths)
    keys[2, :, 4:] = float("nan")  # masked rows of slot 2: still read, so its row is NaN
    values[2] = float("inf")
    dirty = prefix_attention(q, keys, values, lengths)
    assert bool(torch.isnan(dirty[2]).all())
    others = [0, 1, 3]
    assert torch.equal(dirty[others], clean[others])


# --- the static step ----------------------------------------------------------------------


def staggered(
    runner: MoshiRunner, sampling: SlotSampling, frames: int = 14
) -> dict[int, list[tuple[int, ...]]]:
    """Slots 3, 0, 2 join at ticks 0, 2, 5 (different fills; the 8-row ring wraps)."""
    joins = {3: 0, 0: 2, 2: 5}
    inputs = {slot: codes(frames, seed=slot) for slot in joins}
    got: dict[int, list[tuple[int, ...]]] = {slot: [] for slot in joins}
    for tick in range(frames):
        for slot, start in joins.items():
            if tick == start:
                runner.reset_slot(slot, replace(sampling, seed=sampling.seed + slot))
        live = [s for s, start in joins.items() if start <= tick]
        batch = torch.stack([inputs[s][tick - joins[s]] for s in live])
        out = runner.step(live, batch)
        for index, slot in enumerate(live):
            got[slot].append(row(out, index))
    return got


def test_static_step_equals_the_dynamic_reference_step(small: MoshiLM) -> None:
    static = MoshiRunner(small, max_slots=5)
    assert not static.graph_step.use_graphs  # CPU: the padded step runs eagerly
    static.kv_ring.keys[:] = float("nan")  # garbage everywhere: reset zeroes a slot's rings
    static.kv_ring.values[:] = float("inf")
    dynamic = MoshiRunner(small, max_slots=5, static_shapes=False)
    assert staggered(static, GREEDY) == staggered(dynamic, GREEDY)
    # sampled output is a function of (seed, frame) too: same tokens on both paths here
    assert staggered(static, SAMPLED, 8) == staggered(dynamic, SAMPLED, 8)


def test_prefix_rows_not_asked_for_keep_their_state(small: MoshiLM) -> None:
    """Slots 5, 0, 2 with holes at 1, 3, 4 and free slots 6, 7: the prefix runs all 8 rows."""
    assert bucket_sizes(5) == (1, 2, 4, 5) and bucket_sizes(8) == (1, 2, 4, 8)
    live = (5, 0, 2)  # out of slot order: the output follows this order
    inputs = {slot: codes(6, seed=slot) for slot in live}

    def alone(slot: int) -> list[tuple[int, ...]]:
        runner = MoshiRunner(small, max_slots=8)
        runner.reset_slot(slot, replace(SAMPLED, seed=slot))
        return [row(runner.step([slot], inputs[slot][n : n + 1]), 0) for n in range(6)]

    runner = MoshiRunner(small, max_slots=8)
    assert runner.graph_step.bucket_for(max(live) + 1) == 8
    for slot in range(8):
        runner.reset_slot(slot, replace(SAMPLED, seed=slot))
    runner.seek(3, 20)  # a hole mid-session: its state must survive the ticks it skips
    ring = runner.kv_ring
    for hole in (1, 4, 7):
        ring.keys[:, hole] = float("nan")  # never reset again: NaN stays in its own row
        ring.values[:, hole] = float("inf")
    ring.keys[:, 3] = 1e30
    state = runner._state  # the untouched slots' tensors are compared below
    before = {
        name: getattr(state, name).clone()
        for name in ("tokens", "frames", "seeds", "temperature", "top_k")
    }
    keys_before, values_before = ring.keys.clone(), ring.values.clone()
    got: dict[int, list[tuple[int, ...]]] = {slot: [] for slot in live}
    for n in range(6):
        out = runner.step(list(live), torch.stack([inputs[s][n] for s in live]))
        assert out.slots == live
        for index, slot in enumerate(live):
            got[slot].append(row(out, index))
    assert got == {slot: alone(slot) for slot in live}
    assert [runner.frames(s) for s in range(8)] == [6, 0, 6, 20, 0, 6, 0, 0]
    untouched = [1, 3, 4, 6, 7]
    for name, tensor in before.items():
        assert torch.equal(getattr(state, name)[untouched], tensor[untouched]), name
    # byte-exact (NaN included): compare the raw bits
    for now, then in ((ring.keys, keys_before), (ring.values, values_before)):
        assert torch.equal(
            now[:, untouched].view(torch.int32), then[:, untouched].view(torch.int32)
        )
        assert not torch.equal(now[:, list(live)], then[:, list(live)])


def test_a_row_not_asked_for_reads_one_ring_row_not_its_last_sessions_history() -> None:
    """A slot a session left keeps its frame count (and its full ring) until it is reused;
    inside a step's prefix it is computed and discarded, so it must not cost a full read."""
    frames = torch.tensor([0, 5, 100, 3000, 7])
    active = torch.tensor([True, True, True, False, False])
    assert attended_lengths(frames, 8, active).tolist() == [1, 6, 8, 1, 1]
    assert attended_lengths(frames, 8).tolist() == [1, 6, 8, 8, 8]  # no mask: every row


def test_reset_zeroes_only_that_slots_rings(small: MoshiLM) -> None:
    runner = MoshiRunner(small, max_slots=3)
    ring = runner.kv_ring
    ring.keys[:] = float("nan")
    ring.values[:] = 7.0
    runner.reset_slot(1)
    assert bool((ring.keys[:, 1] == 0).all() and (ring.values[:, 1] == 0).all())
    assert bool(torch.isnan(ring.keys[:, [0, 2]]).all() and (ring.values[:, [0, 2]] == 7).all())


def test_sampled_session_is_deterministic_per_seed_and_slot_independent(small: MoshiLM) -> None:
    inputs = codes(6, seed=9)

    def session(slot: int, seed: int, neighbours: int) -> list[tuple[int, ...]]:
        runner = MoshiRunner(small, max_slots=4)
        runner.reset_slot(slot, replace(SAMPLED, seed=seed))
        others = [s for s in range(4) if s != slot][:neighbours]
        for other in others:
            runner.reset_slot(other, replace(SAMPLED, seed=100 + other))
        out = []
        for n in range(6):
            batch = torch.cat([inputs[n : n + 1], codes(1, seed=n).expand(len(others), -1)])
            out.append(row(runner.step([slot, *others], batch), 0))
        return out

    first = session(0, seed=42, neighbours=0)
    assert session(3, seed=42, neighbours=3) == first
    assert session(0, seed=43, neighbours=0) != first


def test_graphs_are_refused_off_cuda(small: MoshiLM) -> None:
    with pytest.raises(ValueError, match="CUDA"):
        MoshiRunner(small, max_slots=2, cuda_graphs=True)
    state = SlotState(SMALL, max_slots=2, device=torch.device("cpu"), kv_dtype=torch.float32)
    with pytest.raises(ValueError, match="CUDA"):
        CudaGraphStep(LMStep(small, state), max_slots=2, use_graphs=True)
