"""``--tts``: which speech runner a server loads.

``espeak`` (the default: espeak-ng, no weights), ``none`` (no TTS: the speech
endpoints answer that none is loaded), or a path to a local VITS / MMS-TTS
checkpoint folder.
"""

from __future__ import annotations

from pathlib import Path

from duplex.exceptions import ConfigError

from ._speech import SpeechRunner

__all__ = ["TTS_ESPEAK", "TTS_NONE", "check_tts", "load_tts"]

TTS_ESPEAK = "espeak"
TTS_NONE = "none"


def check_tts(spec: str) -> None:
    """Refuse a ``--tts`` value at startup: not ``espeak``/``none``, nor a checkpoint folder."""
    if spec in (TTS_ESPEAK, TTS_NONE):
        return
    if not (Path(spec) / "config.json").is_file():
        raise ConfigError(f"tts: must be espeak, none or a VITS checkpoint folder, got {spec!r}")


def load_tts(spec: str, *, device: str = "cpu", max_batch: int = 16) -> SpeechRunner | None:
    """The runner ``spec`` names (``None`` for ``none``); loads weights, so call it off the
    event loop.

    Raises:
        ConfigError: ``spec`` names nothing loadable.
    """
    check_tts(spec)
    if spec == TTS_NONE:
        return None
    if spec == TTS_ESPEAK:
        from ._espeak_runner import EspeakRunner

        return EspeakRunner(max_batch=max_batch)
    from ._vits import VitsRunner

    return VitsRunner(spec, device=device, max_batch=max_batch)
