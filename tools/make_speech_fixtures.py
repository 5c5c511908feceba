"""Regenerate the real-speech WAV fixtures in ``tests/fixtures/speech/`` with espeak-ng.

Each sentence is synthesized by the ``espeak-ng`` command (22 050 Hz mono PCM16),
resampled to OpenAI Realtime's ``audio/pcm`` rate (24 kHz) with our own
`StreamingResampler` (its group delay removed), trimmed to the speech plus
``PAD_MS`` of silence at both ends, and written as 24 kHz mono 16-bit WAV.
The tests only read the WAVs: espeak-ng is needed to regenerate them, not to
run the tests. ``meta.json`` records the espeak-ng version, voice, rate and texts.

Recorded with espeak-ng 1.51 (Debian ``espeak-ng 1.51+dfsg-10+deb12u2``), voice
``en-us``, 160 words per minute. Regenerate (from the repository root)::

    apt-get install -y espeak-ng
    .venv/bin/python tools/make_speech_fixtures.py
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import wave
from pathlib import Path

import numpy as np

from duplex.sessions import StreamingResampler

RATE = 24_000
VOICE = "en-us"
WORDS_PER_MINUTE = 160
PAD_MS = 40
SILENCE_DBFS = -45.0
"""A 10 ms frame below this RMS level (dB of full scale) counts as silence when trimming."""
SENTENCES = {
    "hello.wav": "Hello, could you tell me the weather for tomorrow?",
    "interrupt.wav": "Wait, stop, I have another question.",
}
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "speech"


def espeak(text: str) -> tuple[np.ndarray, int]:
    """Synthesize ``text``; returns float32 mono samples and their rate."""
    wav = subprocess.run(
        ["espeak-ng", "-v", VOICE, "-s", str(WORDS_PER_MINUTE), "--stdout", text],
        check=True,
        capture_output=True,
    ).stdout
    with wave.open(io.BytesIO(wav), "rb") as w:
        assert w.getnchannels() == 1 and w.getsampwidth() == 2
        rate = w.getframerate()
        # espeak-ng writes 0x7fffffff as the data size on stdout: read what is there.
        pcm = np.frombuffer(wav[44:], dtype="<i2")
    return pcm.astype(np.float32) / 32768.0, rate


def resample(audio: np.ndarray, rate: int) -> np.ndarray:
    """``audio`` at ``RATE``, aligned (the resampler's group delay removed)."""
    resampler = StreamingResampler(rate, RATE)
    delay = round(resampler.delay_samples)
    tail = np.zeros(delay + 1, dtype=np.float32)
    out = np.concatenate([resampler.process(audio), resampler.process(tail)])
    return out[delay : delay + round(len(audio) * RATE / rate)]


def trim(audio: np.ndarray) -> np.ndarray:
    """Cut silence at both ends down to ``PAD_MS``."""
    frame = RATE // 100
    frames = audio[: len(audio) // frame * frame].reshape(-1, frame)
    level = 20 * np.log10(np.sqrt((frames**2).mean(axis=1)) + 1e-12)
    loud = np.flatnonzero(level > SILENCE_DBFS)
    pad = PAD_MS * RATE // 1000
    start = max(0, loud[0] * frame - pad)
    end = min(len(audio), (loud[-1] + 1) * frame + pad)
    return audio[start:end]


def write(path: Path, audio: np.ndarray) -> None:
    """24 kHz mono PCM16 WAV."""
    pcm = (np.clip(audio, -1.0, 1.0) * 32767).round().astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())


def main() -> None:
    """Write every sentence and ``meta.json`` to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    version = (
        subprocess.run(["espeak-ng", "--version"], check=True, capture_output=True, text=True)
        .stdout.split(":")[1]
        .split()[0]
    )  # "eSpeak NG text-to-speech: 1.51  Data at: ..."
    meta: dict[str, object] = {
        "espeak_ng": version,
        "voice": VOICE,
        "words_per_minute": WORDS_PER_MINUTE,
        "sample_rate": RATE,
        "pad_ms": PAD_MS,
        "files": {},
    }
    for name, text in SENTENCES.items():
        audio, rate = espeak(text)
        speech = trim(resample(audio, rate))
        write(args.out / name, speech)
        meta["files"][name] = {  # type: ignore[index]
            "text": text,
            "espeak_rate": rate,
            "ms": round(len(speech) * 1000 / RATE),
        }
        print(f"{name}: {len(speech) / RATE:.2f} s, {2 * len(speech)} bytes of PCM")
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


if __name__ == "__main__":
    main()
