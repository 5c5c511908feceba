"""What a response generates: modality, voice, sampling, limits, tools, instructions.

Session-wide values live in `SessionConfig` (set by ``session.update``); one
``response.create`` may override them for that response alone (`ResponseOptions`),
and the response then runs with `ResponseSettings`: the config overlaid with the
overrides, made once, when the response is requested, and carried on its
``response.created`` and ``response.done`` so a projection echoes the response as it
ran without keeping a copy of the config.

Every value here is frozen, picklable (a config crosses process links) and checked
when built; a check collects every bad field before raising (`refuse_all`), so a
client learns all of them from one error.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any, final

from duplex.exceptions import BadEvent, ProtocolError, UnsupportedParameter, refuse_all

__all__ = [
    "INF",
    "MAX_OUTPUT_TOKENS",
    "TEMPERATURE_RANGE",
    "TOOL_CHOICES",
    "VOICES",
    "ConversationMode",
    "FunctionTool",
    "OutputModality",
    "ResponseOptions",
    "ResponseSettings",
    "Transcription",
    "check_generation",
]

VOICES: tuple[str, ...] = (
    "alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar",
)  # fmt: skip
"""OpenAI's voice names, accepted so apps run unchanged. The session keeps the name; a
model with voices maps it onto one of its own (the loopback and the turn responder
have one voice and ignore it)."""
TOOL_CHOICES: tuple[str, ...] = ("auto", "none")
"""``tool_choice`` values every reply model can honour: the echo and the turn responder
never call a tool, and an ``--llm`` model calls one when it chooses to; ``required`` or a
named function would force a call no reply model is made to guarantee, and is refused."""
TEMPERATURE_RANGE = (0.0, 2.0)
MAX_OUTPUT_TOKENS = 4096
"""OpenAI's upper bound for ``max_output_tokens`` (``"inf"`` lifts the limit)."""
INF = "inf"
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_MAX_TOOLS = 128


class OutputModality(enum.StrEnum):
    """What a response produces (Realtime ``output_modalities``)."""

    AUDIO = "audio"
    """Audio with its transcript (``response.output_audio.delta`` + transcript deltas)."""
    TEXT = "text"
    """Text only (``response.output_text.delta``); no audio is sent."""


class ConversationMode(enum.StrEnum):
    """Where a response's output goes (``response.create``'s ``conversation``)."""

    AUTO = "auto"
    """Into the session's conversation (its history)."""
    NONE = "none"
    """Out of band: the output is sent but joins no conversation."""


def _problem(cls: type[ProtocolError], param: str, message: str) -> ProtocolError:
    return cls(f"{param} {message}", param=param)


@final
@dataclass(frozen=True, slots=True)
class Transcription:
    """Input audio transcription (Realtime ``input_audio_transcription``).

    ``model`` ``None``: off. A named model is accepted and kept; transcripts come only from
    a stage that makes them (the current models have no ASR stage, so audio items keep a
    ``null`` transcript and no transcription events are sent; docs/protocol/realtime.md).
    """

    model: str | None = None
    language: str | None = None
    prompt: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        problems = [
            _problem(BadEvent, f"input_audio_transcription.{key}", "must be a non-empty string")
            for key in ("model", "language")
            if getattr(self, key) is not None
            and (not isinstance(getattr(self, key), str) or not getattr(self, key))
        ]
        if self.prompt is not None and not isinstance(self.prompt, str):
            problems.append(
                _problem(BadEvent, "input_audio_transcription.prompt", "must be a string")
            )
        refuse_all(problems)

    @property
    def enabled(self) -> bool:
        """A model is named."""
        return self.model is not None


@final
@dataclass(frozen=True, slots=True)
class FunctionTool:
    """One function tool (``tools``): its JSON-schema ``parameters`` kept as JSON text,
    so the value stays frozen, hashable and picklable."""

    name: str
    description: str = ""
    parameters_json: str = "{}"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _TOOL_NAME.match(self.name):
            raise BadEvent("tools.name must match ^[A-Za-z0-9_-]{1,64}$", param="tools.name")
        if not isinstance(self.description, str):
            raise BadEvent("tools.description must be a string", param="tools.description")

    @classmethod
    def of(cls, name: object, description: object, parameters: object) -> FunctionTool:
        """A tool from decoded JSON values (``parameters`` an object, or ``None``)."""
        if parameters is not None and not isinstance(parameters, dict):
            raise BadEvent("tools.parameters must be an object", param="tools.parameters")
        text = json.dumps(parameters or {}, sort_keys=True, separators=(",", ":"))
        return cls(name, "" if description is None else description, text)  # type: ignore[arg-type]

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema, decoded (a fresh dict each call)."""
        decoded: dict[str, Any] = json.loads(self.parameters_json)
        return decoded


def _check_tools(tools: object, prefix: str, problems: list[ProtocolError]) -> None:
    if not isinstance(tools, tuple) or not all(isinstance(t, FunctionTool) for t in tools):
        problems.append(_problem(BadEvent, f"{prefix}tools", "must be a list of function tools"))
        return
    names = [tool.name for tool in tools]
    if len(set(names)) != len(names):
        problems.append(_problem(BadEvent, f"{prefix}tools", "has two tools of one name"))
    if len(tools) > _MAX_TOOLS:
        problems.append(_problem(BadEvent, f"{prefix}tools", f"holds at most {_MAX_TOOLS} tools"))


def check_generation(values: dict[str, Any], prefix: str, problems: list[ProtocolError]) -> None:
    """Check the generation fields set in ``values`` (``None``: not set), adding one problem
    per bad field to ``problems``; ``prefix`` starts each ``param`` (``session.``)."""
    voice = values.get("voice")
    if voice is not None and voice not in VOICES:
        problems.append(
            _problem(
                BadEvent, f"{prefix}voice", f"must be one of {', '.join(VOICES)}; got {voice!r}"
            )
        )
    modality = values.get("output_modalities")
    if modality is not None and modality not in tuple(OutputModality):
        problems.append(_problem(BadEvent, f"{prefix}output_modalities", "must be audio or text"))
    temperature = values.get("temperature")
    if temperature is not None:
        low, high = TEMPERATURE_RANGE
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or not low <= temperature <= high
        ):
            problems.append(
                _problem(BadEvent, f"{prefix}temperature", f"must be a number in [{low}, {high}]")
            )
    tokens = values.get("max_output_tokens")
    if (
        tokens is not None
        and tokens != INF
        and (
            isinstance(tokens, bool)
            or not isinstance(tokens, int)
            or not 1 <= tokens <= MAX_OUTPUT_TOKENS
        )
    ):
        problems.append(
            _problem(
                BadEvent,
                f"{prefix}max_output_tokens",
                f"must be an integer in [1, {MAX_OUTPUT_TOKENS}] or 'inf'",
            )
        )
    instructions = values.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        problems.append(_problem(BadEvent, f"{prefix}instructions", "must be a string"))
    if values.get("tools") is not None:
        _check_tools(values["tools"], prefix, problems)
    choice = values.get("tool_choice")
    if choice is not None and choice not in TOOL_CHOICES:
        problems.append(
            _problem(
                UnsupportedParameter,
                f"{prefix}tool_choice",
                f"must be one of {', '.join(TOOL_CHOICES)}: {choice!r} would force a tool "
                "call, which the echo reply model and the turn responder cannot make and an "
                "--llm model is not made to",
            )
        )


@final
@dataclass(frozen=True, slots=True)
class ResponseOptions:
    """One ``response.create``'s overrides (``None``: the session's value).

    ``input``: the ids of the items this response answers instead of the conversation
    (``None``: the conversation); ``metadata``: the client's key/value pairs, echoed.

    Raises:
        ProtocolError: every bad field at once (`InvalidParameters` when several).
    """

    conversation: ConversationMode = ConversationMode.AUTO
    instructions: str | None = field(default=None, repr=False)
    output_modalities: str | None = None
    voice: str | None = None
    temperature: float | None = None
    max_output_tokens: int | str | None = None
    tools: tuple[FunctionTool, ...] | None = None
    tool_choice: str | None = None
    metadata: tuple[tuple[str, str], ...] | None = None
    input: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        problems: list[ProtocolError] = []
        if self.conversation not in tuple(ConversationMode):
            problems.append(
                _problem(
                    UnsupportedParameter,
                    "response.conversation",
                    "must be auto or none (this server keeps one conversation per session)",
                )
            )
        else:
            object.__setattr__(self, "conversation", ConversationMode(self.conversation))
        values = {
            key: getattr(self, key)
            for key in (
                "instructions", "output_modalities", "voice", "temperature",
                "max_output_tokens", "tools", "tool_choice",
            )
        }  # fmt: skip
        check_generation(values, "response.", problems)
        metadata = self.metadata
        if metadata is not None and (
            len(metadata) > 16
            or not all(
                isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
                for k, v in metadata
            )
        ):
            problems.append(
                _problem(
                    BadEvent,
                    "response.metadata",
                    "must map at most 16 keys (64 chars) to strings (512 chars)",
                )
            )
        if self.input is not None and not all(isinstance(i, str) and i for i in self.input):
            problems.append(_problem(BadEvent, "response.input", "must name items by id"))
        refuse_all(problems)


@final
@dataclass(frozen=True, slots=True)
class ResponseSettings:
    """How one response runs: the session's generation config with the response's
    overrides applied; carried on ``response.created`` / ``response.done``.

    ``max_output_tokens`` ``None``: no limit. ``metadata``: the client's pairs, if any.
    """

    output_modalities: OutputModality = OutputModality.AUDIO
    conversation: ConversationMode = ConversationMode.AUTO
    voice: str = "alloy"
    temperature: float = 0.8
    max_output_tokens: int | None = None
    instructions: str = field(default="", repr=False)
    tool_choice: str = "auto"
    tool_names: tuple[str, ...] = ()
    metadata: tuple[tuple[str, str], ...] | None = None

    @property
    def text_only(self) -> bool:
        """The response sends text deltas and no audio."""
        return self.output_modalities is OutputModality.TEXT

    @property
    def in_conversation(self) -> bool:
        """The response's item joins the session's conversation."""
        return self.conversation is ConversationMode.AUTO
