"""PersonaPlex prompts replayed into a slot before it goes live (tiny-personaplex on CPU)."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest
import sentencepiece
import torch

from duplex.exceptions import PromptUnsupported
from duplex.models import Engine, SlotHandle, SlotPrompt
from duplex.models._loopback import LOOPBACK_SPEC, LoopbackRunner
from duplex.models.moshi._checkpoint import LoadedMoshi, build_tiny_checkpoint, load_checkpoint
from duplex.models.moshi._engine_runner import MoshiEngineRunner
from duplex.models.moshi._models import moshi_spec
from duplex.models.moshi._prompt import (
    PROMPT_SILENCE_FRAMES,
    prompt_codes,
    wrap_with_system_tags,
)
from duplex.models.moshi._runner import StepTokens

from ..models_support import FRAME, FakeTimer, tone

SEED = 7
TEXT = "You are a small robot. Tell a story."
Trace = list[tuple[np.ndarray, str]]


def _write_wav(path: Path, seconds: float, rate: int = 24_000) -> None:
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())


@pytest.fixture(scope="module")
def plex(tmp_path_factory: pytest.TempPathFactory) -> LoadedMoshi:
    folder = tmp_path_factory.mktemp("tiny-personaplex")
    checkpoint = build_tiny_checkpoint(folder, seed=3, preset="tiny-personaplex")
    _write_wav(folder / "voices" / "robot.wav", 0.5, rate=16_000)  # resampled to 24 kHz
    (folder / "voices" / "NATF0.pt").write_bytes(b"not supported")
    return load_checkpoint(checkpoint)


def runner(loaded: LoadedMoshi, seed: int = SEED) -> MoshiEngineRunner:
    return MoshiEngineRunner(loaded, moshi_spec("tiny-personaplex"), seed=seed)


def spy(run: MoshiEngineRunner) -> list[tuple[StepTokens, torch.Tensor | None]]:
    """Record every LM step's tokens and forced columns."""
    calls: list[tuple[StepTokens, torch.Tensor | None]] = []
    lm = run.lm_runner
    step = lm.step

    def recording(slots, user, forced=None):  # type: ignore[no-untyped-def]
        tokens = step(slots, user, forced)
        calls.append((tokens, None if forced is None else forced.clone()))
        return tokens

    lm.step = recording  # type: ignore[method-assign]
    return calls


def drive(
    eng: Engine, handles: dict[str, SlotHandle], inputs: dict[str, list[np.ndarray]]
) -> dict[str, Trace]:
    """Push every session's whole input up front, then tick until each has one output per
    input frame after its replay (the engine holds what a replay must not consume)."""
    for name, handle in handles.items():
        for frame in inputs[name]:
            eng.push_input(handle, frame)
    got: dict[str, Trace] = {name: [] for name in handles}
    live_outputs = {name: 0 for name in handles}
    for _ in range(200):
        if all(live_outputs[n] >= len(inputs[n]) for n in handles):
            break
        out = eng.step(0.0)
        for name, handle in handles.items():
            item = out[handle]
            got[name].append((item.frame.pcm, item.frame.text))
            live_outputs[name] += item.input_samples // FRAME
    return got


def signal(name: str, frames: int) -> list[np.ndarray]:
    return [tone(ord(name), k) for k in range(frames)]


def test_replay_forces_the_reference_sequence_and_holds_input(plex: LoadedMoshi) -> None:
    run = runner(plex)
    calls = spy(run)
    eng = Engine(run, timer=FakeTimer(), max_input_frames=64)
    handle = eng.acquire_slot("a", SlotPrompt(text=TEXT, voice="robot"))
    assert handle is not None
    frames = signal("a", 3)
    for frame in frames:
        eng.push_input(handle, frame)
    out = eng.step(0.0)[handle]
    replay = run.replay(handle.slot)
    assert replay is not None
    processor = sentencepiece.SentencePieceProcessor()
    processor.Load(str(plex.checkpoint.tokenizer_path))
    tokens = list(processor.Encode(wrap_with_system_tags(TEXT)))
    voice_frames = 7  # 0.5 s of voice in 80 ms frames, the last one zero-padded
    calls_total = voice_frames + 2 * PROMPT_SILENCE_FRAMES + len(tokens)
    assert replay.held == calls_total - 1  # the reference's call 0 runs no model
    assert replay.frames == replay.held + 1  # max_delay 1: acoustic codes reach one live frame
    config = plex.lm.config
    silence, sine = prompt_codes(config)
    pad = config.text_padding_id
    # frame n forces column n + 1: text/semantic of call n + 1, acoustic of call n
    text_col = replay.forced[:, 0].tolist()
    assert text_col[: voice_frames - 1] == [pad] * (voice_frames - 1)
    start = voice_frames - 1 + PROMPT_SILENCE_FRAMES
    assert text_col[start : start + len(tokens)] == tokens
    assert text_col[start + len(tokens) : replay.held] == [pad] * PROMPT_SILENCE_FRAMES
    assert text_col[replay.held] == -1  # the first live frame samples its text
    assert replay.forced[0, 2:].tolist() == [config.card] * 7  # start tokens, as the reference
    assert replay.forced[replay.held, 1] == -1
    assert replay.forced[replay.held, 2:].tolist() == list(silence[1:])
    assert (replay.user == torch.tensor(sine)).all()
    # the engine held the input through the replay, and the outputs were silent
    outputs = [out]
    while len(outputs) < replay.held + 3:
        outputs.append(eng.step(0.0)[handle])
    for k, item in enumerate(outputs[: replay.held]):
        assert item.input_samples == 0
        assert not item.frame.pcm.any() and item.frame.text == "" and not item.frame.speaking
        assert item.frame.holds_input == (k < replay.held - 1)
    assert [o.input_samples for o in outputs[replay.held :]] == [FRAME] * 3
    stats = eng.slot_statistics(handle)
    assert stats.underruns == 0 and stats.queue_depth == 0
    # every forced token is what the step chose, in the sampled columns
    for n in range(replay.frames):
        tokens_n, forced = calls[n]
        assert forced is not None
        chosen = torch.cat([tokens_n.sampled_text[:, None], tokens_n.sampled_audio], dim=1)[0]
        want = replay.forced[n]
        mask = want >= 0
        assert torch.equal(chosen[mask], want[mask]), n
        assert torch.equal(forced[0], want)
    assert calls[replay.frames][1] is None  # after the replay nothing is forced


def test_prompted_and_unprompted_slots_stay_isolated(plex: LoadedMoshi) -> None:
    prompt = SlotPrompt(text=TEXT)
    a_in, b_in = signal("a", 6), signal("b", 6)

    def alone(with_prompt: bool, slot: int, frames: list[np.ndarray]) -> Trace:
        eng = Engine(runner(plex), timer=FakeTimer(), max_input_frames=64)
        below = [eng.acquire_slot(f"below-{i}") for i in range(slot)]
        handle = eng.acquire_slot("x", prompt if with_prompt else None)
        assert handle is not None and handle.slot == slot
        for other in below:
            assert other is not None and eng.release_slot(other)
        return drive(eng, {"x": handle}, {"x": frames})["x"]

    eng = Engine(runner(plex), timer=FakeTimer(), max_input_frames=64)
    a = eng.acquire_slot("a", prompt)
    b = eng.acquire_slot("b")
    assert a is not None and b is not None
    got = drive(eng, {"a": a, "b": b}, {"a": a_in, "b": b_in})
    want_a, want_b = alone(True, 0, a_in), alone(False, 1, b_in)
    for name, want in (("a", want_a), ("b", want_b)):
        have = got[name][: len(want)]
        assert [t for _, t in have] == [t for _, t in want], name
        np.testing.assert_allclose(
            np.stack([p for p, _ in have]), np.stack([p for p, _ in want]), rtol=0, atol=1e-4
        )
    # the unprompted slot speaks from its second frame; the prompted one is silent meanwhile
    assert got["b"][1][0].any() and not got["a"][1][0].any()


def test_same_prompt_and_seed_reproduce_and_the_prompt_matters(plex: LoadedMoshi) -> None:
    frames = signal("c", 5)

    def once(prompt: SlotPrompt, seed: int = SEED) -> Trace:
        eng = Engine(runner(plex, seed), timer=FakeTimer(), max_input_frames=64)
        handle = eng.acquire_slot("c", prompt)
        assert handle is not None
        return drive(eng, {"c": handle}, {"c": frames})["c"]

    first, second = once(SlotPrompt(text=TEXT)), once(SlotPrompt(text=TEXT))
    assert [t for _, t in first] == [t for _, t in second]
    np.testing.assert_array_equal(np.stack([p for p, _ in first]), np.stack([p for p, _ in second]))
    other = once(SlotPrompt(text="Talk about the weather."))
    assert len(other) < len(first)  # a shorter prompt, a shorter replay
    assert not np.array_equal(  # the live frames differ: the prompt conditioned the model
        np.stack([p for p, _ in first[-3:]]), np.stack([p for p, _ in other[-3:]])
    )


def test_reset_replays_the_prompt_again(plex: LoadedMoshi) -> None:
    run = runner(plex)
    eng = Engine(run, timer=FakeTimer(), max_input_frames=64)
    handle = eng.acquire_slot("a", SlotPrompt(text=TEXT))
    assert handle is not None
    replay = run.replay(handle.slot)
    for _ in range(3):
        eng.step(0.0)
    replay = run.replay(handle.slot)
    assert replay is not None
    for _ in range(replay.held):
        eng.step(0.0)
    eng.push_input(handle, tone(1, 0))
    assert eng.step(0.0)[handle].input_samples == FRAME
    eng.reset(handle, epoch=1, clear_input=False)
    eng.push_input(handle, tone(1, 1))
    held = [eng.step(0.0)[handle] for _ in range(replay.held)]
    assert all(o.input_samples == 0 and o.epoch == 1 for o in held)
    assert eng.step(0.0)[handle].input_samples == FRAME  # kept through the replay


def test_prompts_are_refused_where_they_cannot_run(plex: LoadedMoshi, tmp_path: Path) -> None:
    loop = Engine(LoopbackRunner(LOOPBACK_SPEC), timer=FakeTimer())
    with pytest.raises(PromptUnsupported, match="takes no prompt"):
        loop.acquire_slot("a", SlotPrompt(text="hi"))
    assert loop.acquire_slot("b", SlotPrompt(text="  ")) is not None  # empty: no prompt
    moshi = build_tiny_checkpoint(tmp_path / "tiny", seed=3)
    plain = Engine(MoshiEngineRunner(load_checkpoint(moshi), moshi_spec("tiny")))
    assert not plain.spec.supports_prompts
    with pytest.raises(PromptUnsupported):
        plain.acquire_slot("a", SlotPrompt(text="hi"))
    eng = Engine(runner(plex), timer=FakeTimer())
    assert eng.spec.supports_prompts
    with pytest.raises(PromptUnsupported, match="embeddings"):
        eng.acquire_slot("a", SlotPrompt(voice="NATF0"))
    with pytest.raises(PromptUnsupported, match="no voice"):
        eng.acquire_slot("a", SlotPrompt(voice="nobody"))
    with pytest.raises(PromptUnsupported, match="plain file name"):
        eng.acquire_slot("a", SlotPrompt(voice="../voices/robot"))
    assert eng.statistics().live_slots == 0


def test_input_sent_in_real_time_during_a_long_replay_is_kept(plex: LoadedMoshi) -> None:
    run = runner(plex)
    eng = Engine(run, timer=FakeTimer(), max_input_frames=4)  # far shorter than the replay
    handle = eng.acquire_slot("a", SlotPrompt(text=TEXT, voice="robot"))
    assert handle is not None
    sent = signal("a", 80)
    consumed = 0
    for frame in sent:  # one frame per tick, as a live microphone
        push = eng.push_input(handle, frame)
        assert not push.overflowed
        consumed += eng.step(0.0)[handle].input_samples
    replay = run.replay(handle.slot)
    assert replay is not None and replay.held > 4
    assert consumed == (len(sent) - replay.held) * FRAME
    assert eng.slot_statistics(handle).queue_depth == replay.held  # the backlog, kept


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_replay_on_cuda_graphs_equals_eager_and_cpu(
    plex: LoadedMoshi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompted and an unprompted session on the GPU: replayed CUDA graphs (with the
    Triton kernels) give the eager GPU frames, and the same text as the CPU."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # float32 as on the CPU
    gpu = load_checkpoint(plex.checkpoint, device="cuda")
    inputs = {"a": signal("a", 6), "b": signal("b", 6)}

    def run(loaded: LoadedMoshi, graphs: bool | None) -> dict[str, Trace]:
        spec = moshi_spec("tiny-personaplex")
        eng = Engine(
            MoshiEngineRunner(loaded, spec, seed=SEED, cuda_graphs=graphs),
            timer=FakeTimer(),
            max_input_frames=64,
        )
        a, b = eng.acquire_slot("a", SlotPrompt(text=TEXT)), eng.acquire_slot("b")
        assert a is not None and b is not None
        return drive(eng, {"a": a, "b": b}, inputs)

    graphed, eager, cpu = run(gpu, True), run(gpu, False), run(plex, None)
    for name in inputs:
        assert [t for _, t in graphed[name]] == [t for _, t in eager[name]], name
        np.testing.assert_allclose(
            np.stack([p for p, _ in graphed[name]]),
            np.stack([p for p, _ in eager[name]]),
            rtol=0,
            atol=1e-4,
        )
        assert [t for _, t in graphed[name]] == [t for _, t in cpu[name]], name
