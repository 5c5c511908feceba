"""The ``session`` object of a Realtime ``session.update``, read into session options.

Both spellings are read: GA's nested ``audio.input/output`` with format objects
(``{"type": "audio/pcm", "rate": 24000}``) and beta's flat
``input_audio_format: "pcm16"``. Every known Realtime field has a rule: it is
mapped onto a `SessionOptions` field of the same meaning (formats, ``turn_detection``,
``instructions``, ``voice``, transcription, modalities, ``temperature``, token limit,
``tools``, ``tool_choice``), accepted because it restates what the session already does
(``tracing: null``, ``speed: 1``, ...), or refused with a typed error naming the missing
feature. Unknown fields are refused too, as OpenAI does; nothing is dropped silently.

This module maps names and JSON shapes only: whether a value is allowed (a voice, a
temperature, a tool choice) is the session core's rule (`SessionOptions`), so there is one
owner of config. Every bad field of one update is collected, the wire's and the core's,
and refused as one error (`InvalidParameters` when there are several).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, final

from duplex.exceptions import (
    BadEvent,
    InvalidParameters,
    ProtocolError,
    UnsupportedAudioFormat,
    UnsupportedParameter,
    UnsupportedTurnDetection,
    refuse_all,
)
from duplex.refusals import echo
from duplex.sessions import (
    AUDIO_CODECS,
    OPTION_RANGES,
    FunctionTool,
    SessionConfig,
    SessionOptions,
    Transcription,
)

__all__ = [
    "AUDIO_FORMATS",
    "FORMAT_SAMPLE_RATES",
    "GA_FORMATS",
    "SERVER_VAD_DEFAULTS",
    "WireFormats",
    "audio_format",
    "check_audio_modalities",
    "collect",
    "modality",
    "parse_session",
    "parse_tools",
    "tool_choice",
    "turn_detection_options",
    "wire_param",
]

AUDIO_FORMATS: tuple[str, ...] = AUDIO_CODECS
"""The Realtime formats, beta spellings; the session keeps them as its audio codecs."""
FORMAT_SAMPLE_RATES: dict[str, int] = {"pcm16": 24_000, "g711_ulaw": 8_000, "g711_alaw": 8_000}
GA_FORMATS: dict[str, dict[str, Any]] = {
    "pcm16": {"type": "audio/pcm", "rate": 24_000},
    "g711_ulaw": {"type": "audio/pcmu"},
    "g711_alaw": {"type": "audio/pcma"},
}
_GA_TYPES = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}
PCM_RATES: tuple[int, ...] = (24_000, 16_000)
"""``audio/pcm`` input rates (OpenAI's is 24 kHz; 16 kHz is what many capture stacks make)."""

# Duplex-only flat fields (the native protocol's names) -> (SessionOptions field, JSON types).
_DUPLEX_FIELDS: dict[str, tuple[str, tuple[type, ...]]] = {
    "overlap_policy": ("overlap_policy", (str,)),
    "overlap_short_ack_ms": ("short_ack_ms", (int,)),
    "overlap_barge_in_ms": ("barge_in_ms", (int,)),
    "false_interruption_enabled": ("false_interruption_enabled", (bool,)),
    "false_interruption_timeout_s": ("false_interruption_timeout_s", (int, float)),
    "playback_commit_policy": ("playback_commit_policy", (str,)),
}
_NESTED_ALIASES = {  # GA audio.input.X -> the beta flat field with the same rule
    "transcription": "input_audio_transcription",
    "noise_reduction": "input_audio_noise_reduction",
}
_UNSUPPORTED: dict[str, str] = {
    "truncation": "context truncation settings are not supported",
    "include": "include (input transcription logprobs) is not supported",
    "reasoning": "reasoning settings are not supported",
}
_NULL_ONLY: dict[str, str] = {  # the feature is off in this server; only "off" is accepted
    "input_audio_noise_reduction": "input noise reduction is not supported",
    "tracing": "tracing is not supported",
    "prompt": "stored prompts are not supported",
}


@final
@dataclass(frozen=True, slots=True)
class WireFormats:
    """Audio encodings on the wire (beta spellings; see `AUDIO_FORMATS`).

    A view of a session config's ``input_audio_codec``/``output_audio_codec``
    (`of`); the session owns them.
    """

    input: str = "pcm16"
    output: str = "pcm16"
    input_rate: int = 0
    """The input's sample rate: 24 kHz or 16 kHz PCM (``{"type": "audio/pcm", "rate":
    16000}``), 8 kHz G.711 (the session's ``input_sample_rate``); 0: the format's own."""

    def __post_init__(self) -> None:
        for key in ("input", "output"):
            if getattr(self, key) not in AUDIO_FORMATS:
                raise ValueError(f"{key} format must be one of {AUDIO_FORMATS}")
        if not self.input_rate:
            object.__setattr__(self, "input_rate", FORMAT_SAMPLE_RATES[self.input])
        if self.input != "pcm16" and self.input_rate != FORMAT_SAMPLE_RATES[self.input]:
            raise ValueError("G.711 input is 8000 Hz")

    @classmethod
    def of(cls, config: SessionConfig) -> WireFormats:
        """The formats a session config negotiated."""
        return cls(config.input_audio_codec, config.output_audio_codec, config.input_sample_rate)


@dataclass(slots=True)
class _Builder:
    """Collects one update's choices while the fields are read."""

    duplex: bool
    model: str | None
    formats: dict[str, tuple[str, int]] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    turn_detection_param: str | None = None
    problems: list[ProtocolError] = field(default_factory=list)
    origin: dict[str, str] = field(default_factory=dict)
    """`SessionOptions` field -> the wire path that set it (names the session core's refusals)."""

    def set_format(self, which: str, fmt: tuple[str, int], param: str) -> None:
        previous = self.formats.get(which)
        if previous is not None and previous != fmt:
            raise BadEvent(f"{param} conflicts with another {which} format field", param=param)
        if which == "output" and fmt[1] != FORMAT_SAMPLE_RATES[fmt[0]]:
            raise UnsupportedAudioFormat(
                f"{param}.rate={fmt[1]}: output audio/pcm is 24000 Hz", param=f"{param}.rate"
            )
        self.formats[which] = fmt
        names = (
            ("input_audio_codec", "input_sample_rate")
            if which == "input"
            else ("output_audio_codec",)
        )
        self.origin.update(dict.fromkeys(names, param))

    def set(self, key: str, value: object, param: str) -> None:
        """A `SessionOptions` field; a second spelling of it must agree."""
        if key in self.options and self.options[key] != value:
            raise BadEvent(f"{param} conflicts with another field for {key}", param=param)
        self.options[key] = value
        self.origin[key] = param

    def set_turn_detection(self, value: object, param: str) -> None:
        if self.turn_detection_param is not None:
            raise BadEvent(f"{param} conflicts with {self.turn_detection_param}", param=param)
        self.turn_detection_param = param
        self.options.update(turn_detection_options(value, param, duplex=self.duplex))
        self.origin["turn_detection"] = param
        self.origin.update({name: f"{param}.{key}" for key, name in _VAD_OPTIONS.items()})


def _object(value: object, param: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise BadEvent(f"{param} must be an object", param=param)
    return value


def collect(problems: list[ProtocolError], fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, its refusal added to ``problems`` (one per field) instead of raised."""
    try:
        return fn(*args)
    except InvalidParameters as exc:
        problems.extend(exc.problems)
    except ProtocolError as exc:
        problems.append(exc)
    return None


def audio_format(value: object, param: str) -> tuple[str, int]:
    """A beta format name or a GA format object, as its beta name and its rate (PCM may be
    16 kHz on input; `_Builder.set_format` holds output to 24 kHz)."""
    if isinstance(value, str):
        if value in AUDIO_FORMATS:
            return value, FORMAT_SAMPLE_RATES[value]
        raise UnsupportedAudioFormat(
            f"{param}={echo(value)} is not supported; use one of {AUDIO_FORMATS}", param=param
        )
    obj = _object(value, param)
    for key in obj:
        if key not in ("type", "rate"):
            raise BadEvent(f"unknown parameter '{param}.{key}'", param=f"{param}.{key}")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise BadEvent(f"{param}.type must be a string", param=f"{param}.type")
    if kind not in _GA_TYPES:
        raise UnsupportedAudioFormat(
            f"{param}.type={echo(kind)} is not supported; use one of {tuple(_GA_TYPES)}",
            param=f"{param}.type",
        )
    rate = obj.get("rate")
    if rate is not None and (
        kind != "audio/pcm" or rate not in PCM_RATES or isinstance(rate, bool)
    ):
        raise UnsupportedAudioFormat(
            f"{param}.rate={echo(rate)}: audio/pcm is 24000 or 16000 Hz; G.711 has no rate field",
            param=f"{param}.rate",
        )
    codec = _GA_TYPES[kind]
    return codec, FORMAT_SAMPLE_RATES[codec] if rate is None else int(rate)


SERVER_VAD_DEFAULTS: dict[str, Any] = {
    "threshold": 0.5,
    "prefix_padding_ms": 300,
    "silence_duration_ms": 500,
    "create_response": True,
    "interrupt_response": True,
    "idle_timeout_ms": None,
}
"""OpenAI's ``server_vad`` defaults; a ``turn_detection`` object replaces the whole setting,
so a field it leaves out takes its default."""

_VAD_OPTIONS = {  # Realtime server_vad field -> SessionOptions field
    "threshold": "vad_threshold",
    "prefix_padding_ms": "vad_prefix_padding_ms",
    "silence_duration_ms": "vad_hangover_ms",
    "create_response": "vad_create_response",
    "interrupt_response": "vad_interrupt_response",
    "idle_timeout_ms": "vad_idle_timeout_ms",
}


def _vad_value(key: str, value: object, param: str) -> object:
    """One ``server_vad`` field, checked with its session field's range
    (`OPTION_RANGES`); ``idle_timeout_ms: null`` is 0 (off)."""
    if key in ("create_response", "interrupt_response"):
        if not isinstance(value, bool):
            raise BadEvent(f"{param} must be a boolean", param=param)
        return value
    if key == "idle_timeout_ms" and value is None:
        return 0
    checked = OPTION_RANGES[_VAD_OPTIONS[key]].read(value, param)
    return float(checked) if key == "threshold" else checked


def turn_detection_options(value: object, param: str, *, duplex: bool) -> dict[str, Any]:
    """Read a ``turn_detection`` value into `SessionOptions` fields.

    ``null`` turns detection off (no speech events; commits are manual);
    ``server_vad`` sets every knob (absent ones take OpenAI's defaults);
    ``semantic_vad`` is refused: this server has no semantic turn model.

    Raises:
        UnsupportedTurnDetection: ``semantic_vad``; or, with the duplex extensions,
            ``interrupt_response: false`` (barge-in there follows ``overlap_policy``).
        BadEvent: an unknown type, field or a value of the wrong type or range.
    """
    if value is None:
        return {"turn_detection": "none"}
    obj = _object(value, param)
    kind = obj.get("type")
    if kind == "semantic_vad":
        raise UnsupportedTurnDetection(
            f"{param}.type=semantic_vad is not supported: there is no semantic turn model; "
            "use server_vad or null",
            param=f"{param}.type",
        )
    if kind != "server_vad":
        raise BadEvent(f"{param}.type must be server_vad or semantic_vad", param=f"{param}.type")
    options: dict[str, Any] = {"turn_detection": "server_vad"}
    for key in obj:
        if key != "type" and key not in _VAD_OPTIONS:
            raise BadEvent(f"unknown parameter '{param}.{key}'", param=f"{param}.{key}")
    for key, name in _VAD_OPTIONS.items():
        given = obj.get(key, SERVER_VAD_DEFAULTS[key])
        options[name] = _vad_value(key, given, f"{param}.{key}")
    if duplex and not options["vad_interrupt_response"]:
        raise UnsupportedTurnDetection(
            f"{param}.interrupt_response=false is not supported with ?duplex=1: "
            "barge-in follows overlap_policy (set overlap_policy=ignore instead)",
            param=f"{param}.interrupt_response",
        )
    return options


def modality(value: object, param: str) -> str:
    """``output_modalities`` / ``modalities`` as the session's `OutputModality` name:
    ``["text"]`` is text only; ``["audio"]`` (GA) or ``["audio", "text"]`` (beta) is audio
    with its transcript."""
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise BadEvent(f"{param} must be a non-empty list of strings", param=param)
    if not set(value) <= {"audio", "text"}:
        raise BadEvent(f"{param} may hold audio and text only", param=param)
    return "audio" if "audio" in value else "text"


def check_audio_modalities(value: object, param: str) -> None:
    """``modality`` for a caller that only checks the shape."""
    modality(value, param)


def parse_tools(value: object, param: str) -> tuple[FunctionTool, ...]:
    """``tools``: function tools (``type``, ``name``, ``description``, ``parameters``).

    Raises:
        UnsupportedParameter: an MCP (or other non-function) tool.
        BadEvent: a bad shape; every bad tool is named (`InvalidParameters`).
    """
    if not isinstance(value, list):
        raise BadEvent(f"{param} must be a list", param=param)
    problems: list[ProtocolError] = []
    tools: list[FunctionTool] = []
    for index, tool in enumerate(value):
        at = f"{param}.{index}"
        if not isinstance(tool, dict):
            problems.append(BadEvent(f"{at} must be an object", param=at))
            continue
        if tool.get("type", "function") != "function":
            problems.append(
                UnsupportedParameter(
                    f"{at}.type={echo(tool.get('type'))}: only function tools are supported",
                    param=f"{at}.type",
                )
            )
            continue
        unknown = [k for k in tool if k not in ("type", "name", "description", "parameters")]
        for key in unknown:
            problems.append(BadEvent(f"unknown parameter '{at}.{key}'", param=f"{at}.{key}"))
        if unknown:
            continue
        found: list[ProtocolError] = []
        made = collect(
            found,
            FunctionTool.of,
            tool.get("name"),
            tool.get("description"),
            tool.get("parameters"),
        )
        problems.extend(_at(found, at))
        if made is not None:
            tools.append(made)
    refuse_all(problems)
    return tuple(tools)


def _at(problems: list[ProtocolError], param: str) -> list[ProtocolError]:
    """Name a value-level problem (``tools.name``) by the field that holds it."""
    for problem in problems:
        if problem.param is not None and problem.param.startswith("tools."):
            problem.param = f"{param}.{problem.param.removeprefix('tools.')}"
    return problems


def tool_choice(value: object, param: str) -> str:
    """``tool_choice``: a mode name, or a function object spelled ``function:<name>`` (the
    session core decides which it can honour)."""
    if isinstance(value, str):
        return value
    obj = _object(value, param)
    if obj.get("type") != "function" or not isinstance(obj.get("name"), str):
        raise UnsupportedParameter(
            f"{param}: only auto, none or a function tool choice", param=param
        )
    return f"function:{obj['name']}"


def _transcription(value: object, param: str) -> Transcription:
    """``input_audio_transcription`` / ``audio.input.transcription``; ``null`` is off."""
    if value is None:
        return Transcription()
    obj = _object(value, param)
    for key in obj:
        if key not in ("model", "language", "prompt"):
            raise BadEvent(f"unknown parameter '{param}.{key}'", param=f"{param}.{key}")
    model = obj.get("model", "whisper-1")
    try:
        return Transcription(model, obj.get("language"), obj.get("prompt"))
    except ProtocolError as exc:
        exc.param = f"{param}.{(exc.param or '').rsplit('.', 1)[-1]}"
        raise


def _restates(ok: Callable[[object], bool], message: str) -> Callable[[object, str], None]:
    """A rule that accepts only the value the session already behaves as."""

    def rule(value: object, param: str) -> None:
        if not ok(value):
            raise UnsupportedParameter(f"{param}={echo(value)}: {message}", param=param)

    return rule


_SIMPLE: dict[str, Callable[[object, str], None]] = {
    "speed": _restates(lambda v: v == 1 and not isinstance(v, bool), "only speed 1.0 is supported"),
    "parallel_tool_calls": _restates(
        lambda v: isinstance(v, bool), "must be a boolean (no tool is ever called, so either holds)"
    ),
}
_MAPPED: dict[str, tuple[str, Callable[[object, str], object] | None]] = {
    # Realtime field (either schema) -> (SessionOptions field, reader; None: as sent)
    "instructions": ("instructions", None),
    "voice": ("voice", None),
    "temperature": ("temperature", None),
    "max_output_tokens": ("max_output_tokens", None),
    "max_response_output_tokens": ("max_output_tokens", None),
    "output_modalities": ("output_modalities", modality),
    "modalities": ("output_modalities", modality),
    "input_audio_transcription": ("input_transcription", _transcription),
    "tools": ("tools", parse_tools),
    "tool_choice": ("tool_choice", tool_choice),
}


def _field(key: str, value: object, param: str, out: _Builder) -> None:
    """Apply one field (``param`` is its full path) or raise naming it."""
    if key in _MAPPED:
        name, reader = _MAPPED[key]
        out.set(name, value if reader is None else reader(value, param), param)
    elif key in _SIMPLE:
        _SIMPLE[key](value, param)
    elif key in _UNSUPPORTED:
        raise UnsupportedParameter(f"{param}: {_UNSUPPORTED[key]}", param=param)
    elif key in _NULL_ONLY:
        if value is not None:
            raise UnsupportedParameter(f"{param}: {_NULL_ONLY[key]} (only null)", param=param)
    else:
        raise BadEvent(f"unknown parameter '{param}'", param=param)


def _audio(value: object, param: str, out: _Builder) -> None:
    """GA ``session.audio``: ``input{format, transcription, noise_reduction, turn_detection}``,
    ``output{format, voice, speed}``; every bad field is collected."""
    for side, side_value in _object(value, param).items():
        side_param = f"{param}.{side}"
        if side not in _AUDIO_KEYS:
            out.problems.append(BadEvent(f"unknown parameter '{side_param}'", param=side_param))
            continue
        items = collect(out.problems, _object, side_value, side_param) or {}
        for key, item in items.items():
            collect(out.problems, _audio_field, side, key, item, f"{side_param}.{key}", out)


_AUDIO_KEYS = {
    "input": ("format", "transcription", "noise_reduction", "turn_detection"),
    "output": ("format", "voice", "speed"),
}


def _audio_field(side: str, key: str, item: object, param: str, out: _Builder) -> None:
    if key not in _AUDIO_KEYS[side]:
        raise BadEvent(f"unknown parameter '{param}'", param=param)
    if key == "format":
        out.set_format(side, audio_format(item, param), param)
    elif key == "turn_detection":
        out.set_turn_detection(item, param)
    else:
        _field(_NESTED_ALIASES.get(key, key), item, param, out)


def _top(key: str, value: object, out: _Builder) -> None:
    param = f"session.{key}"
    if key == "type":
        if value == "transcription":
            raise UnsupportedParameter("transcription sessions are not supported", param=param)
        if value != "realtime":
            raise BadEvent("session.type must be 'realtime'", param=param)
    elif key == "model":
        if not isinstance(value, str):
            raise BadEvent("session.model must be a string", param=param)
        if value != out.model:
            raise UnsupportedParameter(
                "the model is chosen when connecting (?model=) and cannot change", param=param
            )
    elif key == "audio":
        _audio(value, param, out)
    elif key == "turn_detection":
        out.set_turn_detection(value, param)
    elif key in ("input_audio_format", "output_audio_format"):
        side = key.split("_", 1)[0]
        out.set_format(side, audio_format(value, param), param)
    elif out.duplex and key in _DUPLEX_FIELDS:
        name, kinds = _DUPLEX_FIELDS[key]
        if value is not None:
            if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
                raise BadEvent(f"{param} has the wrong type", param=param)
            out.set(name, value, param)
    else:
        _field(key, value, param, out)


def parse_session(value: object, *, duplex: bool, model: str | None) -> SessionOptions:
    """Read the ``session`` object of a ``session.update``.

    Args:
        value: the decoded JSON value (must be an object).
        duplex: accept the native protocol's flat session fields (``?duplex=1``).
        model: the connection's model; ``session.model`` may only restate it.

    Returns:
        The session options: formats become ``input_audio_codec``/``output_audio_codec``
        and ``input_sample_rate`` (8000 for G.711, 24000 or 16000 for PCM).

    Raises:
        ProtocolError: ``bad_event``, ``unsupported_parameter``,
            ``unsupported_turn_detection`` or ``unsupported_audio_format``, with ``param``
            naming the field; `InvalidParameters` naming each when several are bad (the
            wire's and the session core's refusals together).
    """
    out = _Builder(duplex=duplex, model=model)
    for key, item in _object(value, "session").items():
        collect(out.problems, _top, key, item, out)
    input_format = out.formats.get("input")
    if input_format is not None:
        out.options["input_audio_codec"], out.options["input_sample_rate"] = input_format
    if "output" in out.formats:
        out.options["output_audio_codec"] = out.formats["output"][0]
    core: list[ProtocolError] = []
    options = collect(core, lambda: SessionOptions(**out.options))
    for problem in core:  # the session core names its field; the client sent a wire path
        name = (problem.param or "").removeprefix("session.")
        head, _, rest = name.partition(".")
        if head in out.origin:
            problem.param = out.origin[head] + (f".{rest}" if rest else "")
    refuse_all(out.problems + core)
    assert options is not None
    return options


_WIRE_FIELDS: dict[str, tuple[str, str]] = {  # SessionOptions field -> (GA path, beta path)
    **{name: (key, key) for key, (name, _) in _DUPLEX_FIELDS.items()},
    **{
        name: (f"audio.input.turn_detection.{key}", f"turn_detection.{key}")
        for key, name in _VAD_OPTIONS.items()
    },
    "input_audio_codec": ("audio.input.format", "input_audio_format"),
    "input_sample_rate": ("audio.input.format", "input_audio_format"),
    "output_audio_codec": ("audio.output.format", "output_audio_format"),
    "voice": ("audio.output.voice", "voice"),
    "input_transcription": ("audio.input.transcription", "input_audio_transcription"),
    "output_modalities": ("output_modalities", "modalities"),
    "max_output_tokens": ("max_output_tokens", "max_response_output_tokens"),
}


def wire_param(param: str | None, schema: str) -> str | None:
    """An error's ``param`` as a Realtime client spells it.

    The session names its own fields (``session.barge_in_ms``); a Realtime client
    sent ``session.overlap_barge_in_ms`` (or ``session.audio.input.format``, ...).
    Paths already in wire spelling, and params outside ``session``, pass unchanged.
    """
    if param is None or not param.startswith("session."):
        return param
    paths = _WIRE_FIELDS.get(param.removeprefix("session."))
    if paths is None:
        return param
    return f"session.{paths[0] if schema == 'ga' else paths[1]}"
