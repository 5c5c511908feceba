"""duplex.models.tts: text to speech as request-batched runners.

A `SpeechRequest` (text, voice, speed, sample rate) becomes a `SpeechAudio`
(mono int16 PCM). `EspeakRunner` is the default engine (espeak-ng from the
``espeakng-loader`` wheel: offline, no weights); `VitsRunner` runs a local
transformers VITS / MMS-TTS checkpoint, batched. `load_tts` reads ``--tts``.
Both split text into sentences (`split_sentences`; `SentenceBuffer` for text
that arrives in pieces) and call ``gate.next_unit()`` between units, so a long
text yields to realtime work. OpenAI's voice names map onto distinct voices
(`OPENAI_TO_ESPEAK`).
"""

from ._espeak import Espeak, EspeakVoice, espeak
from ._espeak_runner import EspeakRunner
from ._load import TTS_ESPEAK, TTS_NONE, check_tts, load_tts
from ._sentences import MAX_SENTENCE_CHARS, SentenceBuffer, split_sentences
from ._speech import (
    MAX_SPEED,
    MIN_SPEED,
    NO_GATE,
    TTS_RUNNER,
    SpeechAudio,
    SpeechRequest,
    SpeechRunner,
    VoiceInfo,
    speech_metadata,
    voice_problem,
)
from ._vits import VitsRunner
from ._voices import OPENAI_TO_ESPEAK, OPENAI_VOICES

__all__ = [
    "MAX_SENTENCE_CHARS",
    "MAX_SPEED",
    "MIN_SPEED",
    "NO_GATE",
    "OPENAI_TO_ESPEAK",
    "OPENAI_VOICES",
    "TTS_ESPEAK",
    "TTS_NONE",
    "TTS_RUNNER",
    "Espeak",
    "EspeakRunner",
    "EspeakVoice",
    "SentenceBuffer",
    "SpeechAudio",
    "SpeechRequest",
    "SpeechRunner",
    "VitsRunner",
    "VoiceInfo",
    "check_tts",
    "espeak",
    "load_tts",
    "speech_metadata",
    "split_sentences",
    "voice_problem",
]
