"""The Moshi LM and its runner on the tiny preset (CPU, seeded random weights).

The oracle for streaming is `MoshiLM.forward_sequence`: a non-streaming pass
over the input columns rebuilt independently from the delays, so ring
indexing, RoPE positions, the ``context`` window and the delay bookkeeping
are all checked against plain causal attention.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from duplex.exceptions import ConfigError
from duplex.models.moshi import (
    GREEDY,
    MoshiConfig,
    MoshiLM,
    MoshiRunner,
    SamplingParams,
    SlotSampling,
    StepTokens,
    expected_tensors,
    load_lm,
    moshi_preset,
    random_lm,
    save_random_lm,
)

TINY = moshi_preset("tiny")


@pytest.fixture(scope="module")
def tiny() -> MoshiLM:
    return random_lm(TINY, seed=7)


def user_codes(config: MoshiConfig, frames: int, seed: int) -> torch.Tensor:
    """``[frames, user_q]`` random user codes."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.card, (frames, config.user_q), generator=generator)


def run_alone(
    model: MoshiLM, codes: torch.Tensor, sampling: SlotSampling = GREEDY, slot: int = 0
) -> list[tuple[int, ...]]:
    """A session's per-frame outputs when it has a runner to itself."""
    runner = MoshiRunner(model, max_slots=slot + 1)
    runner.reset_slot(slot, sampling)
    return [frame_row(runner.step([slot], codes[n : n + 1]), 0) for n in range(len(codes))]


def frame_row(out: StepTokens, row: int) -> tuple[int, ...]:
    """Everything a step produced for one row, as plain ints."""
    parts = (out.text[row : row + 1], out.audio[row], out.sampled_text[row : row + 1])
    return tuple(int(v) for part in (*parts, out.sampled_audio[row]) for v in part)


# --- configuration and names -------------------------------------------------------------


def test_presets_match_the_reference_shapes() -> None:
    moshi = moshi_preset("moshi-7b")
    assert (moshi.ffn_hidden, moshi.depformer_ffn_hidden) == (11264, 2816)
    assert moshi.delays == (0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1)
    assert 1.4 < moshi.kv_bytes_per_slot() / 2**30 < 1.5
    names = expected_tensors(moshi)
    assert names["text_emb.weight"] == (32001, 4096)
    assert names["emb.15.weight"] == (2049, 4096)
    assert names["transformer.layers.31.self_attn.in_proj_weight"] == (3 * 4096, 4096)
    assert names["transformer.layers.31.self_attn.out_proj.weight"] == (4096, 4096)
    assert names["transformer.layers.0.gating.linear_in.weight"] == (2 * 11264, 4096)
    assert names["transformer.layers.0.gating.linear_out.weight"] == (4096, 11264)
    assert names["transformer.layers.0.norm1.alpha"] == (1, 1, 4096)
    assert names["out_norm.alpha"] == (1, 1, 4096)
    assert names["text_linear.weight"] == (32000, 4096)
    assert names["depformer_in.7.weight"] == (1024, 4096)
    assert names["depformer_text_emb.weight"] == (32001, 1024)
    assert names["depformer_emb.6.weight"] == (2049, 1024)
    assert names["depformer.layers.5.self_attn.in_proj_weight"] == (8 * 3 * 1024, 1024)
    assert names["depformer.layers.5.self_attn.out_proj.weight"] == (8 * 1024, 1024)
    assert names["depformer.layers.5.gating.7.linear_in.weight"] == (5632, 1024)
    assert names["linears.7.weight"] == (2048, 1024)
    assert "depformer_emb.7.weight" not in names and "linears.8.weight" not in names
    plex = expected_tensors(moshi_preset("personaplex-7b"))
    assert plex["depformer.layers.0.self_attn.in_proj_weight"] == (49152, 1024)
    assert plex["depformer.layers.0.self_attn.out_proj.weight"] == (16384, 1024)
    assert "depformer_emb.14.weight" in plex and "linears.15.weight" in plex


@pytest.mark.parametrize(
    "change",
    [
        {"dim": 0},
        {"num_heads": 5},
        {"depformer_num_heads": 3},
        {"agent_q": 9},
        {"dep_q": 17},
        {"delays": (0,) * 16},
        {"delays": (-1,) + (0,) * 16},
        {"user_lag": 2},
        {"text_padding_id": 64},
    ],
)
def test_invalid_configs_are_refused(change: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        replace(TINY, **change)  # type: ignore[arg-type]


def test_unknown_preset() -> None:
    with pytest.raises(ConfigError, match="tiny"):
        moshi_preset("moshi-70b")


# --- weights -----------------------------------------------------------------------------


def test_save_load_round_trip(tmp_path: Path, tiny: MoshiLM) -> None:
    path = tmp_path / "model.safetensors"
    save_random_lm(path, TINY, seed=7)
    assert set(load_file(str(path))) == set(expected_tensors(TINY))
    loaded = load_lm(path, TINY)
    for name, tensor in tiny.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    codes = user_codes(TINY, 6, seed=1)
    assert run_alone(loaded, codes) == run_alone(tiny, codes)


def test_loader_refuses_missing_unknown_and_misshapen(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_random_lm(path, TINY, seed=1)
    tensors = load_file(str(path))
    for label, edit in (
        ("missing", lambda t: t.pop("out_norm.alpha")),
        ("unknown", lambda t: t.__setitem__("extra.weight", torch.zeros(2))),
        ("shape", lambda t: t.__setitem__("text_linear.weight", torch.zeros(3, 3))),
    ):
        broken = dict(tensors)
        edit(broken)
        save_file(broken, str(tmp_path / f"{label}.safetensors"))
        with pytest.raises(ConfigError, match=label if label != "shape" else "has shape"):
            load_lm(tmp_path / f"{label}.safetensors", TINY)
    extra = dict(tensors, **{"extra.weight": torch.zeros(2)})
    save_file(extra, str(tmp_path / "extra.safetensors"))
    load_lm(tmp_path / "extra.safetensors", TINY, strict=False)


def test_personaplex_config_loads_an_eight_step_depth_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "moshi.safetensors"
    save_random_lm(path, TINY, seed=2)
    plex = load_lm(path, moshi_preset("tiny-personaplex"))
    state = plex.state_dict()
    stacked = state["depformer.layers.1.self_attn.in_proj_weight"].view(16, -1, TINY.depformer_dim)
    assert torch.equal(stacked[3], stacked[11])
    assert torch.equal(
        state["depformer.layers.0.gating.9.linear_in.weight"],
        state["depformer.layers.0.gating.1.linear_in.weight"],
    )
    assert torch.equal(state["linears.15.weight"], state["linears.7.weight"])
    assert not state["depformer_emb.7.weight"].any()  # input of step 8: never run
    assert torch.equal(state["depformer_emb.8.weight"], state["depformer_emb.0.weight"])


# --- streaming vs the oracle ---------------------------------------------------------------


def oracle_columns(
    model: MoshiLM, codes: torch.Tensor, text: list[int], audio: list[list[int]]
) -> torch.Tensor:
    """The temporal input columns ``[T, K]`` implied by the delays, built from scratch."""
    config = model.config
    initial = model.initial_tokens
    columns = torch.empty(len(codes), config.num_streams, dtype=torch.long)
    for t in range(len(codes)):
        for k, delay in enumerate(config.delays):
            if t <= delay:
                columns[t, k] = initial[k]
            elif k == 0:
                columns[t, k] = text[t - 1]
            elif k <= config.agent_q:
                columns[t, k] = audio[t - 1][k - 1]
            else:
                columns[t, k] = codes[t - config.user_lag - delay, k - 1 - config.agent_q]
    return columns


@pytest.mark.parametrize("preset", ["tiny", "tiny-personaplex"])
def test_streaming_matches_the_full_sequence_oracle_past_the_ring(preset: str) -> None:
    config = replace(moshi_preset(preset), context=8)
    model = random_lm(config, seed=3)
    frames = 20  # wraps the 8-frame ring twice
    codes = user_codes(config, frames, seed=4)
    runner = MoshiRunner(model, max_slots=2)
    runner.reset_slot(1, GREEDY)
    steps = [runner.step([1], codes[n : n + 1]) for n in range(frames)]
    text = [int(s.sampled_text[0]) for s in steps]
    audio = [s.sampled_audio[0].tolist() for s in steps]
    hidden, logits = model.forward_sequence(oracle_columns(model, codes, text, audio)[None])
    assert logits[0].argmax(-1).tolist() == text
    greedy_audio = model.depth_step(hidden[0], torch.tensor(text), lambda _step, lg: lg.argmax(-1))
    assert greedy_audio.tolist() == audio


def test_outputs_are_de_delayed(tiny: MoshiLM) -> None:
    runner = MoshiRunner(tiny, max_slots=1)
    runner.reset_slot(0, GREEDY)
    codes = user_codes(TINY, 5, seed=5)
    steps = [runner.step([0], codes[n : n + 1]) for n in range(5)]
    first = steps[0]
    assert not bool(first.valid[0])
    assert int(first.text[0]) == -2 and (first.audio[0] == -2).all()
    for previous, now in itertools.pairwise(steps):
        assert bool(now.valid[0])
        assert int(now.text[0]) == int(previous.sampled_text[0])  # text delay 0
        assert int(now.audio[0, 0]) == int(previous.sampled_audio[0, 0])  # semantic delay 0
        assert torch.equal(now.audio[0, 1:], now.sampled_audio[0, 1:])  # acoustic delay 1
    assert runner.frames(0) == 5


# --- slots ---------------------------------------------------------------------------------


def test_slots_join_and_leave_at_any_frame_without_changing_anyones_tokens(
    tiny: MoshiLM,
) -> None:
    sampled = SlotSampling(seed=11, text=SamplingParams(0.7, 25), audio=SamplingParams(0.8, 250))
    # (slot, first tick, frames, sampling): D reuses A's slot, whose ring still holds A's keys.
    sessions = {
        "A": (0, 0, 9, GREEDY),
        "B": (1, 2, 14, sampled),
        "C": (2, 4, 5, GREEDY),
        "D": (0, 10, 6, replace(sampled, seed=12)),
    }
    codes = {name: user_codes(TINY, s[2], seed=ord(name)) for name, s in sessions.items()}
    runner = MoshiRunner(tiny, max_slots=3)
    got: dict[str, list[tuple[int, ...]]] = {name: [] for name in sessions}
    for tick in range(16):
        live = []
        for name, (slot, start, frames, sampling) in sessions.items():
            if tick == start:
                runner.reset_slot(slot, sampling)
            if start <= tick < start + frames:
                live.append(name)
        live.reverse()  # rows need not follow slot order
        if not live:
            continue
        batch = torch.cat([codes[n][tick - sessions[n][1]][None] for n in live])
        out = runner.step([sessions[n][0] for n in live], batch)
        for row, name in enumerate(live):
            got[name].append(frame_row(out, row))
    for name, (slot, _start, _frames, sampling) in sessions.items():
        assert got[name] == run_alone(tiny, codes[name], sampling, slot=slot), name


def test_attention_gives_unfilled_ring_rows_no_weight(tiny: MoshiLM) -> None:
    """Stale finite values in a slot's unfilled rows change nothing; other slots' NaN neither.

    The static step reads masked rows in place, so they must be finite: NaN there
    would reach the output (``reset_slot`` zeroes a slot's rings for that reason).
    """
    codes = user_codes(TINY, 6, seed=9)
    clean = run_alone(tiny, codes, slot=1)
    runner = MoshiRunner(tiny, max_slots=3)
    runner.reset_slot(1, GREEDY)
    ring = runner.kv_ring
    got = []
    for n in range(6):
        ring.keys[:, 1, :, n:] = 1e30
        ring.values[:, 1, :, n:] = -1e30
        ring.keys[:, [0, 2]] = float("nan")  # other slots (slot 0 runs in the prefix)
        got.append(frame_row(runner.step([1], codes[n : n + 1]), 0))
    assert got == clean


def test_reset_slot_restarts_only_that_slot(tiny: MoshiLM) -> None:
    codes = user_codes(TINY, 4, seed=13)
    runner = MoshiRunner(tiny, max_slots=2)
    for slot in (0, 1):
        runner.reset_slot(slot, GREEDY)
    for n in range(3):
        runner.step([0, 1], torch.cat([codes[n : n + 1]] * 2))
    runner.reset_slot(0, GREEDY)
    assert (runner.frames(0), runner.frames(1)) == (0, 3)
    again = [frame_row(runner.step([0], codes[n : n + 1]), 0) for n in range(4)]
    assert again == run_alone(tiny, codes)


def test_forced_tokens_replace_sampling_and_reach_the_output(tiny: MoshiLM) -> None:
    runner = MoshiRunner(tiny, max_slots=1)
    runner.reset_slot(0, GREEDY)
    forced = torch.full((1, 1 + TINY.agent_q), -1)
    forced[0, 0] = TINY.text_padding_id
    forced[0, 2] = 5
    codes = user_codes(TINY, 2, seed=3)
    first = runner.step([0], codes[:1], forced)
    assert int(first.sampled_text[0]) == TINY.text_padding_id
    assert int(first.sampled_audio[0, 1]) == 5
    second = runner.step([0], codes[1:])
    assert int(second.text[0]) == TINY.text_padding_id


def test_step_refuses_bad_input(tiny: MoshiLM) -> None:
    runner = MoshiRunner(tiny, max_slots=2)
    with pytest.raises(ValueError, match="distinct"):
        runner.step([0, 0], torch.zeros(2, TINY.user_q, dtype=torch.long))
    with pytest.raises(ValueError, match="outside"):
        runner.step([2], torch.zeros(1, TINY.user_q, dtype=torch.long))
    with pytest.raises(ValueError, match="user_codes"):
        runner.step([0], torch.zeros(1, 3, dtype=torch.long))


# --- sampling ------------------------------------------------------------------------------


def test_sampling_is_reproducible_per_slot_seed(tiny: MoshiLM) -> None:
    codes = user_codes(TINY, 8, seed=21)
    params = SlotSampling(seed=5, text=SamplingParams(1.0, 0), audio=SamplingParams(1.0, 0))
    first = run_alone(tiny, codes, params)
    assert run_alone(tiny, codes, params, slot=2) == first
    assert run_alone(tiny, codes, replace(params, seed=6)) != first
    assert run_alone(tiny, codes, GREEDY) != first


# --- package surface -----------------------------------------------------------------------


def test_package_surface() -> None:
    import ast
    import inspect

    import duplex.models.moshi as moshi

    assert len(moshi.__all__) == len(set(moshi.__all__))
    for name in moshi.__all__:
        obj = vars(moshi)[name]
        if inspect.isclass(obj):
            assert obj.__dict__.get("__final__", False), name
    for path in Path(moshi.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                module = getattr(node, "module", None) or ""
                assert "trio" not in [*names, module.split(".")[0]], path.name
