"""What Mimi loses computing in bf16 instead of float32 (``--codec-dtype bf16``), and its time.

    .venv/bin/python bench/mimi_precision.py [--frames 100] [--seeds 3]
    PYTHONPATH=$PWD python3 bench/mimi_precision.py --device cuda --batch 128

Two copies of Mimi (the served codec's architecture, preset ``mimi``) with the same seeded
random weights, one float32 and one cast to bf16 as the server casts it (`cast_mimi`: the
codebooks and the code distances stay float32), stream the same signal frame by frame
through `MimiStreams`, as a session does:

- **encode**: the share of codes equal to float32's, per codebook (the 8 a Moshi session
  feeds its LM: the semantic one first). The quantizer is residual, so a code that flips
  moves every later codebook of that frame: later codebooks agree less by construction.
- **decode**: the same float32 codes decoded by both; the SNR of bf16's PCM against
  float32's (dB, over the whole signal and the worst frame).
- **round trip**: each encodes then decodes its own codes; the SNR of bf16's result
  against float32's (code flips included).

The signal is speech-like and seeded: a voiced source (a pitch gliding 90-260 Hz with its
harmonics under a formant-like tilt) in syllable envelopes, with pauses and a little noise.
Random weights are not a trained codec: the figures bound the arithmetic's error on this
architecture, not how a listener hears it.

With ``--batch B`` it also times one frame of encode + decode for B slots in each dtype
(on CUDA: `MimiStreams` replays its captured graphs, as served), median of ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch

from duplex.models.moshi import MimiModel, MimiStreams, cast_mimi, mimi_preset, random_mimi

CODEBOOKS = 8
"""Codes a Moshi session's LM reads per frame (the 7B's ``user_q``)."""


def speech_like(frames: int, seed: int, rate: int, frame: int) -> torch.Tensor:
    """``[frames * frame]`` seeded voiced syllables with pauses, peak about 0.5."""
    g = torch.Generator().manual_seed(seed)
    n = frames * frame
    t = torch.arange(n, dtype=torch.float64) / rate
    glide = 90 + 170 * (
        0.5 + 0.5 * torch.sin(2 * math.pi * 0.7 * t + float(torch.rand(1, generator=g)) * 6)
    )
    phase = 2 * math.pi * torch.cumsum(glide, 0) / rate
    voiced = sum(torch.sin(k * phase) / k**1.2 for k in range(1, 24))
    syllable = torch.sin(math.pi * ((t * 4.0) % 1.0)).clamp(min=0) ** 2  # 4 syllables a second
    pauses = (torch.rand(int(n / rate * 4) + 1, generator=g) > 0.25).double()
    gate = pauses[(t * 4.0).long()]
    noise = torch.randn(n, generator=g, dtype=torch.float64) * 0.01
    out = voiced * syllable * gate
    return (0.5 * out / out.abs().max() + noise).float()


def snr_db(want: torch.Tensor, got: torch.Tensor) -> float:
    """Signal over difference, in dB (inf when equal)."""
    noise = float((got.double() - want.double()).square().sum())
    signal = float(want.double().square().sum())
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


def stream(model: MimiModel, pcm: torch.Tensor, frame: int, codes: torch.Tensor | None = None):
    """Codes ``[T, K]`` of ``pcm`` and the PCM ``[T, frame]`` of ``codes`` (own if ``None``)."""
    streams = MimiStreams(model, max_slots=1, num_codebooks=CODEBOOKS, cuda_graphs=False)
    streams.reset_slot(0)
    frames = pcm.shape[0] // frame
    device = next(model.parameters()).device
    encoded = torch.cat(
        [
            streams.encode([0], pcm[None, i * frame : (i + 1) * frame].to(device))
            for i in range(frames)
        ]
    )
    feed = encoded if codes is None else codes.to(device)
    decoded = torch.stack([streams.decode([0], feed[i : i + 1])[0].float() for i in range(frames)])
    return encoded.cpu(), decoded.cpu()


def quality(frames: int, seed: int, device: torch.device) -> dict[str, object]:
    config = mimi_preset("mimi")
    full = random_mimi(config, seed).to(device)
    half = cast_mimi(random_mimi(config, seed).to(device), torch.bfloat16)
    frame = config.frame_size
    pcm = speech_like(frames, 100 + seed, config.sample_rate, frame)
    want_codes, want_pcm = stream(full, pcm, frame)
    got_codes, got_pcm = stream(half, pcm, frame, codes=want_codes)
    _, own_pcm = stream(half, pcm, frame)
    per_frame = [
        snr_db(want_pcm[i], got_pcm[i]) for i in range(frames) if want_pcm[i].abs().max() > 1e-3
    ]
    return {
        "seed": seed,
        "frames": frames,
        "code_agreement": [
            float((got_codes[:, k] == want_codes[:, k]).float().mean()) for k in range(CODEBOOKS)
        ],
        "frames_all_codes_equal": float((got_codes == want_codes).all(dim=1).float().mean()),
        "decode_snr_db": snr_db(want_pcm, got_pcm),
        "decode_snr_db_worst_frame": min(per_frame),
        "round_trip_snr_db": snr_db(want_pcm, own_pcm),
    }


def timing(batch: int, repeats: int, device: torch.device) -> dict[str, float]:
    config = mimi_preset("mimi")
    out: dict[str, float] = {}
    for name, dtype in (("float32", torch.float32), ("bf16", torch.bfloat16)):
        model = random_mimi(config, 0).to(device)
        if dtype != torch.float32:
            cast_mimi(model, dtype)
        streams = MimiStreams(model, max_slots=batch, num_codebooks=CODEBOOKS)
        slots = list(range(batch))
        for s in slots:
            streams.reset_slot(s)
        pcm = torch.randn(batch, config.frame_size, device=device) * 0.1
        codes = torch.randint(0, config.bins, (batch, CODEBOOKS), device=device)
        spans = []
        for i in range(repeats + 3):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            streams.encode(slots, pcm)
            streams.decode(slots, codes, check_values=False)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= 3:  # the first frames capture or warm up
                spans.append(time.perf_counter() - start)
        out[f"{name}_encode_decode_ms"] = 1000 * statistics.median(spans)
        del streams, model
    out["bf16_over_float32"] = out["bf16_encode_decode_ms"] / out["float32_encode_decode_ms"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=0, help="also time B slots a frame")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("out/mimi_precision.json"))
    args = parser.parse_args()
    device = torch.device(args.device)
    result: dict[str, object] = {"device": args.device, "quality": []}
    with torch.no_grad():
        for seed in range(args.seeds):
            row = quality(args.frames, seed, device)
            print(json.dumps(row), flush=True)
            result["quality"].append(row)  # type: ignore[union-attr]
        if args.batch:
            result["timing"] = {"batch": args.batch, **timing(args.batch, args.repeats, device)}
            print(json.dumps(result["timing"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
