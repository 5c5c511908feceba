"""The ``session`` object of a Realtime ``session.update``, read into session options.

Both spellings are read: GA's nested ``audio.input/output`` with format objects
(``{"type": "audio/pcm", "rate": 24000}``) and beta's flat
``input_audio_format: "pcm16"``. Every known Realtime field has a rule: it is
used (formats, ``turn_detection``), accepted because it restates what the session already does
(``output_modalities: ["audio"]``, ``tools: []``, ``tracing: null``, ...), or
refused with a typed error naming the missing feature. Unknown fields are
refused too, as OpenAI does; nothing is dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, final

from duplex.exceptions import (
    BadEvent,
    UnsupportedAudioFormat,
    UnsupportedParameter,
    UnsupportedTurnDetection,
)
from duplex.sessions import AUDIO_CODECS, OPTION_RANGES, SessionConfig, SessionOptions

__all__ = [
    "AUDIO_FORMATS",
    "FORMAT_SAMPLE_RATES",
    "GA_FORMATS",
    "SERVER_VAD_DEFAULTS",
    "WireFormats",
    "check_audio_modalities",
    "parse_session",
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
    "instructions": "instructions are not supported yet",
    "voice": "voices are not selectable; the model has one voice",
    "temperature": "temperature is not supported",
    "truncation": "context truncation settings are not supported",
    "include": "include (input transcription logprobs) is not supported",
    "reasoning": "reasoning settings are not supported",
    "parallel_tool_calls": "tools are not supported yet",
}
_NULL_ONLY: dict[str, str] = {  # the feature is off in this server; only "off" is accepted
    "input_audio_transcription": "input audio transcription is not supported yet",
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

    def __post_init__(self) -> None:
        for key in ("input", "output"):
            if getattr(self, key) not in AUDIO_FORMATS:
                raise ValueError(f"{key} format must be one of {AUDIO_FORMATS}")

    @classmethod
    def of(cls, config: SessionConfig) -> WireFormats:
        """The formats a session config negotiated."""
        return cls(config.input_audio_codec, config.output_audio_codec)


@dataclass(slots=True)
class _Builder:
    """Collects one update's choices while the fields are read."""

    duplex: bool
    model: str | None
    formats: dict[str, str] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    turn_detection_param: str | None = None

    def set_format(self, which: str, fmt: str, param: str) -> None:
        previous = self.formats.get(which)
        if previous is not None and previous != fmt:
            raise BadEvent(f"{param} conflicts with another {which} format field", param=param)
        self.formats[which] = fmt

    def set_turn_detection(self, value: object, param: str) -> None:
        if self.turn_detection_param is not None:
            raise BadEvent(f"{param} conflicts with {self.turn_detection_param}", param=param)
        self.turn_detection_param = param
        self.options.update(turn_detection_options(value, param, duplex=self.duplex))


def _object(value: object, param: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise BadEvent(f"{param} must be an object", param=param)
    return value


def _audio_format(value: object, param: str) -> str:
    """A beta format name or a GA format object, as its beta name."""
    if isinstance(value, str):
        if value in AUDIO_FORMATS:
            return value
        raise UnsupportedAudioFormat(
            f"{param}={value!r} is not supported; use one of {AUDIO_FORMATS}", param=param
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
            f"{param}.type={kind!r} is not supported; use one of {tuple(_GA_TYPES)}",
            param=f"{param}.type",
        )
    rate = obj.get("rate")
    if rate is not None and (kind != "audio/pcm" or rate != 24_000 or isinstance(rate, bool)):
        raise UnsupportedAudioFormat(
            f"{param}.rate={rate!r}: audio/pcm is 24000 Hz; G.711 has no rate field",
            param=f"{param}.rate",
        )
    return _GA_TYPES[kind]


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


def check_audio_modalities(value: object, param: str) -> None:
    """Output modalities must include audio (a transcript always comes with it)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadEvent(f"{param} must be a list of strings", param=param)
    if "audio" not in value or not set(value) <= {"audio", "text"}:
        raise UnsupportedParameter(
            f"{param}={value!r}: only audio responses (with a transcript) are supported",
            param=param,
        )


def _restates(ok: Callable[[object], bool], message: str) -> Callable[[object, str], None]:
    """A rule that accepts only the value the session already behaves as."""

    def rule(value: object, param: str) -> None:
        if not ok(value):
            raise UnsupportedParameter(f"{param}={value!r}: {message}", param=param)

    return rule


_SIMPLE: dict[str, Callable[[object, str], None]] = {
    "output_modalities": check_audio_modalities,
    "modalities": check_audio_modalities,
    "tools": _restates(lambda v: v == [], "tools are not supported yet"),
    "tool_choice": _restates(lambda v: v in ("auto", "none"), "tools are not supported yet"),
    "max_output_tokens": _restates(lambda v: v == "inf", "output token limits are not supported"),
    "max_response_output_tokens": _restates(
        lambda v: v == "inf", "output token limits are not supported"
    ),
    "speed": _restates(lambda v: v == 1 and not isinstance(v, bool), "only speed 1.0 is supported"),
}


def _field(key: str, value: object, param: str) -> None:
    """Apply one field (``param`` is its full path) or raise naming it."""
    if key in _SIMPLE:
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
    ``output{format, voice, speed}``."""
    allowed = {
        "input": ("format", "transcription", "noise_reduction", "turn_detection"),
        "output": ("format", "voice", "speed"),
    }
    for side, side_value in _object(value, param).items():
        side_param = f"{param}.{side}"
        if side not in allowed:
            raise BadEvent(f"unknown parameter '{side_param}'", param=side_param)
        for key, item in _object(side_value, side_param).items():
            item_param = f"{side_param}.{key}"
            if key not in allowed[side]:
                raise BadEvent(f"unknown parameter '{item_param}'", param=item_param)
            if key == "format":
                out.set_format(side, _audio_format(item, item_param), item_param)
            elif key == "turn_detection":
                out.set_turn_detection(item, item_param)
            else:
                _field(_NESTED_ALIASES.get(key, key), item, item_param)


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
        out.set_format(side, _audio_format(value, param), param)
    elif out.duplex and key in _DUPLEX_FIELDS:
        name, kinds = _DUPLEX_FIELDS[key]
        if value is not None:
            if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
                raise BadEvent(f"{param} has the wrong type", param=param)
            out.options[name] = value
    else:
        _field(key, value, param)


def parse_session(value: object, *, duplex: bool, model: str | None) -> SessionOptions:
    """Read the ``session`` object of a ``session.update``.

    Args:
        value: the decoded JSON value (must be an object).
        duplex: accept the native protocol's flat session fields (``?duplex=1``).
        model: the connection's model; ``session.model`` may only restate it.

    Returns:
        The session options: formats become ``input_audio_codec``/``output_audio_codec``
        (a G.711 input format also sets ``input_sample_rate`` to 8000, PCM to 24000).

    Raises:
        ProtocolError: ``bad_event``, ``unsupported_parameter``,
            ``unsupported_turn_detection`` or ``unsupported_audio_format``,
            with ``param`` naming the field.
    """
    out = _Builder(duplex=duplex, model=model)
    for key, item in _object(value, "session").items():
        _top(key, item, out)
    input_format = out.formats.get("input")
    if input_format is not None:
        out.options["input_audio_codec"] = input_format
        out.options["input_sample_rate"] = FORMAT_SAMPLE_RATES[input_format]
    if "output" in out.formats:
        out.options["output_audio_codec"] = out.formats["output"]
    return SessionOptions(**out.options)


_WIRE_FIELDS: dict[str, tuple[str, str]] = {  # SessionOptions field -> (GA path, beta path)
    **{name: (key, key) for key, (name, _) in _DUPLEX_FIELDS.items()},
    **{
        name: (f"audio.input.turn_detection.{key}", f"turn_detection.{key}")
        for key, name in _VAD_OPTIONS.items()
    },
    "input_audio_codec": ("audio.input.format", "input_audio_format"),
    "input_sample_rate": ("audio.input.format", "input_audio_format"),
    "output_audio_codec": ("audio.output.format", "output_audio_format"),
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
