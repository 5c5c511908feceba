"""The voice agent's model stages, shared by every session of a process: streaming ASR
(`PocketSphinxRunner` by default, `WhisperRunner` with a local checkpoint), a reply model
(`EchoReplier` without weights, `VllmReplier` with a local checkpoint) and TTS
(``duplex.models.tts``), each behind a batching engine."""

from ._agent import ASR_RUNNER, AgentModels, AgentOptions, build_asr, build_replier
from ._asr import ASR_SAMPLE_RATE, AsrChunk, AsrProcess, AsrText, PocketSphinxRunner
from ._reply import (
    ChatMessage,
    EchoReplier,
    Replier,
    ReplyCapabilities,
    ReplyDelta,
    ReplyRequest,
    ToolSpec,
    reply_capabilities,
)
from ._whisper import PARTIAL_MS, WINDOW_SAMPLES, WhisperRunner, WhisperStatistics

__all__ = [
    "ASR_RUNNER",
    "ASR_SAMPLE_RATE",
    "PARTIAL_MS",
    "WINDOW_SAMPLES",
    "AgentModels",
    "AgentOptions",
    "AsrChunk",
    "AsrProcess",
    "AsrText",
    "ChatMessage",
    "EchoReplier",
    "PocketSphinxRunner",
    "Replier",
    "ReplyCapabilities",
    "ReplyDelta",
    "ReplyRequest",
    "ToolSpec",
    "WhisperRunner",
    "WhisperStatistics",
    "build_asr",
    "build_replier",
    "reply_capabilities",
]
