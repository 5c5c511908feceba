"""The Mimi codec and its per-slot streams on the tiny preset (CPU, seeded random weights).

Oracles:

- The reference itself, through a committed fixture (``tools/mimi_parity.py``):
  Kyutai's ``MimiModel`` (``moshi==0.2.13``) streamed 12 frames (past the tiny
  16-step KV ring) with weights our loader reads. Codes must be equal; PCM must
  be within ``PCM_ATOL`` = 1e-5 absolute (measured: 3e-7 on float32 samples of
  peak ~0.97; the two differ only in float op order).
- Our own whole-signal pass (`MimiModel.encode` / `decode`): every conv is
  causal with zero (or first-sample) history, so frame-by-frame streaming
  equals the whole-signal pass exactly as long as the transformers' attention
  window is not full (``context / 2`` frames).
- `MimiTransformer.forward` with ``chunk=2``: the plain full-sequence mask of
  the reference's streaming ring (a frame writes both of its latent steps
  before either attends, so its first step loses the key ``context`` steps
  back). Streaming must equal it at every length; ``chunk=None`` (the
  reference's offline window) must differ once the ring wraps.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from duplex.exceptions import ConfigError
from duplex.kernels import triton_available
from duplex.models.moshi import (
    MimiModel,
    MimiStreams,
    cast_mimi,
    expected_mimi_tensors,
    load_mimi,
    mimi_preset,
    moshi_preset,
    random_mimi,
    save_random_mimi,
)
from duplex.models.moshi._mimi import KVRingView

TINY = mimi_preset("tiny")
FRAME = TINY.frame_size
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "mimi_tiny"
ATTENTION = [
    False,
    pytest.param(True, marks=pytest.mark.skipif(not triton_available(), reason="no triton")),
]
"""The transformers' streaming attention: gathered for SDPA, or the ring kernel in place."""
PCM_ATOL = 1e-5
"""Streamed PCM vs the reference (absolute; measured 3e-7 on a peak of ~0.97)."""


@pytest.fixture(scope="module")
def tiny() -> MimiModel:
    return random_mimi(TINY, seed=3)


def signal(frames: int, seed: int) -> torch.Tensor:
    """``[frames * FRAME]`` noisy sine (unit-order amplitude)."""
    generator = torch.Generator().manual_seed(seed)
    t = torch.arange(frames * FRAME) / TINY.sample_rate
    tone = 0.5 * torch.sin(2 * torch.pi * (200 + 50 * seed) * t)
    return tone + 0.1 * torch.randn(frames * FRAME, generator=generator)


def random_codes(frames: int, seed: int, count: int = TINY.num_codebooks) -> torch.Tensor:
    """``[frames, count]`` codes."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY.bins, (frames, count), generator=generator)


def stream_alone(
    model: MimiModel, pcm: torch.Tensor, codes: torch.Tensor, slot: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A session's codes ``[T, K]`` and decoded PCM ``[T * FRAME]`` with a pool to itself."""
    streams = MimiStreams(model, max_slots=slot + 1)
    streams.reset_slot(slot)
    frames = len(codes)
    encoded = [
        streams.encode([slot], pcm[None, n * FRAME : (n + 1) * FRAME]) for n in range(frames)
    ]
    decoded = [streams.decode([slot], codes[n : n + 1])[0] for n in range(frames)]
    return torch.cat(encoded), torch.cat(decoded)


# --- configuration and names -------------------------------------------------------------


def test_presets_match_the_reference_shapes() -> None:
    mimi = mimi_preset("mimi")
    assert (mimi.frame_size, mimi.hop_length, mimi.latent_steps) == (1920, 960, 2)
    assert (TINY.frame_size, TINY.bins, TINY.n_q) == (1920, 32, 8)
    assert TINY.bins == moshi_preset("tiny").card
    names = expected_mimi_tensors(mimi)
    assert len(names) == 318
    assert names["encoder.model.0.conv.conv.weight"] == (64, 1, 7)
    assert names["encoder.model.1.block.1.conv.conv.weight"] == (32, 64, 3)
    assert names["encoder.model.12.conv.conv.weight"] == (1024, 512, 16)
    assert names["encoder.model.14.conv.conv.weight"] == (512, 1024, 3)
    assert names["decoder.model.2.convtr.convtr.weight"] == (1024, 512, 16)
    assert names["decoder.model.14.conv.conv.bias"] == (1,)
    layer = "encoder_transformer.transformer.layers.7."
    assert names[layer + "self_attn.in_proj_weight"] == (1536, 512)
    assert names[layer + "self_attn.out_proj.weight"] == (512, 512)
    assert names[layer + "linear1.weight"] == (2048, 512)
    assert names[layer + "norm2.bias"] == (512,)
    assert names[layer + "layer_scale_2.scale"] == (512,)
    assert "decoder_transformer.transformer.layers.7.linear2.weight" in names
    assert names["quantizer.rvq_first.input_proj.weight"] == (256, 512, 1)
    assert names["quantizer.rvq_rest.output_proj.weight"] == (512, 256, 1)
    codebook = "quantizer.rvq_rest.vq.layers.30._codebook."
    assert names[codebook + "embedding_sum"] == (2048, 256)
    assert names[codebook + "cluster_usage"] == (2048,)
    assert names[codebook + "_initialized"] == (1,)
    assert "quantizer.rvq_rest.vq.layers.31._codebook.embedding_sum" not in names
    assert names["downsample.conv.conv.conv.weight"] == (512, 512, 4)
    assert names["upsample.convtr.convtr.convtr.weight"] == (512, 1, 4)
    params = sum(int(np.prod(s)) for n, s in names.items() if "._codebook." not in n)
    assert 79_000_000 < params < 80_000_000  # 79.3 M, as the reference reports


@pytest.mark.parametrize(
    "change",
    [
        {"n_filters": 0},
        {"ratios": (7, 6, 5, 4)},  # 1920 is not a multiple of 840
        {"frame_rate": 25.0},  # no downsampling left
        {"transformer_heads": 3},
        {"num_codebooks": 9},
        {"n_q": 1, "num_codebooks": 1},
        {"frame_rate": 7.0},
    ],
)
def test_invalid_configs_are_refused(change: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        replace(TINY, **change)  # type: ignore[arg-type]


def test_unknown_preset() -> None:
    with pytest.raises(ConfigError, match="tiny"):
        mimi_preset("mimi-2")


# --- weights -----------------------------------------------------------------------------


def test_save_load_round_trip(tmp_path: Path, tiny: MimiModel) -> None:
    path = tmp_path / "mimi.safetensors"
    save_random_mimi(path, TINY, seed=3)
    assert {k: tuple(v.shape) for k, v in load_file(str(path)).items()} == expected_mimi_tensors(
        TINY
    )
    loaded = load_mimi(path, TINY)
    for name, tensor in tiny.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    pcm = signal(3, seed=1)
    assert torch.equal(loaded.encode(pcm[None]), tiny.encode(pcm[None]))


def test_loader_refuses_missing_unknown_and_misshapen(tmp_path: Path) -> None:
    path = tmp_path / "mimi.safetensors"
    save_random_mimi(path, TINY, seed=1)
    tensors = load_file(str(path))
    gone = "quantizer.rvq_rest.vq.layers.2._codebook.embedding_sum"
    bent = "decoder_transformer.transformer.layers.1.self_attn.in_proj_weight"
    cases = {
        "missing": (lambda t: t.pop(gone), gone),
        "unknown": (lambda t: t.__setitem__("extra.weight", torch.zeros(2)), "extra.weight"),
        "wrong shape": (lambda t: t.__setitem__(bent, torch.zeros(3, 3)), bent),
    }
    for label, (edit, name) in cases.items():
        broken = dict(tensors)
        edit(broken)
        save_file(broken, str(tmp_path / "broken.safetensors"))
        with pytest.raises(ConfigError, match=label) as caught:
            load_mimi(tmp_path / "broken.safetensors", TINY)
        assert name in str(caught.value)
    two = {k: v for k, v in tensors.items() if not k.startswith("upsample.")}
    two["downsample.conv.conv.conv.weight"] = torch.zeros(1)
    save_file(two, str(tmp_path / "two.safetensors"))
    with pytest.raises(ConfigError, match=r"missing.*wrong shape"):
        load_mimi(tmp_path / "two.safetensors", TINY)
    save_file(dict(tensors, extra=torch.zeros(2)), str(tmp_path / "extra.safetensors"))
    load_mimi(tmp_path / "extra.safetensors", TINY, strict=False)
    with pytest.raises(ConfigError, match="wrong shape"):
        load_mimi(path, mimi_preset("mimi"))


def test_random_weights_are_seeded() -> None:
    first, again, other = random_mimi(TINY, 5), random_mimi(TINY, 5), random_mimi(TINY, 6)
    for name, tensor in first.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name
    key = "encoder.model.0.conv.conv.weight"
    assert not torch.equal(first.state_dict()[key], other.state_dict()[key])


# --- the reference, through the committed fixture ------------------------------------------


def test_reference_parity_fixture() -> None:
    trace = np.load(FIXTURE / "trace.npz")
    meta = json.loads((FIXTURE / "meta.json").read_text())
    assert meta["preset"] == TINY.name and meta["num_codebooks"] == TINY.num_codebooks
    model = load_mimi(FIXTURE / "mimi.safetensors", TINY)
    pcm = torch.from_numpy(trace["pcm"])
    want_codes = torch.from_numpy(trace["codes_stream"])
    frames = len(want_codes)
    assert frames * 2 > TINY.context  # the fixture wraps the KV rings
    # Our session in slot 2, sharing every step with a busy slot 0 (other audio, other codes).
    streams = MimiStreams(model, max_slots=3)
    noise, other = signal(frames, seed=9), random_codes(frames, seed=9)
    codes, out = [], []
    for n in range(frames):
        window = slice(n * FRAME, (n + 1) * FRAME)
        batch = torch.stack([noise[window], pcm[window]])
        codes.append(streams.encode([0, 2], batch)[1])
        out.append(streams.decode([2, 0], torch.stack([want_codes[n], other[n]]))[0])
    assert torch.equal(torch.stack(codes), want_codes)
    streamed = torch.cat(out).numpy()
    assert np.abs(streamed - trace["pcm_stream"]).max() <= PCM_ATOL
    # Whole-signal passes follow the reference's non-streaming semantics.
    assert torch.equal(model.encode(pcm[None])[0].T, torch.from_numpy(trace["codes_offline"]))
    offline = model.decode(want_codes.T[None])[0].numpy()
    assert np.abs(offline - trace["pcm_offline"]).max() <= PCM_ATOL


# --- streaming vs the whole-signal pass ------------------------------------------------------


def test_streaming_equals_the_whole_signal_pass_while_the_window_is_open(
    tiny: MimiModel,
) -> None:
    frames = TINY.context // TINY.latent_steps  # 8: the rings fill on the last frame
    pcm, codes = signal(frames, seed=2), random_codes(frames, seed=2)
    encoded, decoded = stream_alone(tiny, pcm, codes)
    assert torch.equal(encoded, tiny.encode(pcm[None])[0].T)
    torch.testing.assert_close(decoded, tiny.decode(codes.T[None])[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("kernel", ATTENTION, ids=["gathered", "ring-kernel"])
def test_transformer_streaming_equals_the_streaming_window_mask(
    tiny: MimiModel, kernel: bool
) -> None:
    """The ring's streaming, gathered (SDPA) or read in place by the ring kernel (Triton's
    interpreter here), is the chunked window of the whole-sequence pass, wrapping included."""
    transformer = tiny.encoder_transformer.transformer
    steps = 3 * TINY.context + 4  # wraps the ring three times
    x = torch.randn(2, steps, TINY.dimension, generator=torch.Generator().manual_seed(4))
    ring = (TINY.transformer_layers, 3, TINY.transformer_heads, TINY.context, TINY.head_dim)
    keys = torch.full(ring, float("nan"))  # rows a slot never wrote must never be read
    values = torch.full(ring, float("inf"))
    chunks = []
    for start in range(0, steps, 2):
        offsets = torch.tensor([start, start])
        view = KVRingView(keys, values, torch.tensor([2, 0]), offsets, kernel)
        with torch.no_grad():
            chunks.append(transformer.step(x[:, start : start + 2], view))
    streamed = torch.cat(chunks, dim=1)
    with torch.no_grad():
        windowed = transformer(x, chunk=2)
        plain = transformer(x)
    torch.testing.assert_close(streamed, windowed, rtol=0, atol=1e-5)
    torch.testing.assert_close(plain[:, : TINY.context], windowed[:, : TINY.context])
    assert not torch.allclose(plain[:, TINY.context :], windowed[:, TINY.context :])


def test_the_ring_kernel_streams_two_steps_a_call_and_refuses_three(tiny: MimiModel) -> None:
    """One row a query is left out: three steps a call would need two (the gathered path
    takes any count); two, what Mimi streams a frame, run."""
    transformer = tiny.encoder_transformer.transformer
    ring = (TINY.transformer_layers, 1, TINY.transformer_heads, TINY.context, TINY.head_dim)
    keys, values = torch.zeros(ring), torch.zeros(ring)
    x = torch.randn(1, 3, TINY.dimension, generator=torch.Generator().manual_seed(6))
    slots, start = torch.tensor([0]), torch.tensor([0])
    with torch.no_grad():
        with pytest.raises(ValueError, match="at most 2 steps"):
            transformer.step(x, KVRingView(keys, values, slots, start, kernel=True))
        assert transformer.step(x, KVRingView(keys, values, slots, start)).shape == x.shape
        if triton_available():
            view = KVRingView(keys, values, slots, start, kernel=True)
            assert transformer.step(x[:, :2], view).shape == (1, 2, TINY.dimension)


def test_the_rings_are_gathered_off_cuda_unless_the_kernel_is_asked_for(tiny: MimiModel) -> None:
    """The ring kernel is the default on CUDA for 16-bit rings only; here, on the host,
    the rings are gathered unless a caller asks for the kernel."""
    assert not MimiStreams(tiny, max_slots=1).ring_kernel
    assert not MimiStreams(tiny, max_slots=1, kv_dtype=torch.bfloat16).ring_kernel
    assert MimiStreams(tiny, max_slots=1, ring_kernel=True).ring_kernel


# --- slots ---------------------------------------------------------------------------------


@pytest.mark.parametrize("ring_kernel", ATTENTION, ids=["gathered", "ring-kernel"])
def test_slots_join_and_reset_at_any_frame_without_changing_anyones_output(
    tiny: MimiModel, ring_kernel: bool
) -> None:
    # (slot, first tick, frames): D reuses A's slot, whose rings still hold A's keys.
    sessions = {"A": (0, 0, 6), "B": (1, 1, 10), "C": (2, 3, 4), "D": (0, 7, 5)}
    pcm = {name: signal(s[2], seed=ord(name)) for name, s in sessions.items()}
    codes = {name: random_codes(s[2], seed=ord(name)) for name, s in sessions.items()}
    streams = MimiStreams(tiny, max_slots=3, ring_kernel=ring_kernel)
    got: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {n: ([], []) for n in sessions}
    for tick in range(12):
        live = []
        for name, (slot, start, frames) in sessions.items():
            if tick == start:
                streams.reset_slot(slot)
            if start <= tick < start + frames:
                live.append(name)
        live.reverse()  # rows need not follow slot order
        if not live:
            continue
        slots = [sessions[n][0] for n in live]
        rows = [(n, tick - sessions[n][1]) for n in live]
        batch = torch.stack([pcm[n][f * FRAME : (f + 1) * FRAME] for n, f in rows])
        encoded = streams.encode(slots, batch)
        frame_codes = torch.stack([codes[n][f] for n, f in rows])
        decoded = streams.decode(torch.tensor(slots), frame_codes)
        for row, name in enumerate(live):
            got[name][0].append(encoded[row])
            got[name][1].append(decoded[row])
    assert streams.frames(1) == (10, 10)
    for name, (slot, _start, _frames) in sessions.items():
        alone_codes, alone_pcm = stream_alone(tiny, pcm[name], codes[name], slot=slot)
        assert torch.equal(torch.stack(got[name][0]), alone_codes), name
        # Float rounding moves with the batch make-up (~1e-6); codes must not move at all.
        torch.testing.assert_close(torch.cat(got[name][1]), alone_pcm, rtol=0, atol=1e-5)


def test_reset_slot_restarts_only_that_slot(tiny: MimiModel) -> None:
    pcm, codes = signal(4, seed=13), random_codes(4, seed=13)
    streams = MimiStreams(tiny, max_slots=2)
    for n in range(3):
        frame = pcm[n * FRAME : (n + 1) * FRAME]
        streams.encode([0, 1], torch.stack([frame, frame]))
        streams.decode([1, 0], torch.stack([codes[n], codes[n]]))
    streams.reset_slot(0)
    assert (streams.frames(0), streams.frames(1)) == ((0, 0), (3, 3))
    again = [streams.encode([0], pcm[None, n * FRAME : (n + 1) * FRAME]) for n in range(4)]
    audio = [streams.decode([0], codes[n : n + 1])[0] for n in range(4)]
    alone_codes, alone_pcm = stream_alone(tiny, pcm, codes)
    assert torch.equal(torch.cat(again), alone_codes)
    torch.testing.assert_close(torch.cat(audio), alone_pcm, rtol=0, atol=1e-5)


# --- shapes, dtypes, errors ------------------------------------------------------------------


def test_a_bf16_codec_keeps_float32_codebooks_and_stays_near_float32(tiny: MimiModel) -> None:
    """``codec_dtype = "bf16"``: convolutions and transformers in bf16, the codebooks (and so
    the code distances) in float32. Its streamed codes mostly agree with float32's and its
    PCM, from the same codes, is 30 dB above the difference (measured on this seed: every code
    equal, 40.7 dB)."""
    half = cast_mimi(random_mimi(TINY, seed=3), torch.bfloat16)
    codebooks = {b.dtype for n, b in half.named_buffers() if "._codebook." in n}
    assert codebooks == {torch.float32}
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    frames = 24  # past the 16-step ring: the wrapped window too
    pcm, codes = signal(frames, seed=4), random_codes(frames, seed=5)
    want_codes, want_pcm = stream_alone(tiny, pcm, codes)
    got_codes, got_pcm = stream_alone(half, pcm, codes)
    assert got_codes.dtype == torch.long and got_pcm.dtype == torch.bfloat16
    agreement = float((got_codes == want_codes).float().mean())
    noise = float((got_pcm.float() - want_pcm).square().sum())
    snr_db = 10 * np.log10(float(want_pcm.square().sum()) / noise)
    assert agreement >= 0.9 and snr_db >= 30, (agreement, snr_db)
    assert not torch.equal(got_pcm.float(), want_pcm)  # it did run in bf16


def test_shapes_dtypes_and_codebook_count(tiny: MimiModel) -> None:
    streams = MimiStreams(tiny, max_slots=4)
    assert (streams.num_codebooks, streams.frame_size, streams.max_slots) == (8, 1920, 4)
    codes = streams.encode([3, 1], torch.zeros(2, FRAME, dtype=torch.float64))
    assert codes.shape == (2, 8) and codes.dtype == torch.long
    assert int(codes.min()) >= 0 and int(codes.max()) < TINY.bins
    pcm = streams.decode([1, 3], codes)
    assert pcm.shape == (2, FRAME) and pcm.dtype == torch.float32
    assert torch.isfinite(pcm).all()
    assert streams.decode([0], codes[:1, :1]).shape == (1, FRAME)  # semantic codebook alone
    assert streams.decode([2], random_codes(1, seed=1, count=TINY.n_q)).shape == (1, FRAME)
    four = MimiStreams(tiny, max_slots=1, num_codebooks=4)
    assert four.encode([0], torch.zeros(1, FRAME)).shape == (1, 4)
    whole = tiny.encode(signal(3, seed=1)[None, : 2 * FRAME + 5], num_codebooks=2)
    assert whole.shape == (1, 2, 3)  # a partial frame is zero-padded
    assert tiny.decode(whole).shape == (1, 3 * FRAME)


def test_streams_refuse_bad_input(tiny: MimiModel) -> None:
    streams = MimiStreams(tiny, max_slots=2)
    frame = torch.zeros(1, FRAME)
    with pytest.raises(ValueError, match="distinct"):
        streams.encode([0, 0], torch.zeros(2, FRAME))
    with pytest.raises(ValueError, match="outside"):
        streams.encode([2], frame)
    with pytest.raises(ValueError, match="pcm must have shape"):
        streams.encode([0], torch.zeros(1, FRAME - 1))
    with pytest.raises(ValueError, match=r"\[0, 32\)"):
        streams.decode([0], torch.full((1, 8), -2))  # the LM's "not generated yet"
    with pytest.raises(ValueError, match="codes must have shape"):
        streams.decode([0], torch.zeros(1, TINY.n_q + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="num_codebooks"):
        MimiStreams(tiny, max_slots=1, num_codebooks=9)
    assert streams.frames(0) == (0, 0)
