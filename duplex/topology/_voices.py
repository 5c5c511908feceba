"""The uploaded voices' folder, from the config: one folder for the voice routes (which
write it) and for the engine (PersonaPlex reads its voice prompts there too)."""

from __future__ import annotations

import os
from pathlib import Path

from duplex.config import Config
from duplex.services.voices import VoiceLimits, VoiceStore

__all__ = ["voice_folder", "voice_store"]


def voice_folder(config: Config) -> Path:
    """``voice_dir``, or ``$XDG_DATA_HOME/duplex/voices`` (``~/.local/share`` by default)."""
    if config.speech.voice_dir:
        return Path(config.speech.voice_dir).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "duplex" / "voices"


def voice_store(config: Config) -> VoiceStore:
    speech = config.speech
    limits = VoiceLimits(
        max_voices=speech.voice_max_count,
        max_bytes=speech.voice_max_bytes,
        max_duration_s=speech.voice_max_duration_s,
    )
    return VoiceStore(voice_folder(config), limits)
