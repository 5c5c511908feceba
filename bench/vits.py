"""A VITS / MMS-TTS-sized checkpoint through `VitsRunner`: batched against one request at a time.

    python bench/vits.py --sentences 16 --repeats 3 --out bench/results/vits-cpu2

The checkpoint is transformers' default `VitsConfig` (the architecture of the MMS-TTS
checkpoints: 6 text-encoder layers of 192, a 512-channel HiFi-GAN decoder, 16 kHz), with
seeded random weights, saved with ``save_pretrained`` to a temporary folder and loaded the
way ``--tts PATH`` loads a real one. Random weights predict random durations, so the audio
is not speech, but the work per sentence is a real checkpoint's. Each repeat times the same
``--sentences`` requests (one sentence each) run one at a time and then as one
`run_batch` (their sentences in padded forwards of up to 16); reported: seconds of audio made
per second of compute, both ways, and their ratio (median times over repeats).

Writes ``<out>.json`` (every figure and the exact command).
"""

from __future__ import annotations

import argparse
import json
import string
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _served import commit, machine, write_report  # noqa: E402

from duplex.models.tts import NO_GATE, SpeechRequest, VitsRunner  # noqa: E402

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "near",
    "river",
    "bank",
    "while",
    "birds",
    "sing",
]


def save_checkpoint(folder: Path, seed: int) -> None:
    import torch
    from transformers import VitsConfig, VitsModel, VitsTokenizer

    vocab = ["<pad>", " ", "'", "-", *string.ascii_lowercase]
    (folder / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(vocab)}))
    tokenizer = VitsTokenizer(str(folder / "vocab.json"), phonemize=False)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = VitsConfig(vocab_size=len(vocab), pad_token_id=0)
    VitsModel(config).eval().save_pretrained(folder)


def sentences(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        words = rng.choice(WORDS, size=int(rng.integers(6, 14)))
        out.append(" ".join(words).capitalize() + ".")
    return out


def main(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        save_checkpoint(folder, args.seed)
        runner = VitsRunner(folder, device=args.device, max_batch=args.sentences)
    requests = [SpeechRequest(text) for text in sentences(args.sentences, args.seed)]
    runner.run_batch(requests[:2], NO_GATE)  # warm-up
    alone, batched, audio_one, audio_many = [], [], 0.0, 0.0
    for _ in range(args.repeats):
        start = time.perf_counter()
        outputs = [runner.run_batch([r], NO_GATE)[0] for r in requests]
        alone.append(time.perf_counter() - start)
        start = time.perf_counter()
        together = runner.run_batch(requests, NO_GATE)
        batched.append(time.perf_counter() - start)
        # the sampling noise is drawn per forward, so a batch's durations differ from one at
        # a time (with the noise scales at 0 they are equal: tests/models/tts/test_vits_runner.py)
        audio_one = sum(o.duration_s for o in outputs)  # type: ignore[union-attr]
        audio_many = sum(o.duration_s for o in together)  # type: ignore[union-attr]
    one, many = float(np.median(alone)), float(np.median(batched))
    return {
        "command": "python3 bench/vits.py " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "commit": commit(),
        "device": args.device,
        "torch_threads": args.threads,
        "sentences": args.sentences,
        "audio_s_one_at_a_time": round(audio_one, 2),
        "audio_s_batched": round(audio_many, 2),
        "one_at_a_time_s": round(one, 3),
        "batched_s": round(many, 3),
        "one_at_a_time_audio_s_per_s": round(audio_one / one, 1),
        "batched_audio_s_per_s": round(audio_many / many, 1),
        "speedup": round((audio_many / many) / (audio_one / one), 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="")
    arguments = parser.parse_args()
    result = main(arguments)
    if arguments.out:
        write_report(Path(arguments.out + ".json"), result)
    print(json.dumps(result, indent=2))
