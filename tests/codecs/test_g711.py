"""G.711 mu-law / A-law: ITU-T reference values, audioop as an oracle, round-trip bounds."""

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex.codecs._g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from duplex.pcm import float_to_pcm16, pcm16_to_float

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        import audioop
    except ImportError:  # Python 3.13 removed it; the reference values below still run
        audioop = None

ALL_PCM = np.arange(-32768, 32768, dtype=np.int16)
ALL_CODES = bytes(range(256))


def test_ulaw_reference_values():
    # G.711 Table 2a: the code words at the ends of the range and the two zeros.
    assert ulaw_decode(bytes([0x00, 0x7F, 0x80, 0xFF])).tolist() == [-32124, 0, 32124, 0]
    # -1 lands one step below -0 (0x7E): the bias makes the first step 2 units wide.
    assert ulaw_encode(np.array([0, -1, 32767, -32768, 32124], dtype=np.int16)) == bytes(
        [0xFF, 0x7E, 0x80, 0x00, 0x80]
    )
    # Segment boundaries: each segment's first code word after inversion (0x8F, 0x9F, ...).
    mags = [int(ulaw_decode(bytes([0xFF - (seg << 4)]))[0]) for seg in range(8)]
    assert mags == [0, 132, 396, 924, 1980, 4092, 8316, 16764]  # (33 << seg+3) - 132


def test_alaw_reference_values():
    # Even-bit inversion: 0xD5 / 0x55 are the smallest positive / negative steps (+-8).
    assert alaw_decode(bytes([0xD5, 0x55, 0xAA, 0x2A])).tolist() == [8, -8, 32256, -32256]
    assert alaw_encode(np.array([0, -1, 32767, -32768], dtype=np.int16)) == bytes(
        [0xD5, 0x55, 0xAA, 0x2A]
    )
    # Segment boundaries: the first code of segments 1..7 decodes to 264, 528, ..., 16896.
    firsts = [alaw_decode(bytes([((seg << 4) | 0x80) ^ 0x55]))[0] for seg in range(1, 8)]
    assert firsts == [264, 528, 1056, 2112, 4224, 8448, 16896]


@pytest.mark.skipif(audioop is None, reason="audioop is gone in Python 3.13")
def test_matches_audioop_on_every_input():
    pcm = ALL_PCM.tobytes()
    assert ulaw_encode(ALL_PCM) == audioop.lin2ulaw(pcm, 2)
    assert alaw_encode(ALL_PCM) == audioop.lin2alaw(pcm, 2)
    assert ulaw_decode(ALL_CODES).astype("<i2").tobytes() == audioop.ulaw2lin(ALL_CODES, 2)
    assert alaw_decode(ALL_CODES).astype("<i2").tobytes() == audioop.alaw2lin(ALL_CODES, 2)


@pytest.mark.parametrize(
    ("encode", "decode", "max_ratio", "small_err"),
    [(ulaw_encode, ulaw_decode, 0.0351, 35), (alaw_encode, alaw_decode, 1 / 32, 32)],
)
def test_round_trip_error_is_bounded(encode, decode, max_ratio, small_err):
    x = ALL_PCM.astype(np.int64)
    err = np.abs(decode(encode(ALL_PCM)).astype(np.int64) - x)
    big = np.abs(x) > 1024
    assert err[~big].max() <= small_err  # linear-ish region: within one small step
    assert (err[big] / np.abs(x[big])).max() <= max_ratio  # log region: ~3 % relative
    # every code is a distinct level (mu-law has two zeros), and encode(decode(c)) == c
    assert len(np.unique(decode(ALL_CODES))) == (255 if encode is ulaw_encode else 256)
    again = np.frombuffer(encode(decode(ALL_CODES)), dtype=np.uint8)
    mismatch = np.nonzero(again != np.frombuffer(ALL_CODES, dtype=np.uint8))[0].tolist()
    assert mismatch == ([0x7F] if encode is ulaw_encode else [])


def test_encode_refuses_non_int16():
    with pytest.raises(TypeError):
        ulaw_encode(np.zeros(4, dtype=np.float32))
    with pytest.raises(TypeError):
        alaw_encode(np.zeros(4, dtype=np.int32))


@given(st.lists(st.integers(-32768, 32767), max_size=64))
def test_float_scale_round_trips(samples):
    pcm = np.array(samples, dtype=np.int16)
    assert np.array_equal(float_to_pcm16(pcm16_to_float(pcm)), pcm)


def test_pcm16_scale_is_exact_over_every_int16():
    pcm = np.arange(-32768, 32768, dtype=np.int16)
    out = pcm16_to_float(pcm)
    assert out.dtype == np.float32 and out.flags.writeable and out.flags.owndata
    assert np.array_equal(out, pcm.astype(np.float64) / 32768.0)


def test_float_to_pcm16_clips():
    out = float_to_pcm16(np.array([2.0, -2.0, 0.5], dtype=np.float32))
    assert out.tolist() == [32767, -32768, 16384]
