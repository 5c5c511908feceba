"""CPU cost of Ogg/Opus per 80 ms model frame, each way: duplex against sphn, in one run.

    .venv/bin/python bench/ogg_opus.py [--frames 250] [--repeats 5]

Encode: one 1,920-sample float32 frame (24 kHz) in, Ogg pages out (two 40 ms Opus packets,
one page each) through `OggOpusEncoder.encode` and ``sphn.OpusStreamWriter.append_pcm``.
Decode: the same bytes (sphn's, one message per frame) through `OggOpusDecoder.feed` and
``sphn.OpusStreamReader.append_bytes``. The Ogg rows time our pure-Python paging alone
(`OggWriter.write` of two packets, `OggReader.feed` of their two pages). Each repeat runs
every variant over the same frames, interleaved; the table shows the median over repeats of
the mean time per frame, and the ratio duplex / sphn. libopus does the codec work on both
sides (opuslib over the system libopus; sphn links its own build).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import sphn

from duplex.codecs._ogg import AudioPacket, OggReader, OggWriter, OpusHead
from duplex.codecs._opus import OggOpusDecoder, OggOpusEncoder

FRAME = 1920


def signal(frames: int) -> np.ndarray:
    t = np.arange(frames * FRAME) / 24_000
    rng = np.random.default_rng(0)
    x = 0.3 * np.sin(2 * np.pi * (220 + 60 * np.sin(2 * np.pi * 0.5 * t)) * t)
    return (x + 0.02 * rng.standard_normal(len(t))).astype(np.float32).reshape(frames, FRAME)


def per_frame(run: Callable[[], None], frames: int) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) / frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=250)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    pcm = signal(args.frames)
    writer = sphn.OpusStreamWriter(24000)
    messages = [writer.append_pcm(frame) for frame in pcm]
    head_reader = OggReader()
    packets = [
        [e.data for e in head_reader.feed(m) if isinstance(e, AudioPacket)] for m in messages
    ]
    head = OpusHead(pre_skip=3840, input_sample_rate=48_000)

    def ours_encode() -> None:
        encoder = OggOpusEncoder(serial=1)
        for frame in pcm:
            encoder.encode(frame)

    def sphn_encode() -> None:
        w = sphn.OpusStreamWriter(24000)
        for frame in pcm:
            w.append_pcm(frame)

    def ours_decode() -> None:
        decoder = OggOpusDecoder(trim_pre_skip=False)
        for message in messages:
            decoder.feed(message)

    def sphn_decode() -> None:
        reader = sphn.OpusStreamReader(24000)
        for message in messages:
            reader.append_bytes(message)

    def ogg_write() -> None:
        w = OggWriter(serial=1, head=head)
        w.headers()
        for pair in packets:
            for packet in pair:
                w.write(packet, 1920)

    def ogg_read() -> None:
        reader = OggReader()
        for message in messages:
            reader.feed(message)

    variants = {
        "ours_encode": ours_encode,
        "sphn_encode": sphn_encode,
        "ours_decode": ours_decode,
        "sphn_decode": sphn_decode,
        "ogg_write": ogg_write,
        "ogg_read": ogg_read,
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    ours_encode()  # warm-up
    for _ in range(args.repeats):
        for name, run in variants.items():
            times[name].append(per_frame(run, args.frames))
    med = {name: statistics.median(values) * 1e6 for name, values in times.items()}
    size = sum(map(len, messages[1:])) / (args.frames - 1)
    print(f"{args.frames} frames of 80 ms x {args.repeats} repeats; sphn {size:.0f} B/frame")
    print(f"{'per 80 ms frame':<28} {'duplex':>10} {'sphn':>10} {'ratio':>7}")
    for label, ours, theirs in (
        ("encode + page (us)", "ours_encode", "sphn_encode"),
        ("unpage + decode (us)", "ours_decode", "sphn_decode"),
    ):
        ratio = med[ours] / med[theirs]
        print(f"{label:<28} {med[ours]:>10.1f} {med[theirs]:>10.1f} {ratio:>7.2f}")
    print(f"{'Ogg paging only, write (us)':<28} {med['ogg_write']:>10.1f}")
    print(f"{'Ogg paging only, read (us)':<28} {med['ogg_read']:>10.1f}")


if __name__ == "__main__":
    main()
