"""Moshi behind the real `Engine`: slot isolation, cadence, resets, checkpoints and loading."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from duplex.exceptions import ConfigError, PromptUnsupported, UnknownModel
from duplex.models import (
    Engine,
    ModelOptions,
    SamplingRequest,
    SlotHandle,
    SlotPrompt,
    get_model,
    model_names,
)
from duplex.models.moshi._checkpoint import (
    CHECKPOINT_FILES,
    LM_FILE,
    TOKENIZER_FILE,
    LoadedMoshi,
    build_tiny_checkpoint,
    check_checkpoint,
    find_checkpoint,
    load_checkpoint,
    tiny_checkpoint,
)
from duplex.models.moshi._engine_runner import MoshiEngineRunner, session_seed, stream_seed
from duplex.models.moshi._models import moshi_spec
from duplex.models.moshi._sampling import SamplingParams

from ..models_support import FRAME, FakeTimer, tone

SEED = 7
Trace = list[tuple[np.ndarray, str]]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedMoshi:
    folder = tmp_path_factory.mktemp("tiny")
    return load_checkpoint(build_tiny_checkpoint(folder, seed=3))


def engine(loaded: LoadedMoshi, seed: int = SEED) -> Engine:
    return Engine(MoshiEngineRunner(loaded, moshi_spec("tiny"), seed=seed), timer=FakeTimer())


def signal(name: str, frames: int) -> list[np.ndarray]:
    return [tone(ord(name), k) for k in range(frames)]


def speaks(runner: MoshiEngineRunner) -> int:
    """Six frames of a tone through an engine on ``runner``: it says some text and its
    audio is float32 in full scale. The slot it ran on."""
    eng = Engine(runner, timer=FakeTimer())
    handle = eng.acquire_slot("x")
    assert handle is not None
    texts, peaks = [], []
    for tick, frame in enumerate(signal("x", 6)):
        eng.push_input(handle, frame)
        result = eng.step(tick * 0.08)[handle]
        assert result.frame.pcm.dtype == np.float32
        texts.append(result.frame.text)
        peaks.append(float(np.abs(result.frame.pcm).max()))
    assert "".join(texts) and 0 < max(peaks) <= 1.0
    return handle.slot


def run_alone(
    loaded: LoadedMoshi, frames: list[np.ndarray], *, slot: int, generation: int
) -> Trace:
    """One session on its own engine, placed on ``slot`` as its ``generation``-th session."""
    eng = engine(loaded)
    for _ in range(generation):  # earlier sessions on that slot (and the ones below it)
        earlier = [eng.acquire_slot(f"earlier-{i}") for i in range(slot + 1)]
        eng.step(0.0)
        for handle in earlier:
            assert handle is not None and eng.release_slot(handle)
        eng.step(0.0)  # frees them
    below = [eng.acquire_slot(f"below-{i}") for i in range(slot)]
    handle = eng.acquire_slot("alone")
    assert handle is not None and handle.slot == slot
    for other in below:
        assert other is not None and eng.release_slot(other)  # never stepped
    trace: Trace = []
    for frame in frames:
        eng.push_input(handle, frame)
        out = eng.step(0.0)
        assert set(out) == {handle}
        trace.append((out[handle].frame.pcm, out[handle].frame.text))
    return trace


def assert_same(got: Trace, want: Trace, name: str) -> None:
    assert [t for _, t in got] == [t for _, t in want], name
    # Float rounding moves with the batch make-up (~1e-6); tokens must not move at all.
    np.testing.assert_allclose(
        np.stack([p for p, _ in got]), np.stack([p for p, _ in want]), rtol=0, atol=1e-4
    )


def test_a_warmed_up_runner_serves_its_first_session_as_a_fresh_one(loaded: LoadedMoshi) -> None:
    """`warm_up` (the server's, before ``/health`` says ok) steps slot 0 and leaves nothing:
    the first session on slot 0 is the one a fresh runner gives, and its first step is
    not a warm-up step (the fresh runner's is)."""
    warmed = MoshiEngineRunner(loaded, moshi_spec("tiny"), seed=SEED)
    warmed.warm_up()
    assert warmed.generation(0) == -1
    frames = signal("w", 6)
    traces, warmups = [], []
    for runner in (warmed, MoshiEngineRunner(loaded, moshi_spec("tiny"), seed=SEED)):
        eng = Engine(runner, timer=FakeTimer())
        handle = eng.acquire_slot("w")
        assert handle is not None and handle.slot == 0
        trace: Trace = []
        for frame in frames:
            eng.push_input(handle, frame)
            out = eng.step(0.0)[handle]
            trace.append((out.frame.pcm, out.frame.text))
        traces.append(trace)
        warmups.append(eng.statistics().warmup_steps)
        assert runner.generation(0) == 0
    assert_same(traces[0], traces[1], "warmed up")
    assert "".join(t for _, t in traces[0])  # it said something: the traces are not empty
    assert warmups == [0, 1]


def test_sessions_joining_and_leaving_match_their_solo_runs(loaded: LoadedMoshi) -> None:
    # name: (first tick, frames); D takes A's slot after A leaves (its second generation)
    sessions = {"A": (0, 6), "B": (1, 12), "C": (3, 5), "D": (8, 6)}
    inputs = {name: signal(name, frames) for name, (_, frames) in sessions.items()}
    eng = engine(loaded)
    handles: dict[str, SlotHandle] = {}
    traces: dict[str, Trace] = {name: [] for name in sessions}
    underrun_at = {"B": 4}  # one tick with no input: the runner feeds silence
    for tick in range(14):
        for name, (start, frames) in sessions.items():
            if tick == start:
                handle = eng.acquire_slot(name)
                assert handle is not None
                handles[name] = handle
            elif tick == start + frames:
                assert eng.release_slot(handles.pop(name))
        for name, handle in handles.items():
            k = len(traces[name])
            if underrun_at.get(name) != k:
                eng.push_input(handle, inputs[name][k])
        out = eng.step(tick * 0.08)
        # every live session gets exactly one output this tick, one frame further on
        assert set(out) == set(handles.values())
        for name, handle in handles.items():
            result = out[handle]
            assert result.position == len(traces[name]) * FRAME
            traces[name].append((result.frame.pcm, result.frame.text))
    assert all(len(traces[n]) == frames for n, (_, frames) in sessions.items())
    slots = {"A": (0, 0), "B": (1, 0), "C": (2, 0), "D": (0, 1)}
    for name, (slot, generation) in slots.items():
        frames = list(inputs[name])
        if name in underrun_at:
            frames[underrun_at[name]] = np.zeros(FRAME, dtype=np.float32)
        alone = run_alone(loaded, frames, slot=slot, generation=generation)
        assert_same(traces[name], alone, name)
    # the model speaks: text appears and audio is full scale at most
    assert "".join(t for _, t in traces["B"])
    assert max(float(np.abs(p).max()) for p, _ in traces["B"]) <= 1.0


def test_warm_up_frame_is_silent_and_not_speaking(loaded: LoadedMoshi) -> None:
    eng = engine(loaded)
    handle = eng.acquire_slot("a")
    assert handle is not None
    frames = []
    for k in range(4):
        eng.push_input(handle, tone(1, k))
        frames.append(eng.step(0.0)[handle].frame)
    first = frames[0]  # max_delay is 1: the first frame has no audio or text yet
    assert not first.pcm.any() and first.text == "" and not first.speaking
    assert not any(f.end_of_turn for f in frames)
    # random weights make noise: loud output counts as speaking
    assert all(f.speaking for f in frames[1:])


def test_reset_restarts_one_slot_and_leaves_the_other(loaded: LoadedMoshi) -> None:
    a_in, b_in = signal("a", 9), signal("b", 9)
    eng = engine(loaded)
    a, b = eng.acquire_slot("a"), eng.acquire_slot("b")
    assert a is not None and b is not None
    got: dict[str, Trace] = {"a": [], "b": []}
    for k in range(9):
        if k == 4:
            eng.reset(a, epoch=1)
        eng.push_input(a, a_in[k])
        eng.push_input(b, b_in[k])
        out = eng.step(0.0)
        for name, handle in (("a", a), ("b", b)):
            got[name].append((out[handle].frame.pcm, out[handle].frame.text))
        assert out[a].epoch == (1 if k >= 4 else 0)
    assert_same(got["b"], run_alone(loaded, b_in, slot=1, generation=0), "b")
    # after the reset, a replays as a fresh session with the same seed (same slot and generation)
    assert_same(got["a"][4:], run_alone(loaded, a_in[4:], slot=0, generation=0), "a")


def test_seed_changes_the_sampling() -> None:
    assert stream_seed(0, 0, 0) == stream_seed(0, 0, 0)
    assert len({stream_seed(0, 0, 0), stream_seed(1, 0, 0), stream_seed(0, 1, 0)}) == 3
    assert stream_seed(0, 0, 1) != stream_seed(0, 0, 0)


def test_other_seed_other_output(loaded: LoadedMoshi) -> None:
    frames = signal("x", 10)
    texts = []
    for seed in (SEED, SEED + 1):
        eng = engine(loaded, seed)
        handle = eng.acquire_slot("x")
        assert handle is not None
        text = ""
        for frame in frames:
            eng.push_input(handle, frame)
            text += eng.step(0.0)[handle].frame.text
        texts.append(text)
    assert texts[0] != texts[1]


# -- per-session sampling --------------------------------------------------------


def engine_and_runner(loaded: LoadedMoshi, seed: int = SEED) -> tuple[Engine, MoshiEngineRunner]:
    runner = MoshiEngineRunner(loaded, moshi_spec("tiny"), seed=seed)
    return Engine(runner, timer=FakeTimer()), runner


def sampled(**fields: float | int) -> SlotPrompt:
    return SlotPrompt(sampling=SamplingRequest(**fields))  # type: ignore[arg-type]


def test_two_sessions_get_their_own_sampling_and_a_released_slot_its_default(
    loaded: LoadedMoshi,
) -> None:
    eng, runner = engine_and_runner(loaded)
    assert runner.top_k_limits == (25, 32)  # tiny: 64 text tokens, 32 audio codes
    a = eng.acquire_slot("a", sampled(text_temperature=0.3, text_top_k=5, audio_top_k=10))
    b = eng.acquire_slot("b", sampled(audio_temperature=1.2, text_top_k=0, audio_top_k=999))
    c = eng.acquire_slot("c")  # no request: the runner's own sampling
    assert a is not None and b is not None and c is not None
    eng.step(0.0)
    lm = runner.lm_runner
    got = {h.owner: lm.sampling(h.slot) for h in (a, b, c)}
    assert got["a"].text == SamplingParams(0.3, 5)
    assert got["a"].audio == SamplingParams(0.8, 10)
    # top-k 0 ("keep all") and one over the limit become the limit: the step keeps its width
    assert got["b"].text == SamplingParams(0.7, 25)
    assert got["b"].audio == SamplingParams(1.2, 32)
    assert (got["c"].text, got["c"].audio) == (SamplingParams(0.7, 25), SamplingParams(0.8, 250))
    assert lm.top_k_caps == (25, 32)
    # an epoch reset keeps the session's sampling; the slot's next session starts afresh
    eng.reset(a, epoch=1)
    eng.step(0.08)
    assert lm.sampling(a.slot).text == SamplingParams(0.3, 5)
    assert eng.release_slot(a)
    eng.step(0.16)
    d = eng.acquire_slot("d")
    assert d is not None and d.slot == a.slot
    eng.step(0.24)
    assert lm.sampling(d.slot).text == SamplingParams(0.7, 25)


def test_a_sampling_only_prompt_holds_no_tick_on_a_model_without_prompts(
    loaded: LoadedMoshi,
) -> None:
    eng = engine(loaded)
    assert not eng.spec.supports_prompts
    handle = eng.acquire_slot("a", sampled(text_seed=1))
    assert handle is not None
    eng.push_input(handle, signal("a", 1)[0])
    out = eng.step(0.0)[handle]
    assert not out.frame.holds_input and out.input_samples == FRAME  # its input was taken
    with pytest.raises(PromptUnsupported):  # a prompt to replay is still refused
        eng.acquire_slot("b", SlotPrompt(text="be brief", sampling=SamplingRequest(text_seed=1)))


def test_seeds_make_a_session_reproducible_on_any_slot(loaded: LoadedMoshi) -> None:
    frames = signal("s", 10)
    seeded = sampled(text_seed=1234, audio_seed=99, text_temperature=1.0, audio_temperature=1.0)

    def run(slot: int, prompt: SlotPrompt, engine_seed: int = SEED) -> Trace:
        eng, runner = engine_and_runner(loaded, engine_seed)
        below = [eng.acquire_slot(f"below-{i}") for i in range(slot)]
        handle = eng.acquire_slot("x", prompt)
        assert handle is not None and handle.slot == slot
        trace: Trace = []
        for frame in frames:
            for other in below:
                assert other is not None
                eng.push_input(other, frame)
            eng.push_input(handle, frame)
            out = eng.step(0.0)[handle]
            trace.append((out.frame.pcm, out.frame.text))
        seed = runner.lm_runner.sampling(slot).seed
        assert (seed == session_seed(1234, 99)) == (prompt is seeded)
        return trace

    first = run(0, seeded)
    # another slot, neighbours in the batch, another server seed: the same output
    assert_same(run(2, seeded, engine_seed=SEED + 5), first, "seeded")
    # other seeds: other output; no seeds: the slot's own stream (differs by slot)
    other = run(0, sampled(text_seed=1235, audio_seed=99, text_temperature=1.0))
    assert [t for _, t in other] != [t for _, t in first]
    unseeded = sampled(text_temperature=1.0, audio_temperature=1.0)
    assert [t for _, t in run(0, unseeded)] != [t for _, t in run(2, unseeded)]


def test_text_table_blanks_special_tokens(loaded: LoadedMoshi) -> None:
    pieces = loaded.pieces
    assert len(pieces) == loaded.lm.config.text_card == 64
    assert pieces[0] == pieces[3] == ""  # end-of-padding and PAD say nothing
    assert all(p for p in pieces[4:]) and " " in "".join(pieces)


# --- checkpoints --------------------------------------------------------------------------


def test_tiny_checkpoint_is_deterministic_and_loads_by_inference(tmp_path: Path) -> None:
    one = build_tiny_checkpoint(tmp_path / "one", seed=5)
    two = build_tiny_checkpoint(tmp_path / "two", seed=5)
    other = build_tiny_checkpoint(tmp_path / "other", seed=6)
    for name in CHECKPOINT_FILES:
        assert (one.folder / name).read_bytes() == (two.folder / name).read_bytes(), name
    assert (one.lm_path).read_bytes() != (other.lm_path).read_bytes()
    inferred = check_checkpoint(one.folder)  # no preset named: read from the tensor shapes
    assert inferred.lm.name == "tiny" and inferred.mimi.name == "tiny"
    assert find_checkpoint(str(one.folder)) == inferred
    assert find_checkpoint(f"tiny-personaplex:{one.folder}") is not None
    assert find_checkpoint("no-such-name") is None


def test_tiny_cache_is_reused_and_rebuilt_when_damaged(tmp_path: Path) -> None:
    first = tiny_checkpoint(tmp_path, seed=2)
    assert first.folder == tmp_path / "tiny-2"
    stamp = os.stat(first.lm_path).st_mtime_ns
    assert tiny_checkpoint(tmp_path, seed=2).folder == first.folder
    assert os.stat(first.lm_path).st_mtime_ns == stamp  # reused, not rebuilt
    good = first.lm_path.read_bytes()
    first.lm_path.write_bytes(good[: len(good) // 2])
    tiny_checkpoint(tmp_path, seed=2)
    assert first.lm_path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-2"]  # no scratch left behind


def test_missing_checkpoints_fail_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConfigError, match="never downloaded") as info:
        get_model("moshi-7b")
    assert "\n" not in str(info.value) and "kyutai/moshiko-pytorch-bf16" in str(info.value)
    with pytest.raises(ConfigError, match="does not exist"):
        get_model(str(tmp_path / "nowhere"))
    partial = build_tiny_checkpoint(tmp_path / "partial", seed=1).folder
    (partial / TOKENIZER_FILE).unlink()
    with pytest.raises(ConfigError, match=f"lacks {TOKENIZER_FILE}"):
        get_model(str(partial))
    (tmp_path / "junk").mkdir()
    for name in CHECKPOINT_FILES:
        (tmp_path / "junk" / name).write_bytes(b"junk")
    with pytest.raises(ConfigError, match="not a safetensors file"):
        get_model(str(tmp_path / "junk"))
    with pytest.raises(UnknownModel, match="tiny"):
        get_model("nope")
    assert {"loopback", "moshi-7b", "personaplex-7b", "tiny"} <= set(model_names())


def test_hf_cache_snapshot_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    root = tmp_path / "models--kyutai--moshiko-pytorch-bf16"
    snapshot = root / "snapshots" / "abc123"
    build_tiny_checkpoint(snapshot, seed=1)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("abc123")
    spec, _factory = get_model("moshi-7b")
    assert spec.name == "moshi-7b" and spec.supports_model_native_turn_policy
    found = find_checkpoint("moshi-7b")
    assert found is not None and found.folder == snapshot and found.lm.name == "moshi-7b"


def test_registry_builds_tiny_into_the_cache_and_runs(tmp_path: Path) -> None:
    spec, factory = get_model("tiny", ModelOptions(cache_dir=tmp_path, seed=SEED))
    assert (spec.sample_rate, spec.frame_samples, spec.max_slots) == (24_000, 1_920, 16)
    assert spec.supports_model_native_turn_policy and not spec.supports_video_input
    runner = factory(spec)
    assert sorted(p.name for p in (tmp_path / f"tiny-{SEED}").iterdir()) == sorted(
        [*CHECKPOINT_FILES, "duplex-build.json"]
    )
    assert (tmp_path / f"tiny-{SEED}" / LM_FILE).is_file()
    eng = Engine(runner, timer=FakeTimer())
    handle = eng.acquire_slot("s")
    assert handle is not None
    eng.push_input(handle, tone(0, 0))
    assert eng.step(0.0)[handle].frame.pcm.shape == (FRAME,)


def test_gpu_pools_are_sized_from_free_memory() -> None:
    from duplex.exceptions import ConfigError
    from duplex.models.moshi import mimi_preset, moshi_preset
    from duplex.models.moshi._models import (
        MAX_GPU_SLOTS,
        memory_slots,
        per_slot_bytes,
        weight_bytes,
    )

    lm, mimi = moshi_preset("moshi-7b"), mimi_preset("mimi")
    weights, per_slot = weight_bytes(lm, mimi), per_slot_bytes(lm, mimi)
    assert 15.3e9 < weights < 15.9e9  # 7.69 G bf16 LM values + 96 M float32 Mimi values
    assert lm.kv_bytes_per_slot(2) < per_slot < 1.2 * lm.kv_bytes_per_slot(2) + 1e8
    gib = 1 << 30
    # an H200 with 139 GiB free: the measured run fit 80 slots in bf16
    assert 70 <= memory_slots(139 * gib, weights, per_slot) <= 80
    assert memory_slots(10_000 * gib, weights, per_slot) == MAX_GPU_SLOTS == 512  # capped
    with pytest.raises(ConfigError, match="one session"):
        memory_slots(20 * gib, weights, per_slot)


def test_fp8_kv_doubles_the_gpu_pool_and_serves(loaded: LoadedMoshi, tmp_path: Path) -> None:
    """``kv_cache_dtype = "fp8"``: rings of one byte an element, about twice the slots on
    a GPU, and a tiny engine with an fp8 ring still speaks (CPU: stored fp8, read as float)."""
    from duplex.models.moshi import mimi_preset, moshi_preset
    from duplex.models.moshi._models import memory_slots, per_slot_bytes, weight_bytes

    lm, mimi = moshi_preset("moshi-7b"), mimi_preset("mimi")
    weights, gib = weight_bytes(lm, mimi), 1 << 30
    bf16 = memory_slots(139 * gib, weights, per_slot_bytes(lm, mimi))
    fp8 = memory_slots(139 * gib, weights, per_slot_bytes(lm, mimi, kv_bytes=1))
    assert 1.9 * bf16 <= fp8 <= 2.0 * bf16

    options = ModelOptions(seed=SEED, cache_dir=tmp_path, kv_cache_dtype="fp8")
    spec, factory = get_model("tiny", options)
    runner = factory(spec)
    assert isinstance(runner, MoshiEngineRunner)
    assert runner.lm_runner.kv_ring.keys.dtype == torch.float8_e4m3fn
    speaks(runner)
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        ModelOptions(kv_cache_dtype="int2")


def test_a_bf16_codec_serves_and_takes_less_of_the_gpu_pool(tmp_path: Path) -> None:
    """``codec_dtype = "bf16"``: Mimi's weights and rings at two bytes a value (more slots in
    the same memory), and a tiny engine with a bf16 codec still speaks; another value is
    refused."""
    from duplex.models.moshi import mimi_preset, moshi_preset
    from duplex.models.moshi._models import per_slot_bytes, weight_bytes

    lm, mimi = moshi_preset("moshi-7b"), mimi_preset("mimi")
    saved = weight_bytes(lm, mimi) - weight_bytes(lm, mimi, mimi_bytes=2)
    assert 155e6 < saved < 162e6  # 79 M Mimi values, two bytes fewer each (codebooks: float32)
    assert per_slot_bytes(lm, mimi, mimi_bytes=2) < per_slot_bytes(lm, mimi)

    options = ModelOptions(seed=SEED, cache_dir=tmp_path, codec_dtype="bf16")
    spec, factory = get_model("tiny", options)
    runner = factory(spec)
    assert isinstance(runner, MoshiEngineRunner)
    assert next(runner.mimi_streams.model.parameters()).dtype == torch.bfloat16
    speaks(runner)
    with pytest.raises(ConfigError, match="codec_dtype"):
        ModelOptions(codec_dtype="fp16")


def test_fp8_weights_free_most_of_the_lm_and_serve(tmp_path: Path) -> None:
    """``weight_dtype = "fp8"``: the temporal transformer's linears at one byte a value and
    a float32 scale a row (6.6 GB fewer for the 7B: more slots in the same memory), and a
    tiny engine with them still speaks; another value is refused."""
    from duplex.models.moshi import mimi_preset, moshi_preset
    from duplex.models.moshi._models import memory_slots, per_slot_bytes, weight_bytes

    lm, mimi = moshi_preset("moshi-7b"), mimi_preset("mimi")
    full, fp8 = weight_bytes(lm, mimi), weight_bytes(lm, mimi, fp8_temporal=True)
    assert 6.5e9 < full - fp8 < 6.6e9
    per_slot, gib = per_slot_bytes(lm, mimi, kv_bytes=1), 1 << 30
    assert memory_slots(139 * gib, fp8, per_slot) > memory_slots(139 * gib, full, per_slot)

    options = ModelOptions(seed=SEED, cache_dir=tmp_path, weight_dtype="fp8")
    spec, factory = get_model("tiny", options)
    runner = factory(spec)
    assert isinstance(runner, MoshiEngineRunner)
    layer = runner.lm_runner.model.transformer.layers[0]
    assert layer.gating.linear_out.weight.dtype == torch.float8_e4m3fn
    speaks(runner)
    with pytest.raises(ConfigError, match="weight_dtype"):
        ModelOptions(weight_dtype="int8")


def test_fp8_weights_are_refused_on_a_gpu_without_fp8_tensor_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Below compute capability 8.9 (an A100, say) fp8 weights would run emulated, slower
    and larger than bf16: the server refuses to start with them, saying why. (No such GPU
    is here: the device query is what is replaced.)"""
    from duplex.models.moshi import mimi_preset, moshi_preset
    from duplex.models.moshi._models import _spec_for

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    options = ModelOptions(device="cuda", weight_dtype="fp8")
    with pytest.raises(ConfigError, match=r"compute capability 8\.9.*NVIDIA A100"):
        _spec_for(moshi_preset("moshi-7b"), mimi_preset("mimi"), options)


def test_int4_kv_holds_more_sessions_and_serves(loaded: LoadedMoshi, tmp_path: Path) -> None:
    """``kv_cache_dtype = "int4"``: 72 bytes a 128-wide head row (against 128 in fp8), so
    about 1.75 times fp8's slots on a GPU; a tiny engine with an int4 ring still speaks."""
    from duplex.models.moshi import INT4, mimi_preset, moshi_preset
    from duplex.models.moshi._models import KV_BYTES, memory_slots, per_slot_bytes, weight_bytes

    lm, mimi = moshi_preset("moshi-7b"), mimi_preset("mimi")
    weights, gib = weight_bytes(lm, mimi), 1 << 30
    fp8 = memory_slots(139 * gib, weights, per_slot_bytes(lm, mimi, kv_bytes=1))
    int4 = memory_slots(139 * gib, weights, per_slot_bytes(lm, mimi, kv_bytes=KV_BYTES["int4"]))
    assert 1.6 * fp8 <= int4 <= 1.8 * fp8
    # the served H200 precisions (fp8 weights, bf16 Mimi): past 256, the old bound
    served = memory_slots(
        139 * gib,
        weight_bytes(lm, mimi, mimi_bytes=2, fp8_temporal=True),
        per_slot_bytes(lm, mimi, kv_bytes=KV_BYTES["int4"], mimi_bytes=2),
    )
    assert 256 < served < 300

    options = ModelOptions(seed=SEED, cache_dir=tmp_path, kv_cache_dtype="int4")
    spec, factory = get_model("tiny", options)
    runner = factory(spec)
    assert isinstance(runner, MoshiEngineRunner)
    ring = runner.lm_runner.kv_ring
    assert ring.int4 and ring.keys.dtype == torch.uint8 and INT4 == "int4"
    slot = speaks(runner)
    assert bool((ring.key_scales[:, slot] > 0).any())  # the slot's rows were written
