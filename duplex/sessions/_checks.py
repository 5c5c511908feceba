"""Field checks shared by the event modules (h11's validate-when-built habit).

`Range` is the one reader of a numeric client field: the wire parsers, the events'
constructors and `SessionOptions` check a value with the `Range` of its kind
(`DURATION_MS`, `DURATION_S`, ...), so every accepted number is finite, bounded and
of the right JSON type before anything converts it to a float. Python compares an
int with a float exactly, so a bignum (``1`` and 309 zeros) is refused without the
conversion that would raise ``OverflowError``; NaN fails every comparison.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import final

import numpy as np
import numpy.typing as npt

from duplex.exceptions import BadAudio, BadEvent, ProtocolError

__all__ = [
    "COUNT",
    "DURATION_MS",
    "DURATION_S",
    "FRACTION",
    "MAX_DURATION_MS",
    "MAX_DURATION_S",
    "PIXELS",
    "POSITIVE",
    "POSITIVE_MS",
    "Pcm",
    "Range",
    "check",
    "float_pcm",
    "is_int",
]

Pcm = npt.NDArray[np.float32]


def check(ok: bool, message: str, param: str, exc: type[ProtocolError] = BadEvent) -> None:
    """Raise ``exc`` naming ``param`` unless ``ok``."""
    if not ok:
        raise exc(message, param=param)


def is_int(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


@final
@dataclass(frozen=True, slots=True)
class Range:
    """The values a numeric field accepts: its JSON type and its bounds.

    Args:
        low: the smallest value (excluded when ``open_low``).
        high: the largest value.
        integer: only JSON integers (a float, even ``2.0``, is refused).
        open_low: ``low`` itself is refused (a positive duration).
    """

    low: int | float
    high: int | float
    integer: bool = True
    open_low: bool = False

    def accepts(self, value: object) -> bool:
        """Whether ``value`` is of the type and within the bounds (bools are not numbers)."""
        if isinstance(value, bool) or not isinstance(value, int if self.integer else int | float):
            return False
        above = value > self.low if self.open_low else value >= self.low
        return above and value <= self.high  # False for NaN; int vs float is exact

    def describe(self) -> str:
        """The rule in words, for error messages."""
        kind = "an integer" if self.integer else "a number"
        if self.open_low:
            return f"{kind} above {_number(self.low)} and at most {_number(self.high)}"
        return f"{kind} from {_number(self.low)} to {_number(self.high)}"

    def read(self, value: object, param: str, exc: type[ProtocolError] = BadEvent) -> int | float:
        """``value`` if it is accepted.

        Raises:
            ProtocolError: ``exc`` (``BadEvent`` by default) naming ``param``.
        """
        if not self.accepts(value):
            raise exc(f"{param} must be {self.describe()}", param=param)
        return value  # type: ignore[return-value]  # accepts() checked the type


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


MAX_DURATION_MS = 86_400_000
"""A day: the longest duration, offset or audio position a client may name, in ms."""
MAX_DURATION_S = 86_400
"""A day, in seconds."""

DURATION_MS = Range(0, MAX_DURATION_MS)
"""A millisecond count or position on an audio clock (``played_ms``, ``audio_end_ms``,
``vad_prefix_padding_ms``, ``vad_idle_timeout_ms``: 0 means off)."""
POSITIVE_MS = Range(1, MAX_DURATION_MS)
"""A millisecond duration that must not be 0 (``short_ack_ms``, ``barge_in_ms``,
``vad_hangover_ms``)."""
DURATION_S = Range(0, MAX_DURATION_S, integer=False, open_low=True)
"""A positive duration in seconds (``false_interruption_timeout_s``)."""
FRACTION = Range(0, 1, integer=False)
"""A number from 0 to 1 (``vad_threshold``)."""
COUNT = Range(0, 2**53 - 1)
"""A sequence number, an index or a client timestamp passed through
(``server_event_seq``, ``content_index``, ``pts_ms``): JSON's exact integers."""
PIXELS = Range(1, 65_535)
"""A frame's width or height."""
POSITIVE = Range(0, sys.float_info.max, integer=False, open_low=True)
"""Any positive finite number (server-set limits; bignums refused)."""


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
