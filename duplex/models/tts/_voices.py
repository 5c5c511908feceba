"""OpenAI's voice names, and the espeak voice each one speaks with.

Apps written for OpenAI name ``alloy``, ``marin`` and the rest; each maps onto
a different espeak English voice and variant (accent, and a male or female
formant set), so two OpenAI voices never sound the same. The mapping is data,
checked against the installed voices when the runner loads.
"""

from __future__ import annotations

from typing import Final

__all__ = ["OPENAI_TO_ESPEAK", "OPENAI_VOICES"]

OPENAI_TO_ESPEAK: Final[dict[str, str]] = {
    "alloy": "en-us",
    "ash": "en-us+m3",
    "ballad": "en-gb-x-rp+m7",
    "coral": "en-us+f3",
    "echo": "en-gb+m2",
    "sage": "en-gb+f2",
    "shimmer": "en-us+f4",
    "verse": "en-gb-scotland+m1",
    "marin": "en-us+f5",
    "cedar": "en-us+m6",
    # OpenAI's speech endpoint also has these three (its Realtime sessions do not)
    "fable": "en-gb-x-rp+f1",
    "onyx": "en-us+m4",
    "nova": "en-us+f1",
}
"""OpenAI voice -> espeak ``language+variant`` (each pair distinct)."""

OPENAI_VOICES: Final[tuple[str, ...]] = tuple(OPENAI_TO_ESPEAK)
"""The names ``/v1/audio/speech`` takes as OpenAI's: ``duplex.sessions.VOICES`` (the
Realtime sessions' names), in the same order, then ``fable``, ``onyx`` and ``nova``."""
