"""Voices clients upload: ``GET``/``POST /v1/audio/voices``, ``DELETE /v1/audio/voices/{name}``."""

from ._serving import VoiceService, voice_routes
from ._store import StoredVoice, VoiceLimits, VoiceStore

__all__ = ["StoredVoice", "VoiceLimits", "VoiceService", "VoiceStore", "voice_routes"]
