"""ITU-T G.711 mu-law and A-law companding, vectorised with numpy.

The Realtime wire carries telephone audio (``audio/pcmu``, ``audio/pcma``,
beta ``g711_ulaw``/``g711_alaw``) as 8-bit G.711 at 8 kHz; the session only
sees float32 PCM. This lives in ``transport`` because companding is a wire
encoding, like base64 or little-endian PCM16: nothing past the codec sees it.
(The resampler lives in ``sessions`` because the session itself resamples.)

The formulas are the reference ones of the ITU-T G.711 software tools (and of
Sun's ``g711.c``, which CPython's ``audioop`` uses): mu-law quantises 14-bit
magnitudes with a bias of 33 in eight segments, A-law quantises 13-bit
magnitudes in eight segments; both invert alternate bits on the wire
(mu-law all bits, A-law the even bits, ``0x55``). Encoding is a lookup in a
65,536-entry table built once from those formulas; decoding a lookup in a
256-entry table. The wire decoders (`ulaw_to_float`, `alaw_to_float`) look codes up
in float32 copies of those tables, a block at a time: one step to the session's
samples, and numpy's fancy indexing would first widen every code to an int64 index
(8 bytes per sample of a 16 MiB append).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from duplex.pcm import pcm16_to_float

__all__ = [
    "alaw_decode",
    "alaw_encode",
    "alaw_to_float",
    "ulaw_decode",
    "ulaw_encode",
    "ulaw_to_float",
]

Int16Array = npt.NDArray[np.int16]
ByteArray = npt.NDArray[np.uint8]

_ULAW_BIAS = 0x21  # 33, in 14-bit units (0x84 in 16-bit units)
_ULAW_CLIP = 8159  # largest 14-bit magnitude before the bias overflows segment 7
# Top of each segment (inclusive) of the biased 14-bit mu-law magnitude and the 13-bit A-law one.
_ULAW_SEG_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)
_ALAW_SEG_END = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], dtype=np.int32)


def _ulaw_encode_formula(pcm: npt.NDArray[np.int32]) -> ByteArray:
    """mu-law code of 16-bit linear samples (the 2 low bits are dropped first)."""
    x = pcm >> 2
    mask = np.where(x < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(x), _ULAW_CLIP) + _ULAW_BIAS
    seg = np.searchsorted(_ULAW_SEG_END, mag, side="left")
    code = np.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> np.minimum(seg + 1, 8)) & 0x0F))
    return ((code ^ mask) & 0xFF).astype(np.uint8)


def _ulaw_decode_formula(code: npt.NDArray[np.int32]) -> Int16Array:
    """16-bit linear value of each mu-law code."""
    u = ~code & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


def _alaw_encode_formula(pcm: npt.NDArray[np.int32]) -> ByteArray:
    """A-law code of 16-bit linear samples (the 3 low bits are dropped first)."""
    x = pcm >> 3
    mask = np.where(x >= 0, 0xD5, 0x55)
    mag = np.where(x >= 0, x, -x - 1)
    seg = np.searchsorted(_ALAW_SEG_END, mag, side="left")
    shift = np.where(seg < 2, 1, seg)
    code = np.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> shift) & 0x0F))
    return ((code ^ mask) & 0xFF).astype(np.uint8)


def _alaw_decode_formula(code: npt.NDArray[np.int32]) -> Int16Array:
    """16-bit linear value of each A-law code."""
    a = code ^ 0x55
    seg = (a & 0x70) >> 4
    t = (a & 0x0F) << 4
    t = np.where(seg == 0, t + 8, (t + 0x108) << np.maximum(seg - 1, 0))
    return np.where(a & 0x80, t, -t).astype(np.int16)


_ALL_PCM = np.arange(-32768, 32768, dtype=np.int32)
_ALL_CODES = np.arange(256, dtype=np.int32)
_ULAW_ENC = _ulaw_encode_formula(_ALL_PCM)
_ALAW_ENC = _alaw_encode_formula(_ALL_PCM)
_ULAW_DEC = _ulaw_decode_formula(_ALL_CODES)
_ALAW_DEC = _alaw_decode_formula(_ALL_CODES)
_ULAW_FLOAT = pcm16_to_float(_ULAW_DEC)
_ALAW_FLOAT = pcm16_to_float(_ALAW_DEC)
for _table in (_ULAW_ENC, _ALAW_ENC, _ULAW_DEC, _ALAW_DEC, _ULAW_FLOAT, _ALAW_FLOAT):
    _table.flags.writeable = False
_BLOCK = 1 << 16  # codes looked up at a time (a 512 KiB index)


def _as_int16(pcm: npt.ArrayLike) -> Int16Array:
    arr = np.asarray(pcm)
    if arr.dtype != np.int16:
        raise TypeError(f"G.711 encodes int16 samples, got {arr.dtype}")
    return arr.reshape(-1)


def ulaw_encode(pcm: npt.ArrayLike) -> bytes:
    """mu-law bytes of int16 samples.

    Args:
        pcm: 16-bit linear samples (any int16 array).

    Returns:
        One byte per sample.

    Raises:
        TypeError: the samples are not int16 (silent truncation would corrupt audio).
    """
    return _ULAW_ENC[_as_int16(pcm).astype(np.int32) + 32768].tobytes()


def alaw_encode(pcm: npt.ArrayLike) -> bytes:
    """A-law bytes of int16 samples (same contract as `ulaw_encode`)."""
    return _ALAW_ENC[_as_int16(pcm).astype(np.int32) + 32768].tobytes()


def ulaw_decode(data: bytes) -> Int16Array:
    """int16 samples of mu-law bytes (every byte value is a valid code)."""
    return _ULAW_DEC[np.frombuffer(data, dtype=np.uint8)]


def alaw_decode(data: bytes) -> Int16Array:
    """int16 samples of A-law bytes (every byte value is a valid code)."""
    return _ALAW_DEC[np.frombuffer(data, dtype=np.uint8)]


def _lookup(table: npt.NDArray[np.float32], data: bytes) -> npt.NDArray[np.float32]:
    codes = np.frombuffer(data, dtype=np.uint8)
    out = np.empty(codes.size, dtype=np.float32)
    for start in range(0, codes.size, _BLOCK):
        end = start + _BLOCK  # every code is in the table: "clip" never clips, and is unbuffered
        np.take(table, codes[start:end], out=out[start:end], mode="clip")
    return out


def ulaw_to_float(data: bytes) -> npt.NDArray[np.float32]:
    """`pcm16_to_float` of `ulaw_decode`, without the int16 or index arrays in between."""
    return _lookup(_ULAW_FLOAT, data)


def alaw_to_float(data: bytes) -> npt.NDArray[np.float32]:
    """`pcm16_to_float` of `alaw_decode` (as `ulaw_to_float`)."""
    return _lookup(_ALAW_FLOAT, data)
