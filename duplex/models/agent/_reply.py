"""The agent's reply stage: a conversation in, a streamed reply out.

`ReplyRequest` is model-neutral (roles, texts, tool items, the system prompt, sampling,
tools); a `Replier` streams `ReplyDelta` s for it. Cancelling the consuming task ends the
reply (a model-backed replier aborts its request).

`EchoReplier` stands in when no LLM is configured: deterministic, no weights, it
answers from the newest user or tool item ("You said: ..."), word by word. It accepts
tools and never calls one, and ignores instructions: its `ReplyCapabilities` say so, and
the session warns a client that sets tools (``tools_not_supported``).
`duplex.models.agent.VllmReplier` runs a local checkpoint.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final, Protocol, final

import trio

__all__ = [
    "ChatMessage",
    "EchoReplier",
    "Replier",
    "ReplyCapabilities",
    "ReplyDelta",
    "ReplyRequest",
    "ToolSpec",
    "reply_capabilities",
]


@final
@dataclass(frozen=True, slots=True)
class ReplyCapabilities:
    """What a reply model does with a session's settings, so clients can be told
    (``GET /v1/models``, ``session.created``) instead of finding out by silence.

    ``tools``: it may answer with a function call; ``instructions``: it follows the
    session's instructions; ``text_only``: it answers text-only responses (no TTS).
    """

    tools: bool
    instructions: bool
    text_only: bool = True

    def as_dict(self) -> dict[str, bool]:
        return {"tools": self.tools, "instructions": self.instructions, "text_only": self.text_only}


ECHO_CAPABILITIES: Final = ReplyCapabilities(tools=False, instructions=False)
LLM_CAPABILITIES: Final = ReplyCapabilities(tools=True, instructions=True)


def reply_capabilities(llm: str) -> ReplyCapabilities:
    """The capabilities of the reply model ``agent.llm`` names (``""``: the echo),
    known before it loads."""
    return LLM_CAPABILITIES if llm else ECHO_CAPABILITIES


@final
@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One conversation item as a chat model sees it.

    ``role``: ``user``, ``assistant``, ``system`` or ``tool``; ``kind``: ``message``,
    ``function_call`` (``name``, ``call_id``, ``text`` its arguments) or
    ``function_call_output`` (``call_id``, ``text`` its output).
    """

    role: str
    text: str
    kind: str = "message"
    call_id: str = ""
    name: str = ""


@final
@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function the model may call (its JSON-schema parameters as JSON text)."""

    name: str
    description: str
    parameters_json: str


@final
@dataclass(frozen=True, slots=True)
class ReplyRequest:
    """What to answer and how. ``max_tokens`` ``None``: the model's own limit."""

    messages: tuple[ChatMessage, ...]
    instructions: str = ""
    temperature: float = 0.8
    max_tokens: int | None = None
    tools: tuple[ToolSpec, ...] = ()
    seed: int | None = None


@final
@dataclass(frozen=True, slots=True)
class ReplyDelta:
    """More reply text; or a piece of a tool call (``call_name`` set, ``text`` the next
    text of its JSON arguments, ``call_done`` on the call's last piece: a whole call is one
    piece); ``finish`` on the last delta: ``stop``, ``length`` or ``tool_calls``."""

    text: str = ""
    call_id: str = ""
    call_name: str = ""
    finish: str | None = None
    call_done: bool = True


class Replier(Protocol):
    """Streams a reply; shared by every session of the process."""

    name: str
    capabilities: ReplyCapabilities

    def stream(self, request: ReplyRequest) -> AsyncIterator[ReplyDelta]: ...

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Its loop, if it has one (in the server's nursery); returns when it has none."""


class EchoReplier:
    """The deterministic stand-in: "You said: <the newest user text>." word by word."""

    name = "echo"
    capabilities = ECHO_CAPABILITIES

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()  # no loop: each reply is made where it is read

    async def stream(self, request: ReplyRequest) -> AsyncIterator[ReplyDelta]:
        text = _answer(request.messages)
        words = text.split(" ")
        limit = request.max_tokens
        for index, word in enumerate(words):
            if limit is not None and index >= limit:
                yield ReplyDelta(finish="length")
                return
            await trio.lowlevel.checkpoint()
            yield ReplyDelta(word if index == 0 else " " + word)
        yield ReplyDelta(finish="stop")


def _answer(messages: tuple[ChatMessage, ...]) -> str:
    for message in reversed(messages):
        if message.kind == "function_call_output":
            return f"The tool said: {message.text.strip() or 'nothing'}."
        if message.role == "user":
            heard = message.text.strip()
            return f"You said: {heard}." if heard else "Sorry, I did not catch that."
    return "Hello."
