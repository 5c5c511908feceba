"""The voice agent's model stages, shared by every session of a process: streaming ASR
(`PocketSphinxRunner` by default, `WhisperRunner` with a local checkpoint), a reply model
(`EchoReplier` without weights, `VllmReplier` with a local checkpoint, which also serves
chat completions: `ChatEngine`) and TTS
(``duplex.models.tts``), each behind a batching engine."""

from ._agent import ASR_RUNNER, AgentModels, AgentOptions, build_asr, build_replier
from ._asr import ASR_SAMPLE_RATE, AsrChunk, AsrProcess, AsrText, PocketSphinxRunner
from ._chat import (
    AGENT_PRIORITY,
    CHAT_PRIORITY,
    ChatEngine,
    ChatPart,
    ChatRequest,
    ChatTurn,
    ChatUsage,
    ResponseFormat,
    Sampling,
    ToolCall,
)
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
    "AGENT_PRIORITY",
    "ASR_RUNNER",
    "ASR_SAMPLE_RATE",
    "CHAT_PRIORITY",
    "PARTIAL_MS",
    "WINDOW_SAMPLES",
    "AgentModels",
    "AgentOptions",
    "AsrChunk",
    "AsrProcess",
    "AsrText",
    "ChatEngine",
    "ChatMessage",
    "ChatPart",
    "ChatRequest",
    "ChatTurn",
    "ChatUsage",
    "EchoReplier",
    "PocketSphinxRunner",
    "Replier",
    "ReplyCapabilities",
    "ReplyDelta",
    "ReplyRequest",
    "ResponseFormat",
    "Sampling",
    "ToolCall",
    "ToolSpec",
    "WhisperRunner",
    "WhisperStatistics",
    "build_asr",
    "build_replier",
    "reply_capabilities",
]
