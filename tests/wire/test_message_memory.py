"""Memory one 16 MiB ``input_audio_buffer.append`` costs, as a multiple of its size.

`tracemalloc` sees numpy's buffers, so the peak above what was live before a stage
counts every copy the stage makes. The bounds are the documented figures
(docs/protocol/duplex.md, "Limits and defaults"; ``bench/message_memory.py`` prints
them) with a little room; before they were set a PCM16 parse peaked at 3.6x the
message (``/v1/duplex``) and 4.4x (``/v1/realtime``), a G.711 one at 7.8x, and the
16 kHz resampling for the silero VAD at 36x. The cheaper decoders give the same bytes,
samples and refusals as the ones they replaced.
"""

from __future__ import annotations

import base64
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

from duplex.codecs._g711 import alaw_decode, alaw_to_float, ulaw_decode, ulaw_to_float
from duplex.exceptions import BadAudio
from duplex.pcm import pcm16_to_float
from duplex.sessions import AudioAppend, StreamingResampler
from duplex.wire._json_text import b64_decode
from duplex.wire._native import parse_client_event
from duplex.wire._realtime import RealtimeProjection, WireFormats

MIB = 1024 * 1024


HEAD, TAIL = '{"type":"input_audio_buffer.append","audio":"', '"}'


def _message(width: int) -> str:
    """An append just under 16 MiB of JSON text, of ``width``-byte samples."""
    size = (16 * MIB - len(HEAD) - len(TAIL)) // 4 * 3 // width * width
    audio = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()
    return HEAD + base64.b64encode(audio).decode("ascii") + TAIL


def _peak(stage: Callable[[], object]) -> tuple[int, object]:
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = stage()
        return tracemalloc.get_traced_memory()[1] - base, result
    finally:
        tracemalloc.stop()


ULAW = WireFormats("g711_ulaw", "g711_ulaw")


@pytest.mark.parametrize(
    ("endpoint", "width", "bound"),
    [
        ("duplex", 2, 2.5),
        ("realtime", 2, 2.5),
        ("realtime g711", 1, 4.0),
    ],
)
def test_parsing_a_16_mib_append_peaks_under_its_bound(
    endpoint: str, width: int, bound: float
) -> None:
    """The bound is the samples (float32: 1.5x the message for PCM16, 3x for G.711) plus
    the decoded bytes; the base64 text is freed before the samples are made."""
    text = _message(width)
    parse = {
        "duplex": parse_client_event,
        "realtime": RealtimeProjection().parse,
        "realtime g711": RealtimeProjection(formats=ULAW).parse,
    }[endpoint]
    peak, event = _peak(lambda: parse(text))
    assert isinstance(event, AudioAppend)
    samples = (len(text) - len(HEAD) - len(TAIL)) // 4 * 3 // width
    assert event.pcm.size == samples  # the audio is all there
    assert peak <= bound * len(text), f"{peak / len(text):.2f}x the message"


def test_resampling_a_16_mib_append_for_the_vad_costs_its_output() -> None:
    """24 kHz to 16 kHz (the silero VAD's rate) of a 16 MiB append's samples: the output
    and scratch of a piece, not a (samples, taps) products array."""
    pcm = np.random.default_rng(1).uniform(-0.5, 0.5, 6 * MIB).astype(np.float32)
    resampler = StreamingResampler(24_000, 16_000)
    peak, out = _peak(lambda: resampler.process(pcm))
    assert isinstance(out, np.ndarray) and out.size == 4 * MIB
    assert peak <= out.nbytes + 4 * MIB, f"{peak / MIB:.1f} MiB for {out.nbytes / MIB:.0f} MiB"


def test_resampling_in_pieces_gives_the_same_samples() -> None:
    """`StreamingResampler.process` splits a large chunk; the bits do not change."""
    pcm = np.random.default_rng(2).uniform(-0.5, 0.5, 50_000).astype(np.float32)
    for rates in ((24_000, 16_000), (8_000, 24_000), (48_000, 24_000), (16_000, 24_000)):
        whole = StreamingResampler(*rates).process(pcm)
        small = StreamingResampler(*rates)
        pieces = np.concatenate([small.process(pcm[i : i + 1000]) for i in range(0, 50_000, 1000)])
        assert np.array_equal(whole, pieces), rates


@pytest.mark.parametrize(
    "text",
    ["", "AAAA", "AAA=", "AA==", "A===", "=", "==", "AAAA====", "AA=A", "AA==AA==", "AAAA\n",
     " AAAA", "AAA", "AAAAA", "AB-_", "é", "\ud800", "AAAAAA==", "////", "+/+/"],
)  # fmt: skip
def test_decoding_base64_in_place_is_b64decode_with_validate(text: str) -> None:
    """`b64_decode` reads the str without copying it, and agrees with what it replaced."""
    try:
        expected: bytes | None = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):  # binascii.Error is a ValueError
        expected = None
    try:
        got: bytes | None = b64_decode(text, "audio", BadAudio)
    except BadAudio as exc:
        assert exc.param == "audio"
        got = None
    assert got == expected


def test_g711_decodes_straight_to_the_same_floats() -> None:
    codes = bytes(range(256)) * 300  # more than one lookup block
    assert np.array_equal(ulaw_to_float(codes), pcm16_to_float(ulaw_decode(codes)))
    assert np.array_equal(alaw_to_float(codes), pcm16_to_float(alaw_decode(codes)))
    assert ulaw_to_float(b"").size == 0
