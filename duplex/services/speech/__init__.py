"""Text to speech over HTTP and WebSocket: ``/v1/audio/speech``, ``/batch``, ``/stream``, voices."""

from ._serving import SpeechService, speech_routes

__all__ = ["SpeechService", "speech_routes"]
