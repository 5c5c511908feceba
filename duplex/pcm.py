"""The one PCM16 scale of the whole server: int16 / 32768 <-> float32 in [-1, 1).

Every wire codec, the session core and the engine convert through these two
functions, so a PCM16 frame round-trips exactly (``float_to_pcm16`` is the
inverse of ``pcm16_to_float`` over every int16 value).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["float_to_pcm16", "pcm16_to_float"]

_SCALE_IN = np.float32(1.0 / 32768.0)


def pcm16_to_float(pcm: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """Scale int16 samples (any shape) to float32 in [-1, 1)."""
    return np.multiply(np.asarray(pcm, dtype=np.int16), _SCALE_IN, dtype=np.float32)


def float_to_pcm16(pcm: npt.ArrayLike) -> npt.NDArray[np.int16]:
    """Round and clip float samples (any shape) to int16: the inverse of `pcm16_to_float`."""
    scaled = np.asarray(pcm, dtype=np.float32) * np.float32(32768.0)
    np.rint(scaled, out=scaled)
    np.clip(scaled, -32768, 32767, out=scaled)
    return scaled.astype(np.int16)
