"""Session configuration, client-updatable options and model capabilities.

All three are frozen value classes checked when built, so a bad value is found
at startup (``ConfigError``) or at the offending ``session.update`` (``BadEvent``),
never in the middle of a tick.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, final

from duplex.exceptions import (
    BadEvent,
    ConfigError,
    InvalidParameters,
    ProtocolError,
    refuse_all,
)

from ._checks import (
    DURATION_MS,
    DURATION_S,
    FRACTION,
    POSITIVE,
    POSITIVE_MS,
    Range,
)
from ._generation import (
    INF,
    FunctionTool,
    OutputModality,
    ResponseOptions,
    ResponseSettings,
    Transcription,
    check_generation,
)

__all__ = [
    "AUDIO_CODECS",
    "AUDIO_INPUT_FORMATS",
    "MODEL_SAMPLE_RATE",
    "OPTION_RANGES",
    "OVERLAP_POLICIES",
    "PLAYBACK_COMMIT_POLICIES",
    "SAMPLING_RANGES",
    "SESSION_VAD_MODES",
    "SUPPORTED_SAMPLE_RATES",
    "TURN_DETECTION_TYPES",
    "TURN_POLICIES",
    "VAD_MODES",
    "Capabilities",
    "OverlapPolicy",
    "PlaybackCommitPolicy",
    "SessionConfig",
    "SessionOptions",
    "SessionPrompt",
    "SessionSampling",
    "TurnDetection",
    "VadMode",
]

MODEL_SAMPLE_RATE = 24_000
SUPPORTED_SAMPLE_RATES: tuple[int, ...] = (8_000, 16_000, 24_000, 48_000)
AUDIO_INPUT_FORMATS: tuple[str, ...] = ("pcm16", "float32")
AUDIO_CODECS: tuple[str, ...] = ("pcm16", "g711_ulaw", "g711_alaw")
"""Wire audio encodings a session may negotiate (``input_audio_codec``, ``output_audio_codec``)."""

# The modes below are string-valued enums: `SessionConfig` turns each option's wire name
# into its member once, when it is built; a member equals, prints and serialises as that
# name, so the wire keeps its strings. `SessionOptions` (what a client sends) keeps the
# names, checked against the same values.


class OverlapPolicy(enum.StrEnum):
    """What a duplex session does when the user speaks over a response (``overlap_policy``)."""

    MODEL = "model"
    """The model decides: its frames say whether it keeps talking."""
    BARGE_IN_ON_SPEECH = "barge_in_on_speech"
    """Speech longer than ``barge_in_ms`` interrupts; shorter is a backchannel."""
    IGNORE = "ignore"
    """Never interrupt."""


class PlaybackCommitPolicy(enum.StrEnum):
    """Which assistant audio enters the history (``playback_commit_policy``)."""

    ACK_ONLY = "ack_only"
    """Only what the client acknowledged as played (``playback.ack``)."""
    COMMIT_ALL_ON_DONE = "commit_all_on_done"
    """All of a finished response (clients that never acknowledge)."""


class VadMode(enum.StrEnum):
    """Which VAD backs ``server_vad`` (``vad``; fixed for a session's life)."""

    ENERGY = "energy"
    """The built-in `EnergyVad`, inside the session core."""
    EXTERNAL = "external"
    """A VAD outside the machine sends `SpeechStarted`/`SpeechStopped` (tests)."""
    SILERO = "silero"
    """The server's shared batched silero VAD, through the session actor's VAD link (to the
    machine, as ``EXTERNAL``)."""


class TurnDetection(enum.StrEnum):
    """Whether the session detects turns (Realtime ``turn_detection.type``)."""

    NONE = "none"
    """No VAD, no speech events; commits are the client's."""
    SERVER_VAD = "server_vad"
    """The session's VAD (`VadMode`) finds speech and, as configured, ends turns."""


OVERLAP_POLICIES: tuple[str, ...] = tuple(policy.value for policy in OverlapPolicy)
PLAYBACK_COMMIT_POLICIES: tuple[str, ...] = tuple(policy.value for policy in PlaybackCommitPolicy)
VAD_MODES: tuple[str, ...] = tuple(mode.value for mode in VadMode)
SESSION_VAD_MODES: tuple[str, ...] = (VadMode.ENERGY.value, VadMode.SILERO.value)
"""The VADs a session may be opened with (``SessionOptions.vad``); ``external`` is for tests."""


class TurnPolicy(enum.StrEnum):
    """Who decides when the model speaks (``SessionConfig.turn_policy``).

    String-valued: a member equals, prints and serialises as its wire name.
    """

    DUPLEX = "duplex"
    """The model decides: its frames open responses; barge-in follows ``overlap_policy``."""
    TURN_BASED = "turn_based"
    """OpenAI's turn-based Realtime: a response is requested, the turn responder speaks it."""


TURN_POLICIES: tuple[str, ...] = tuple(policy.value for policy in TurnPolicy)
TURN_DETECTION_TYPES: tuple[str, ...] = tuple(kind.value for kind in TurnDetection)

_MIB = 1024 * 1024

_GENERATION = (
    "instructions",
    "voice",
    "output_modalities",
    "temperature",
    "max_output_tokens",
    "tools",
    "tool_choice",
)
"""The generation fields `check_generation` checks (in `SessionConfig` and `SessionOptions`)."""

_MODES: dict[str, type[enum.StrEnum]] = {
    "overlap_policy": OverlapPolicy,
    "playback_commit_policy": PlaybackCommitPolicy,
    "vad": VadMode,
    "turn_policy": TurnPolicy,
    "turn_detection": TurnDetection,
    "output_modalities": OutputModality,
}
"""`SessionConfig`'s mode fields and their enums."""

OPTION_RANGES: dict[str, Range] = {
    "short_ack_ms": POSITIVE_MS,
    "barge_in_ms": POSITIVE_MS,
    "vad_hangover_ms": POSITIVE_MS,
    "false_interruption_timeout_s": DURATION_S,
    "vad_prefix_padding_ms": DURATION_MS,
    "vad_idle_timeout_ms": DURATION_MS,
    "vad_prepare_ms": DURATION_MS,
    "vad_threshold": FRACTION,
}
"""The range of each numeric `SessionOptions` field (at most a day for durations);
`SessionConfig` holds the same fields to the same ranges, so no accepted value can
overflow a float or a timer later."""


def _config_error(key: str, rule: str) -> ConfigError:
    return ConfigError(f"{key}: {rule}", key=key)


def _ranged(key: str, value: object, rule: Range) -> None:
    if not rule.accepts(value):
        raise _config_error(key, f"must be {rule.describe()}, got {value!r}")


def _choice(key: str, value: object, choices: tuple[Any, ...]) -> None:
    if value not in choices:
        raise _config_error(key, f"must be one of {', '.join(map(str, choices))}; got {value!r}")


@final
@dataclass(frozen=True, slots=True)
class SessionPrompt:
    """A session's prompt (``session.prompt``): a system text and a voice name.

    The hub hands it to the engine as a ``SlotPrompt``; this core module imports
    no model code.
    """

    text: str | None = field(default=None, repr=False)
    voice: str | None = None

    def __post_init__(self) -> None:
        for key in ("text", "voice"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, str):
                param = f"session.prompt.{key}"
                raise BadEvent(f"{param} must be a string", param=param)


SAMPLING_RANGES: dict[str, Range] = {
    "text_temperature": Range(0, 100, integer=False),
    "text_top_k": Range(0, 1_000_000),
    "audio_temperature": Range(0, 100, integer=False),
    "audio_top_k": Range(0, 1_000_000),
    "text_seed": Range(-(2**63), 2**64 - 1),
    "audio_seed": Range(-(2**63), 2**64 - 1),
    "repetition_penalty": Range(0, 100, integer=False, open_low=True),
    "repetition_penalty_context": Range(0, 1_000_000),
    "pad_mult": Range(-100, 100, integer=False),
}
"""The range of each `SessionSampling` field: temperatures 0 (greedy) to 100, top-k 0
(keep all) to a million, seeds any 64-bit value (signed or not, as ``torch.manual_seed``
takes), a repetition penalty above 0; so nothing a client sends overflows a tensor."""


@final
@dataclass(frozen=True, slots=True)
class SessionSampling:
    """How a session asks to be sampled (``session.sampling``); ``None``: the model's own.

    Fixed when the session opens, like its prompt: the engine applies it when the
    slot is taken. Each model applies what it can (docs/protocol/moshi.md has the
    table); a value in range is never refused for a model that ignores it. The hub
    hands it to the engine inside the ``SlotPrompt``.

    Raises:
        BadEvent: a value is of the wrong type or out of `SAMPLING_RANGES`; ``param``
            is ``session.sampling.<field>``.
    """

    text_temperature: float | None = None
    text_top_k: int | None = None
    audio_temperature: float | None = None
    audio_top_k: int | None = None
    text_seed: int | None = None
    audio_seed: int | None = None
    repetition_penalty: float | None = None
    repetition_penalty_context: int | None = None
    pad_mult: float | None = None

    def __post_init__(self) -> None:
        for key, rule in SAMPLING_RANGES.items():
            value = getattr(self, key)
            if value is not None:
                rule.read(value, f"session.sampling.{key}")

    @property
    def given(self) -> tuple[str, ...]:
        """The fields that are set."""
        return tuple(key for key in SAMPLING_RANGES if getattr(self, key) is not None)


@final
@dataclass(frozen=True, slots=True)
class SessionConfig:
    """Per-session policy and limits.

    ``barge_in_ms`` defaults to 1000 ms. It must exceed ``short_ack_ms`` (700)
    so a backchannel ("mm-hm", "right") never interrupts, with room for VAD
    jitter of a few 80 ms frames; and it should cut a reply within about a
    second, vllm-omni's ``target_barge_in_latency_ms``. (vllm-omni's own 1200 ms
    default is tuned for 1 s input chunks; our model frames are 80 ms.)

    Turn taking. ``turn_policy="duplex"``: the model decides when to speak (its
    frames open responses) and barge-in follows ``overlap_policy``.
    ``"turn_based"``: OpenAI's turn-based Realtime; model frames never open a
    response, a response is requested (``response.create``, or a VAD stop with
    ``vad_create_response``) and the built-in turn responder speaks it
    (``_responder``), and ``vad_interrupt_response`` cancels it on speech start.

    Turn detection (Realtime ``turn_detection``): ``"none"`` runs no VAD (no
    speech events; commits are manual); ``"server_vad"`` runs the session's VAD
    (``vad="energy"``: the built-in `EnergyVad`; ``"external"``: a VAD actor
    sends `SpeechStarted`/`SpeechStopped`; ``"silero"``: the server's shared
    batched silero VAD, fed by the session actor (``duplex.runtime``'s VAD link); the machine
    treats it as ``"external"``). Its knobs: ``vad_threshold`` (0..1;
    the energy VAD maps it to an RMS threshold, ``vad_threshold_rms`` at 0.5,
    x10 per +0.5), ``vad_prefix_padding_ms`` (speech_started's
    ``audio_start_ms`` is the detected start minus this, at least 0, and the
    committed user audio starts there), ``vad_hangover_ms`` (Realtime's
    ``silence_duration_ms``), ``vad_create_response`` (a speech stop commits the
    turn and requests a response), ``vad_interrupt_response`` (turn-based: a
    speech start cancels the active response, reason ``turn_detected``; duplex
    requires it true, since barge-in there follows ``overlap_policy``) and
    ``vad_idle_timeout_ms`` (0: off; else that much input audio without speech
    after the last turn or response commits the silence and fires
    ``input_audio_buffer.timeout_triggered``), ``vad_prepare_ms`` (0: off; agent
    sessions: a pause this long, shorter than ``vad_hangover_ms``, has the reply
    prepared ahead of the commit and released only if the commit follows).

    Wire audio: ``input_audio_codec`` and ``output_audio_codec`` (`AUDIO_CODECS`)
    are the encodings a client negotiated with ``session.update`` (the Realtime
    projection's G.711 formats; the native protocol names its format per append).
    They are session facts like any option, so a resumed socket's projection
    learns them from ``session.resumed``. G.711 input is 8 kHz (``input_sample_rate``).

    ``playback_commit_policy`` defaults to ``commit_all_on_done`` because a
    client that never sends ``playback.ack`` (a stock Realtime SDK) would
    otherwise keep no assistant turns at all; ack-aware clients choose
    ``ack_only``.

    ``prompt``: the `SessionPrompt` (text, voice) replayed into the session's engine
    slot before it goes live (prompt-capable models only, ``supports_prompts``).
    It is fixed when the session opens: a ``session.update`` may repeat it but not
    change it, since the replay already shaped the model's state.

    Generation (``_generation``): ``instructions`` (the system prompt of a model that
    takes one), ``voice`` (an OpenAI voice name, `VOICES`), ``input_transcription``,
    ``output_modalities`` (audio with a transcript, or text only), ``temperature``,
    ``max_output_tokens`` (``None``: no limit; each model frame with text counts as one
    token), ``tools`` and ``tool_choice``. A response runs with `response_settings`: these
    values with its ``response.create``'s overrides.
    ``sampling``: the `SessionSampling` the engine applies to the session's slot; fixed
    when the session opens, as ``prompt`` is.

    ``announce_ready``: send `SessionReady` once the engine slot takes input (its
    prompt replayed). Set by a wire protocol whose handshake waits for it (Moshi's
    ``/api/chat``); no JSON protocol exposes it.

    Raises:
        ConfigError: a value breaks its rule; the message names the key.
    """

    overlap_policy: OverlapPolicy = OverlapPolicy.BARGE_IN_ON_SPEECH
    short_ack_ms: int = 700
    barge_in_ms: int = 1000
    false_interruption_enabled: bool = True
    false_interruption_timeout_s: float = 2.0
    playback_commit_policy: PlaybackCommitPolicy = PlaybackCommitPolicy.COMMIT_ALL_ON_DONE
    max_pending_input_bytes: int = 16 * _MIB
    max_pending_turns: int = 4
    journal_ttl_s: float = 60.0
    journal_max_bytes: int = 8 * _MIB
    idle_ttl_s: float = 300.0
    disconnect_grace_s: float = 30.0
    input_sample_rate: int = MODEL_SAMPLE_RATE
    output_sample_rate: int = MODEL_SAMPLE_RATE
    model_sample_rate: int = MODEL_SAMPLE_RATE
    vad: VadMode = VadMode.ENERGY
    vad_threshold_rms: float = 0.003
    vad_hangover_ms: int = 300
    vad_min_speech_ms: int = 60
    turn_policy: TurnPolicy = TurnPolicy.DUPLEX
    turn_detection: TurnDetection = TurnDetection.SERVER_VAD
    vad_threshold: float = 0.5
    vad_prefix_padding_ms: int = 0
    vad_create_response: bool = False
    vad_interrupt_response: bool = True
    vad_idle_timeout_ms: int = 0
    vad_prepare_ms: int = 0
    max_turn_audio_ms: int = 120_000
    max_held_frames: int = 64
    video_lane_size: int = 8
    max_history_items: int = 256
    max_tracked_responses: int = 16
    input_audio_codec: str = "pcm16"
    output_audio_codec: str = "pcm16"
    prompt: SessionPrompt | None = None
    sampling: SessionSampling | None = None
    announce_ready: bool = False
    instructions: str = field(default="", repr=False)
    voice: str = "alloy"
    input_transcription: Transcription | None = None
    output_modalities: OutputModality = OutputModality.AUDIO
    temperature: float = 0.8
    max_output_tokens: int | None = None
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: str = "auto"

    def __post_init__(self) -> None:
        problems: list[ProtocolError] = []
        check_generation({k: getattr(self, k) for k in _GENERATION}, "", problems)
        if problems:
            raise _config_error(str(problems[0].param), problems[0].message)
        if self.input_transcription is not None and not isinstance(
            self.input_transcription, Transcription
        ):
            raise _config_error("input_transcription", "must be a Transcription")
        for key, mode in _MODES.items():  # the wire names become members, once, here
            _choice(key, getattr(self, key), tuple(m.value for m in mode))
            object.__setattr__(self, key, mode(getattr(self, key)))
        _choice("input_audio_codec", self.input_audio_codec, AUDIO_CODECS)
        _choice("output_audio_codec", self.output_audio_codec, AUDIO_CODECS)
        if self.input_audio_codec != "pcm16" and self.input_sample_rate != 8_000:
            raise _config_error("input_sample_rate", "must be 8000 for G.711 input")
        for key, rule in OPTION_RANGES.items():
            _ranged(key, getattr(self, key), rule)
        if self.turn_policy == TurnPolicy.DUPLEX and not self.vad_interrupt_response:
            raise _config_error(
                "vad_interrupt_response",
                "must be true when turn_policy is duplex (barge-in follows overlap_policy; "
                "use overlap_policy=ignore to never interrupt)",
            )
        _choice("input_sample_rate", self.input_sample_rate, SUPPORTED_SAMPLE_RATES)
        _choice("model_sample_rate", self.model_sample_rate, SUPPORTED_SAMPLE_RATES)
        if self.output_sample_rate != self.model_sample_rate:
            raise _config_error(
                "output_sample_rate", "must equal model_sample_rate (no output resampling)"
            )
        for key in (
            "max_pending_input_bytes",
            "max_pending_turns",
            "journal_ttl_s",
            "journal_max_bytes",
            "idle_ttl_s",
            "disconnect_grace_s",
            "vad_threshold_rms",
            "vad_min_speech_ms",
            "max_held_frames",
            "video_lane_size",
            "max_history_items",
            "max_tracked_responses",
            "max_turn_audio_ms",
        ):
            _ranged(key, getattr(self, key), POSITIVE)
        if self.barge_in_ms <= self.short_ack_ms:
            raise _config_error(
                "barge_in_ms",
                f"must be greater than short_ack_ms ({self.short_ack_ms}) "
                "so a backchannel never interrupts",
            )

    @property
    def energy_threshold_rms(self) -> float:
        """The energy VAD's RMS threshold for ``vad_threshold``: ``vad_threshold_rms`` at
        0.5, ten times higher per +0.5 (0.3 mRMS at 0, 30 mRMS at 1 with the defaults)."""
        return self.vad_threshold_rms * 10.0 ** (2.0 * (self.vad_threshold - 0.5))

    @property
    def vad_enabled(self) -> bool:
        """Turn detection is on (``server_vad``)."""
        return self.turn_detection is not TurnDetection.NONE

    def updated(self, options: SessionOptions) -> SessionConfig:
        """A copy with the options that are set; raises ``ConfigError`` if the result is bad."""
        changes = {
            f.name: getattr(options, f.name)
            for f in dataclasses.fields(options)
            if getattr(options, f.name) is not None
        }
        if changes.get("max_output_tokens") == INF:
            changes["max_output_tokens"] = None
        transcription = changes.get("input_transcription")
        if isinstance(transcription, Transcription) and not transcription.enabled:
            changes["input_transcription"] = None  # off
        return dataclasses.replace(self, **changes)

    def response_settings(self, options: ResponseOptions | None = None) -> ResponseSettings:
        """How a response runs: this config's generation values, ``options`` overriding."""
        over = options or ResponseOptions()

        def pick(key: str) -> Any:
            value = getattr(over, key)
            return getattr(self, key) if value is None else value

        tokens = pick("max_output_tokens")
        tools = pick("tools")
        return ResponseSettings(
            output_modalities=OutputModality(pick("output_modalities")),
            conversation=over.conversation,
            voice=pick("voice"),
            temperature=float(pick("temperature")),
            max_output_tokens=None if tokens == INF else tokens,
            instructions=pick("instructions"),
            tool_choice=pick("tool_choice"),
            tool_names=tuple(tool.name for tool in tools),
            metadata=over.metadata,
        )

    def apply_update(self, options: SessionOptions) -> SessionConfig:
        """The config a ``session.update`` with ``options`` makes (what the session adopts).

        Pure, so a wire projection can tell whether the session will accept an update
        before the session answers it.

        Raises:
            BadEvent: ``vad`` changes (it is fixed for the whole session) or the result
                breaks a rule; ``param`` is ``session.<field>``.
        """
        vad = options.vad
        if vad is not None and vad != self.vad:  # the VAD stream is held from the start
            raise BadEvent(  # the wire name, not the member's repr
                f"session.vad is {self.vad.value!r} for the whole session", param="session.vad"
            )
        if options.prompt is not None and options.prompt != self.prompt:
            raise BadEvent(  # the replay ran when the slot went live
                "session.prompt is fixed when the session is created", param="session.prompt"
            )
        if options.sampling is not None and options.sampling != self.sampling:
            raise BadEvent(  # the engine applied it when the slot was taken
                "session.sampling is fixed when the session is created", param="session.sampling"
            )
        return self.accepting(options)

    def accepting(self, options: SessionOptions) -> SessionConfig:
        """`updated`, refused as a client's error that names the field (``bad_event``)."""
        try:
            return self.updated(options)
        except ConfigError as exc:
            param = f"session.{exc.key}" if exc.key else "session"
            raise BadEvent(str(exc), param=param) from exc


@final
@dataclass(frozen=True, slots=True)
class SessionOptions:
    """The subset of `SessionConfig` a client may set (``session.create``/``session.update``).

    ``None`` means "leave as is". Each value is checked on its own here (so the
    wire parser can name the bad ``param``); cross-field rules are checked by
    `SessionConfig.updated`.

    Raises:
        BadEvent: a value has the wrong type or range; ``param`` names it.
    """

    overlap_policy: str | None = None
    short_ack_ms: int | None = None
    barge_in_ms: int | None = None
    false_interruption_enabled: bool | None = None
    false_interruption_timeout_s: float | None = None
    playback_commit_policy: str | None = None
    input_sample_rate: int | None = None
    turn_policy: str | None = None
    turn_detection: str | None = None
    vad_threshold: float | None = None
    vad_prefix_padding_ms: int | None = None
    vad_hangover_ms: int | None = None
    vad_create_response: bool | None = None
    vad_interrupt_response: bool | None = None
    vad_idle_timeout_ms: int | None = None
    vad_prepare_ms: int | None = None
    input_audio_codec: str | None = None
    output_audio_codec: str | None = None
    vad: str | None = None
    """Which VAD backs ``server_vad`` (``SESSION_VAD_MODES``). Set when a session opens
    (the Realtime projection asks for ``silero``); a ``session.update`` may not change it.
    No wire protocol exposes it."""
    prompt: SessionPrompt | None = None
    """The session's prompt (``session.create`` only; see `SessionConfig`)."""
    sampling: SessionSampling | None = None
    """The session's sampling (when it opens only; see `SessionConfig`). Set by the Moshi
    projection from its query; no JSON protocol exposes it yet."""
    announce_ready: bool | None = None
    """Send ``SessionReady`` (see `SessionConfig`); set by a projection, no wire exposes it."""
    instructions: str | None = field(default=None, repr=False)
    voice: str | None = None
    input_transcription: Transcription | None = None
    """``Transcription()`` (no model) turns transcription off; ``None`` leaves it."""
    output_modalities: str | None = None
    temperature: float | None = None
    max_output_tokens: int | str | None = None
    """An integer, or ``"inf"`` (no limit)."""
    tools: tuple[FunctionTool, ...] | None = None
    tool_choice: str | None = None

    def __post_init__(self) -> None:
        """Check every field, then raise once naming every bad one (`refuse_all`)."""
        problems: list[ProtocolError] = []
        for check in (self._check_modes, self._check_ranges, self._check_types):
            try:
                check()
            except InvalidParameters as exc:
                problems.extend(exc.problems)
            except ProtocolError as exc:
                problems.append(exc)
        if self.input_transcription is not None and not isinstance(
            self.input_transcription, Transcription
        ):
            problems.append(
                BadEvent(
                    "session.input_transcription must be an object",
                    param="session.input_transcription",
                )
            )
        check_generation({k: getattr(self, k) for k in _GENERATION}, "session.", problems)
        refuse_all(problems)

    def _check_modes(self) -> None:
        problems: list[ProtocolError] = []
        checks: tuple[tuple[str, tuple[Any, ...] | None], ...] = (
            ("overlap_policy", OVERLAP_POLICIES),
            ("playback_commit_policy", PLAYBACK_COMMIT_POLICIES),
            ("input_sample_rate", SUPPORTED_SAMPLE_RATES),
            ("turn_policy", TURN_POLICIES),
            ("turn_detection", TURN_DETECTION_TYPES),
            ("vad", SESSION_VAD_MODES),
            ("input_audio_codec", AUDIO_CODECS),
            ("output_audio_codec", AUDIO_CODECS),
        )
        for key, choices in checks:
            value = getattr(self, key)
            if value is not None and choices is not None and value not in choices:
                problems.append(
                    BadEvent(f"session.{key} must be one of {choices}", param=f"session.{key}")
                )
        refuse_all(problems)

    def _check_ranges(self) -> None:
        problems: list[ProtocolError] = []
        for key, rule in OPTION_RANGES.items():
            value = getattr(self, key)
            if value is not None:
                try:
                    rule.read(value, f"session.{key}")
                except ProtocolError as exc:
                    problems.append(exc)
        refuse_all(problems)

    def _check_types(self) -> None:
        problems: list[ProtocolError] = []
        if self.prompt is not None and not isinstance(self.prompt, SessionPrompt):
            problems.append(BadEvent("session.prompt must be an object", param="session.prompt"))
        if self.sampling is not None and not isinstance(self.sampling, SessionSampling):
            problems.append(
                BadEvent("session.sampling must be an object", param="session.sampling")
            )
        for key in (
            "false_interruption_enabled",
            "vad_create_response",
            "vad_interrupt_response",
            "announce_ready",
        ):
            value = getattr(self, key)
            if value is not None and not isinstance(value, bool):
                problems.append(
                    BadEvent(f"session.{key} must be a boolean", param=f"session.{key}")
                )
        refuse_all(problems)


@final
@dataclass(frozen=True, slots=True)
class Capabilities:
    """What the model behind a session can do; sent in ``session.created``.

    Field names follow vllm-omni's ``DuplexCapabilities`` so its clients read them.
    """

    supports_barge_in: bool = True
    supports_playback_ack: bool = True
    supports_multi_session: bool = True
    supports_session_resume: bool = True
    chunk_period_ms: int = 80
    session_admission_mode: str = "engine_managed"
    input_audio_formats: tuple[str, ...] = AUDIO_INPUT_FORMATS
    input_sample_rates: tuple[int, ...] = SUPPORTED_SAMPLE_RATES
    output_audio_formats: tuple[str, ...] = ("pcm16",)
    output_sample_rate: int = MODEL_SAMPLE_RATE
    supports_video_input: bool = False
    supports_model_native_turn_policy: bool = False
    supports_prompts: bool = False
    """``session.prompt`` is accepted (PersonaPlex)."""
    agent_cascade: bool = False
    """Turn-based responses come from the server's agent cascade (ASR, a reply model, TTS:
    ``duplex.runtime``'s agent link), not from the built-in replay; user audio is
    transcribed, and speech over a reply follows ``overlap_policy`` (a backchannel does
    not interrupt)."""
    reply_tools: bool = False
    """The model that answers turn-based responses calls the session's ``tools`` (the
    agent's reply model is an LLM: ``--llm``). Without it ``tools`` are taken and never
    called, and a ``session.update`` that sets them is answered with a
    ``tools_not_supported`` warning."""
    reply_instructions: bool = False
    """The model that answers follows the session's ``instructions`` (an LLM as the
    agent's reply model); without it they are taken and have no effect on the answer."""

    def __post_init__(self) -> None:
        _ranged("chunk_period_ms", self.chunk_period_ms, POSITIVE)
        _choice(
            "session_admission_mode",
            self.session_admission_mode,
            ("engine_managed", "serving_managed"),
        )

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form (tuples become lists), plus the derived ``implementation_level``."""
        out: dict[str, object] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        out["implementation_level"] = (
            "model_native_duplex" if self.supports_model_native_turn_policy else "turn_based_duplex"
        )
        return out
