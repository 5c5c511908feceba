"""Session configuration, client-updatable options and model capabilities.

All three are frozen value classes checked when built, so a bad value is found
at startup (``ConfigError``) or at the offending ``session.update`` (``BadEvent``),
never in the middle of a tick.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, final

from duplex.exceptions import BadEvent, ConfigError

__all__ = [
    "AUDIO_INPUT_FORMATS",
    "MODEL_SAMPLE_RATE",
    "OVERLAP_POLICIES",
    "PLAYBACK_COMMIT_POLICIES",
    "SUPPORTED_SAMPLE_RATES",
    "VAD_MODES",
    "Capabilities",
    "SessionConfig",
    "SessionOptions",
]

MODEL_SAMPLE_RATE = 24_000
SUPPORTED_SAMPLE_RATES: tuple[int, ...] = (8_000, 16_000, 24_000, 48_000)
OVERLAP_POLICIES: tuple[str, ...] = ("model", "barge_in_on_speech", "ignore")
PLAYBACK_COMMIT_POLICIES: tuple[str, ...] = ("ack_only", "commit_all_on_done")
AUDIO_INPUT_FORMATS: tuple[str, ...] = ("pcm16", "float32")
VAD_MODES: tuple[str, ...] = ("energy", "external")

_MIB = 1024 * 1024


def _config_error(key: str, rule: str) -> ConfigError:
    err = ConfigError(f"{key}: {rule}")
    err.key = key  # type: ignore[attr-defined]  # lets the session name the param
    return err


def _positive(key: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise _config_error(key, f"must be a positive finite number, got {value!r}")


def _choice(key: str, value: object, choices: tuple[Any, ...]) -> None:
    if value not in choices:
        raise _config_error(key, f"must be one of {', '.join(map(str, choices))}; got {value!r}")


@final
@dataclass(frozen=True, slots=True)
class SessionConfig:
    """Per-session policy and limits.

    ``barge_in_ms`` defaults to 1000 ms. It must exceed ``short_ack_ms`` (700)
    so a backchannel ("mm-hm", "right") never interrupts, with room for VAD
    jitter of a few 80 ms frames; and it should cut a reply within about a
    second, vllm-omni's ``target_barge_in_latency_ms``. (vllm-omni's own 1200 ms
    default is tuned for 1 s input chunks; our model frames are 80 ms.)

    ``playback_commit_policy`` defaults to ``commit_all_on_done`` because a
    client that never sends ``playback.ack`` (a stock Realtime SDK) would
    otherwise keep no assistant turns at all; ack-aware clients choose
    ``ack_only``.

    Raises:
        ConfigError: a value breaks its rule; the message names the key.
    """

    overlap_policy: str = "barge_in_on_speech"
    short_ack_ms: int = 700
    barge_in_ms: int = 1000
    false_interruption_enabled: bool = True
    false_interruption_timeout_s: float = 2.0
    playback_commit_policy: str = "commit_all_on_done"
    max_pending_input_bytes: int = 16 * _MIB
    max_pending_turns: int = 4
    journal_ttl_s: float = 60.0
    journal_max_bytes: int = 8 * _MIB
    idle_ttl_s: float = 300.0
    disconnect_grace_s: float = 30.0
    input_sample_rate: int = MODEL_SAMPLE_RATE
    output_sample_rate: int = MODEL_SAMPLE_RATE
    model_sample_rate: int = MODEL_SAMPLE_RATE
    vad: str = "energy"
    vad_threshold_rms: float = 0.003
    vad_hangover_ms: int = 300
    vad_min_speech_ms: int = 60
    max_held_frames: int = 64
    video_lane_size: int = 8
    max_history_items: int = 256
    max_tracked_responses: int = 16

    def __post_init__(self) -> None:
        _choice("overlap_policy", self.overlap_policy, OVERLAP_POLICIES)
        _choice("playback_commit_policy", self.playback_commit_policy, PLAYBACK_COMMIT_POLICIES)
        _choice("vad", self.vad, VAD_MODES)
        _choice("input_sample_rate", self.input_sample_rate, SUPPORTED_SAMPLE_RATES)
        _choice("model_sample_rate", self.model_sample_rate, SUPPORTED_SAMPLE_RATES)
        if self.output_sample_rate != self.model_sample_rate:
            raise _config_error(
                "output_sample_rate", "must equal model_sample_rate (no output resampling)"
            )
        for key in (
            "short_ack_ms",
            "barge_in_ms",
            "false_interruption_timeout_s",
            "max_pending_input_bytes",
            "max_pending_turns",
            "journal_ttl_s",
            "journal_max_bytes",
            "idle_ttl_s",
            "disconnect_grace_s",
            "vad_threshold_rms",
            "vad_hangover_ms",
            "vad_min_speech_ms",
            "max_held_frames",
            "video_lane_size",
            "max_history_items",
            "max_tracked_responses",
        ):
            _positive(key, getattr(self, key))
        if self.barge_in_ms <= self.short_ack_ms:
            raise _config_error(
                "barge_in_ms",
                f"must be greater than short_ack_ms ({self.short_ack_ms}) "
                "so a backchannel never interrupts",
            )

    def updated(self, options: SessionOptions) -> SessionConfig:
        """A copy with the options that are set; raises ``ConfigError`` if the result is bad."""
        changes = {
            f.name: getattr(options, f.name)
            for f in dataclasses.fields(options)
            if getattr(options, f.name) is not None
        }
        return dataclasses.replace(self, **changes)


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

    def __post_init__(self) -> None:
        checks: tuple[tuple[str, tuple[Any, ...] | None], ...] = (
            ("overlap_policy", OVERLAP_POLICIES),
            ("playback_commit_policy", PLAYBACK_COMMIT_POLICIES),
            ("input_sample_rate", SUPPORTED_SAMPLE_RATES),
        )
        for key, choices in checks:
            value = getattr(self, key)
            if value is not None and choices is not None and value not in choices:
                raise BadEvent(f"session.{key} must be one of {choices}", param=f"session.{key}")
        for key in ("short_ack_ms", "barge_in_ms"):
            value = getattr(self, key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value <= 0
            ):
                raise BadEvent(f"session.{key} must be a positive integer", param=f"session.{key}")
        timeout = self.false_interruption_timeout_s
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout < math.inf
        ):
            raise BadEvent(
                "session.false_interruption_timeout_s must be a positive number",
                param="session.false_interruption_timeout_s",
            )
        enabled = self.false_interruption_enabled
        if enabled is not None and not isinstance(enabled, bool):
            raise BadEvent(
                "session.false_interruption_enabled must be a boolean",
                param="session.false_interruption_enabled",
            )


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

    def __post_init__(self) -> None:
        _positive("chunk_period_ms", self.chunk_period_ms)
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
