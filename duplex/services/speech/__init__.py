"""Text to speech over HTTP and WebSocket: ``/v1/audio/speech``, ``/batch``, ``/stream``, voices."""

from ._serving import LOADING, SpeechService, UploadedVoices, speech_routes

__all__ = ["LOADING", "SpeechService", "UploadedVoices", "speech_routes"]
