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
from duplex.models.moshi._lm import MoshiLM
from duplex.models.moshi._models import moshi_spec
from duplex.models.moshi._prompt import (
    PROMPT_SILENCE_FRAMES,
    SILENCE_CODES,
    VoiceTables,
    prompt_codes,
    voice_codes_from_embeddings,
    wrap_with_system_tags,
)
from duplex.models.moshi._runner import StepTokens

from ..models_support import FRAME, FakeTimer, tone

SEED = 7
TEXT = "You are a small robot. Tell a story."
Trace = list[tuple[np.ndarray, str]]


def _write_wav(path: Path, seconds: float, rate: int = 24_000, noise: bool = False) -> None:
    t = np.arange(int(seconds * rate)) / rate
    wave_ = 0.3 * np.sin(2 * np.pi * 220 * t)
    if noise:  # varied frames, so the voice's codes vary
        wave_ = wave_ * np.sin(2 * np.pi * 1.3 * t) + 0.2 * np.random.default_rng(
            5
        ).standard_normal(t.size)
    pcm = (np.clip(wave_, -1, 1) * 32767).astype("<i2")
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())


def wav_codes(loaded: LoadedMoshi, voice: str) -> torch.Tensor:
    """The voice's Mimi codes ``[V, 8]`` as a WAV-prompted slot computes them."""
    run = runner(loaded)
    return run._encode_voice(run._voices.voice(voice), slot=0)


def reference_voice_file(lm: MoshiLM, codes: torch.Tensor) -> dict[str, torch.Tensor]:
    """What NVIDIA's PersonaPlex saves after a voice pass over ``codes`` (``[V, 8]``).

    Mirrors ``LMGen._step_voice_prompt_core`` with ``save_voice_prompt_embeddings``
    (NVIDIA/personaplex ``moshi/moshi/models/lm.py``): the model runs in bfloat16; call
    ``t`` of the pass forces text PAD (3), agent codes ``codes[t]`` and the user SINE
    codes; from call 1 on it saves ``embed_codes`` of the column it consumes (column
    ``t - 1``: the 16 audio embeddings summed in order, then the text embedding), and the
    file's ``cache`` is the token ring (width ``max_delay + 3``, unwritten ``-2``) after the
    pass. Written from the reference's rules, not from ``duplex``'s own column builder.
    """
    config = lm.config
    assert (config.agent_q, config.user_q, config.max_delay) == (8, 8, 1)
    _, sine = prompt_codes(config)
    frames = codes.shape[0]
    initial = [config.text_card] + [config.card] * 16
    delays = config.delays
    width = config.max_delay + 3
    ring = torch.full((17, width), -2, dtype=torch.long)
    columns = []
    for t in range(frames):  # prepare_step_input of call t (offset t)
        for k in range(1, 17):
            token = codes[t, k - 1] if k <= 8 else sine[k - 9]
            ring[k, (t + delays[k]) % width] = token
        ring[0, t % width] = 3
        for k, delay in enumerate(delays):
            if t <= delay:
                ring[k, t % width] = initial[k]
        if t == 0:
            ring[:, 0] = torch.tensor(initial)
        else:
            columns.append(ring[:, (t - 1) % width].clone())  # the model input, column t - 1
    tables = [lm.emb[k].weight.detach().bfloat16() for k in range(16)]
    text = lm.text_emb.weight.detach().bfloat16()
    embeddings = []
    for column in columns:
        total = tables[0][column[1]]
        for k in range(1, 16):
            total = total + tables[k][column[k + 1]]
        embeddings.append((total + text[column[0]])[None, None])  # [B=1, T=1, dim]
    return {"embeddings": torch.stack(embeddings), "cache": ring[None]}


@pytest.fixture(scope="module")
def plex(tmp_path_factory: pytest.TempPathFactory) -> LoadedMoshi:
    folder = tmp_path_factory.mktemp("tiny-personaplex")
    checkpoint = build_tiny_checkpoint(folder, seed=3, preset="tiny-personaplex")
    _write_wav(folder / "voices" / "robot.wav", 0.5, rate=16_000)  # resampled to 24 kHz
    _write_wav(folder / "speech.wav", 2.0, noise=True)
    (folder / "voices" / "NATF0.pt").write_bytes(b"not supported")
    loaded = load_checkpoint(checkpoint)
    for voice in ("robot", "speech"):  # written before any runner: runners read .pt tables
        saved = reference_voice_file(loaded.lm, wav_codes(loaded, voice))
        torch.save(saved, folder / "voices" / f"{voice}-pt.pt")
    return loaded


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
    with pytest.raises(PromptUnsupported, match="not a readable torch file"):
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


def test_pt_voice_turns_back_into_the_wav_codes(plex: LoadedMoshi) -> None:
    config = plex.lm.config
    assert (config.agent_q, config.user_q) == (8, 8)  # what prompts need
    tables = VoiceTables.of(plex.lm)
    silence, _ = prompt_codes(config)
    for voice, frames in (("robot", 7), ("speech", 25)):
        want = wav_codes(plex, voice)
        assert want.shape == (frames, 8)
        path = plex.checkpoint.folder / "voices" / f"{voice}-pt.pt"
        got = voice_codes_from_embeddings(path, tables)
        assert torch.equal(got[1:], want[1:]), voice  # frame 0 never reaches the model
        assert got[0].tolist() == list(silence) == [c % config.card for c in SILENCE_CODES]


def test_pt_voice_replays_exactly_as_its_wav(plex: LoadedMoshi) -> None:
    frames = signal("v", 5)

    def once(voice: str) -> tuple[Trace, list[torch.Tensor | None], tuple[torch.Tensor, ...]]:
        run = runner(plex)
        calls = spy(run)
        eng = Engine(run, timer=FakeTimer(), max_input_frames=64)
        handle = eng.acquire_slot("v", SlotPrompt(text=TEXT, voice=voice))
        assert handle is not None
        trace = drive(eng, {"v": handle}, {"v": frames})["v"]
        replay = run.replay(handle.slot)
        assert replay is not None
        held = torch.tensor(replay.held)
        return trace, [f for _, f in calls], (held, replay.user.cpu(), replay.forced.cpu())

    for voice in ("robot", "speech"):
        wav, pt = once(voice), once(f"{voice}-pt")
        for a, b in zip(wav[2], pt[2], strict=True):
            assert torch.equal(a, b), voice
        assert len(wav[1]) == len(pt[1])
        for a, b in zip(wav[1], pt[1], strict=True):
            assert (a is None and b is None) or (
                a is not None and b is not None and torch.equal(a, b)
            )
        assert [t for _, t in wav[0]] == [t for _, t in pt[0]], voice
        np.testing.assert_array_equal(
            np.stack([p for p, _ in wav[0]]), np.stack([p for p, _ in pt[0]])
        )


def test_pt_voice_of_other_weights_is_refused(plex: LoadedMoshi, tmp_path: Path) -> None:
    other = load_checkpoint(build_tiny_checkpoint(tmp_path, seed=4, preset="tiny-personaplex"))
    _write_wav(tmp_path / "voices" / "robot.wav", 0.5)
    saved = reference_voice_file(plex.lm, wav_codes(plex, "robot"))  # seed 3's weights
    eng = Engine(runner(other), timer=FakeTimer())
    torch.save(saved, tmp_path / "voices" / "plex.pt")  # added after the model loaded: fine
    with pytest.raises(PromptUnsupported, match="do not match this checkpoint"):
        eng.acquire_slot("a", SlotPrompt(voice="plex"))
    assert eng.statistics().live_slots == 0
    own = reference_voice_file(other.lm, wav_codes(other, "robot"))
    torch.save(own, tmp_path / "voices" / "own.pt")
    assert eng.acquire_slot("b", SlotPrompt(voice="own.pt")) is not None  # its own weights


def test_malformed_pt_voices_are_refused_and_the_engine_goes_on(plex: LoadedMoshi) -> None:
    voices = plex.checkpoint.folder / "voices"
    good = torch.load(voices / "robot-pt.pt", weights_only=True)
    emb, cache = good["embeddings"], good["cache"]
    noisy = emb + 0.05 * torch.randn(emb.shape, generator=torch.Generator().manual_seed(1))
    ring = cache.clone()
    ring[0, 0, (emb.shape[0]) % ring.shape[2]] = 5  # column V-1's text is PAD (3)
    codes = cache.clone()
    codes[0, 1, (emb.shape[0]) % codes.shape[2]] = plex.lm.config.card  # not a voice code
    bad: dict[str, object] = {
        "keys": {"embeddings": emb},
        "extra": {**good, "offset": torch.tensor(7)},
        "list": [emb, cache],
        "rank": {"embeddings": emb[:, 0, 0], "cache": cache},
        "dim": {"embeddings": torch.zeros(3, 1, 1, 65, dtype=torch.bfloat16), "cache": cache},
        "empty": {"embeddings": emb[:0], "cache": cache},
        "int": {"embeddings": emb.long(), "cache": cache},
        "nan": {"embeddings": emb.float().fill_(float("nan")), "cache": cache},
        "width": {"embeddings": emb, "cache": cache[..., :3]},
        "cache-dtype": {"embeddings": emb, "cache": cache.float()},
        "noise": {"embeddings": noisy, "cache": cache},
        "ring": {"embeddings": emb, "cache": ring},
        "ring-code": {"embeddings": emb, "cache": codes},
        "pickle": {"embeddings": emb, "cache": Path("x")},  # weights_only refuses classes
    }
    for name, value in bad.items():
        torch.save(value, voices / f"bad-{name}.pt")
    (voices / "bad-zip.pt").write_bytes(b"PK\x03\x04 truncated")
    eng = Engine(runner(plex), timer=FakeTimer(), max_input_frames=64)
    messages = {
        "keys": "dict of 'embeddings' and 'cache'",
        "extra": "dict of 'embeddings' and 'cache'",
        "list": "dict of 'embeddings' and 'cache'",
        "noise": "do not match",
        "ring": "do not match",
        "ring-code": "do not match",
        "pickle": "not a readable torch file",
        "zip": "not a readable torch file",
        "nan": "not finite",
        "width": "cache must be",
        "cache-dtype": "cache must be",
    }
    for name in [*bad, "zip"]:
        with pytest.raises(PromptUnsupported, match=messages.get(name, "embeddings must be")):
            eng.acquire_slot(name, SlotPrompt(voice=f"bad-{name}"))
        assert eng.statistics().live_slots == 0
    with pytest.raises(PromptUnsupported, match="not a readable torch file"):
        eng.acquire_slot("natf", SlotPrompt(voice="NATF0"))
    handle = eng.acquire_slot("ok", SlotPrompt(voice="robot-pt"))
    assert handle is not None
    got = drive(eng, {"ok": handle}, {"ok": signal("o", 3)})["ok"]
    assert any(p.any() for p, _ in got[-3:])  # live after its replay


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


def test_an_uploaded_voice_prompts_by_name_and_a_new_upload_replaces_it(
    plex: LoadedMoshi, tmp_path: Path
) -> None:
    """A voice from the upload folder (``POST /v1/audio/voices``) prompts like a checkpoint's
    WAV voice; deleted, it is refused; uploaded again under its name with other audio, the
    next session replays the new audio, not the cached codes of the old one."""
    uploaded = tmp_path / "uploaded"
    _write_wav(uploaded / "mine.wav", 0.5, rate=16_000)  # robot.wav's audio, under a new name
    run = MoshiEngineRunner(plex, moshi_spec("tiny-personaplex"), seed=SEED, voice_dir=uploaded)
    eng = Engine(run, timer=FakeTimer(), max_input_frames=64)
    handle = eng.acquire_slot("a", SlotPrompt(voice="mine"))
    assert handle is not None
    eng.step(0.0)
    first = run.replay(handle.slot)
    assert first is not None
    assert torch.equal(run._voice_codes[("mine", run._voices.voice("mine").stamp)],
                       wav_codes(plex, "robot"))  # fmt: skip
    eng.release_slot(handle)
    (uploaded / "mine.wav").unlink()
    with pytest.raises(PromptUnsupported, match="no voice"):
        eng.acquire_slot("b", SlotPrompt(voice="mine"))
    _write_wav(uploaded / "mine.wav", 2.0, noise=True)  # speech.wav's audio now
    again = eng.acquire_slot("c", SlotPrompt(voice="mine"))
    assert again is not None
    eng.step(0.0)
    second = run.replay(again.slot)
    assert second is not None and second.held > first.held  # a longer voice, a longer replay
    for trick in ("../uploaded/mine", "mine.wav/..", ".mine"):
        with pytest.raises(PromptUnsupported):
            eng.acquire_slot("d", SlotPrompt(voice=trick))
    # the checkpoint's own voices come first: an upload cannot shadow one
    _write_wav(uploaded / "robot.wav", 2.0, noise=True)
    shadow = eng.acquire_slot("e", SlotPrompt(voice="robot"))
    assert shadow is not None
    eng.step(0.0)
    replay = run.replay(shadow.slot)
    assert replay is not None and replay.held == first.held


def test_random_weights_take_uploaded_voices_only(tmp_path: Path) -> None:
    from duplex.models.moshi._prompt import VoiceLibrary

    _write_wav(tmp_path / "mine.wav", 0.5)
    library = VoiceLibrary(None, 24_000, uploaded=tmp_path)
    library.check("mine")
    assert library.voice("mine").pcm is not None and library.voice("mine").stamp is not None
    with pytest.raises(PromptUnsupported, match="random weights"):
        library.check("robot")
