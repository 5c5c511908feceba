"""Field checks shared by the event modules (h11's validate-when-built habit)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from duplex.exceptions import BadAudio, BadEvent, ProtocolError

__all__ = ["Pcm", "check", "float_pcm", "is_int"]

Pcm = npt.NDArray[np.float32]


def check(ok: bool, message: str, param: str, exc: type[ProtocolError] = BadEvent) -> None:
    """Raise ``exc`` naming ``param`` unless ``ok``."""
    if not ok:
        raise exc(message, param=param)


def is_int(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def float_pcm(pcm: object, param: str) -> Pcm:
    """Normalise to a read-only 1-D float32 array with finite samples.

    A read-only 1-D float32 array (what the wire decoders build) is kept as it
    is: nobody can change it under us, so it needs no copy.
    """
    if (
        isinstance(pcm, np.ndarray)
        and pcm.dtype == np.float32
        and pcm.ndim == 1
        and not pcm.flags.writeable
    ):
        arr = pcm
        check(bool(np.isfinite(arr).all()), f"{param} has NaN or infinite samples", param, BadAudio)
        return arr
    try:
        arr = np.array(pcm, dtype=np.float32, copy=True).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise BadAudio(f"{param} must be numeric samples", param=param) from exc
    check(bool(np.isfinite(arr).all()), f"{param} has NaN or infinite samples", param, BadAudio)
    arr.flags.writeable = False
    return arr
