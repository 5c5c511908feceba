"""Chat completions on the agent's reply engine: ``POST /v1/chat/completions`` (and
``/batch``), OpenAI's wire, vLLM's extension parameters."""

from ._protocol import ChatBatch, ChatCompletion, ModelInfo, parse_batch, parse_chat
from ._serving import CHAT_PATHS, ChatService, chat_modalities, chat_routes

__all__ = [
    "CHAT_PATHS",
    "ChatBatch",
    "ChatCompletion",
    "ChatService",
    "ModelInfo",
    "chat_modalities",
    "chat_routes",
    "parse_batch",
    "parse_chat",
]
