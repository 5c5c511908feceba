"""Chat completions on the agent's reply engine: the request as the engine takes it.

``POST /v1/chat/completions`` (``duplex.services.chat``) parses a body into a
`ChatRequest`; a `ChatEngine` (the agent's `VllmReplier`) streams one choice of it
as `ReplyDelta` s (text, tool-call pieces, the finish) and ends with one
`ChatUsage`. The request is model-neutral and fully validated: the engine only
renders it through the checkpoint's chat template and samples.

Live agent sessions keep their priority on the shared engine: a chat choice is
submitted at `CHAT_PRIORITY`, behind the agent's replies (vllm's priority
scheduler: a lower number runs first, and a waiting reply is scheduled before any
waiting chat request).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final, Protocol, final

from ._reply import ReplyDelta, ToolSpec

__all__ = [
    "AGENT_PRIORITY",
    "CHAT_PRIORITY",
    "ChatEngine",
    "ChatPart",
    "ChatRequest",
    "ChatTurn",
    "ChatUsage",
    "ResponseFormat",
    "Sampling",
    "ToolCall",
]

AGENT_PRIORITY: Final = 0
"""vllm priority of a live session's reply (lower runs first)."""
CHAT_PRIORITY: Final = 1
"""vllm priority of a chat completion: behind every live session's reply."""


@final
@dataclass(frozen=True, slots=True)
class ChatPart:
    """One content part: ``text``, or an ``image`` (its encoded bytes: PNG, JPEG, ...)."""

    kind: str
    text: str = ""
    image: bytes = b""


@final
@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call an assistant turn made (``arguments``: JSON text, as the model wrote it)."""

    id: str
    name: str
    arguments: str


@final
@dataclass(frozen=True, slots=True)
class ChatTurn:
    """One message: ``role`` (system, user, assistant, tool), its parts, an assistant's
    ``tool_calls``, a tool message's ``tool_call_id``."""

    role: str
    parts: tuple[ChatPart, ...]
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if p.kind == "text")


@final
@dataclass(frozen=True, slots=True)
class Sampling:
    """vllm's sampling fields a request may set (``None``: the engine's default)."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    ignore_eos: bool = False


@final
@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """``json_object``, or ``json_schema`` with its schema as JSON text (``text``: none)."""

    kind: str
    schema_json: str = ""


@final
@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One conversation to continue, and how (``tool_choice``: ``auto``, ``none``, or a
    function's name the model must call)."""

    turns: tuple[ChatTurn, ...]
    sampling: Sampling = Sampling()
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "auto"
    response_format: ResponseFormat | None = None

    @property
    def images(self) -> int:
        return sum(p.kind == "image" for t in self.turns for p in t.parts)


@final
@dataclass(frozen=True, slots=True)
class ChatUsage:
    """A choice's token counts: the last thing its stream yields."""

    prompt_tokens: int
    completion_tokens: int


class ChatEngine(Protocol):
    """The engine chat completions run on (the agent's reply model)."""

    model: str
    """The served checkpoint (its folder, as configured)."""
    multimodal: bool
    """It takes image parts."""
    max_images: int
    """The most images one prompt may carry."""

    def chat(self, request: ChatRequest, choice: int) -> AsyncIterator[ReplyDelta | ChatUsage]:
        """One choice of ``request`` (``choice`` offsets its seed): `ReplyDelta` s, the last
        with ``finish``, then a `ChatUsage`. Cancelling the consumer aborts it.

        Raises:
            PromptUnsupported: the prompt cannot be taken (an image that does not decode,
                a prompt longer than the model's context).
        """
        ...
