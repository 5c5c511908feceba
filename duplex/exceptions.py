"""Every error duplex raises or sends, under one root.

::

    DuplexError
    ├── ConfigError (ValueError)            bad configuration, found at startup
    ├── ActorError                          the actor runtime
    │   ├── AskTimeout (TimeoutError)       no reply within the ask's timeout
    │   ├── MailboxFull                     a ``reject`` lane refused a message
    │   ├── ActorStopped                    the target's mailbox is closed
    │   └── RestartIntensityExceeded        a supervisor gave up; escalates to its parent
    ├── ModelError                          engines and model runners (in-process, not wire)
    │   ├── UnknownModel (LookupError)      no model registered under that name
    │   ├── SlotReleased                    a slot handle used after its release
    │   ├── PromptUnsupported (ValueError)  a slot prompt the model cannot take
    │   ├── RunnerContractError             a runner's output broke the ModelRunner contract
    │   ├── RequestError                    request-batched models (``models/_requests.py``)
    │   │   ├── RequestFailed               the runner raised or broke its contract for a request
    │   │   │   └── EngineUnavailable       its engine process exited or is restarting
    │   │   ├── RequestsOverloaded          the request engine's queue is full
    │   │   └── RequestCancelled            every request of a running batch was withdrawn
    │   └── SpeechError                     text to speech (``models/tts``)
    │       └── UnknownVoice (ValueError)   a voice the TTS engine does not have
    └── ProtocolError                       a client event the session refuses
        ├── one subclass per wire error code (``code`` / ``error_type`` class attributes)
        └── InvalidParameters               several fields refused at once (``problems``)

Wire errors become ``{"type": "error", "error": {type, code, message, event_id, param}}``;
``error_type`` is the Realtime error family the code belongs to.
"""

from __future__ import annotations

from typing import ClassVar


class DuplexError(Exception):
    """Root of every duplex exception."""


class ConfigError(DuplexError, ValueError):
    """A configuration value is invalid; the message names the key and the rule.

    ``key``: the field, when one is to blame (a session names it as the event's ``param``).
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class ActorError(DuplexError):
    """Errors of the actor runtime."""


class AskTimeout(ActorError, TimeoutError):
    """``ActorRef.ask`` got no reply in time; a late reply is dropped and counted."""


class MailboxFull(ActorError):
    """A lane with the ``reject`` overflow policy is full."""


class ActorStopped(ActorError):
    """The actor's mailbox is closed: it stopped, or never started."""


class RestartIntensityExceeded(ActorError):
    """A supervisor saw more restarts than its intensity allows and escalates."""


class ProtocolError(DuplexError):
    """A client event that is refused; the session stays usable.

    Subclasses set ``code``; ``error_type`` follows from the code's family;
    ``status_hint`` is the HTTP status of a request refused with it (as h11's
    ``error_status_hint``; ``duplex.refusals.Refusal.of`` reads it).
    """

    code: ClassVar[str] = "bad_event"
    error_type: ClassVar[str] = "invalid_request_error"
    status_hint: ClassVar[int] = 400

    def __init__(self, message: str, *, event_id: str | None = None, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.event_id = event_id
        self.param = param
        self.event_type: str | None = None
        """The refused frame's ``type``, when readable (set by the wire parser; for logs)."""
        self.close: tuple[int, str] | None = None
        """Set by a wire projection that cannot go on after this error (Moshi's ``/api/chat``
        has no way to resynchronise an Ogg stream): the connection sends the error, then
        closes with this WebSocket code and reason."""


def _code(
    name: str, code: str, error_type: str = "invalid_request_error", status_hint: int = 400
) -> type[ProtocolError]:
    attributes = {"code": code, "error_type": error_type, "status_hint": status_hint}
    cls = type(name, (ProtocolError,), {**attributes, "__doc__": code})
    cls.__module__ = __name__
    return cls


InvalidJson = _code("InvalidJson", "invalid_json")
UnknownEvent = _code("UnknownEvent", "unknown_event")
BadEvent = _code("BadEvent", "bad_event")
BadAudio = _code("BadAudio", "bad_audio")
EventTooLarge = _code("EventTooLarge", "event_too_large")
BinaryFrameUnsupported = _code("BinaryFrameUnsupported", "binary_frame_unsupported")
UnsupportedAudioFormat = _code("UnsupportedAudioFormat", "unsupported_audio_format")
InputAudioBufferEmpty = _code("InputAudioBufferEmpty", "input_audio_buffer_empty")
ResponseAlreadyActive = _code("ResponseAlreadyActive", "response_already_active")
ResponseNotActive = _code("ResponseNotActive", "response_not_active")
PlaybackItemNotFound = _code("PlaybackItemNotFound", "playback_item_not_found")
PlaybackAckTooLate = _code("PlaybackAckTooLate", "playback_ack_too_late")
VideoInputUnsupported = _code("VideoInputUnsupported", "video_input_unsupported")
InvalidVideoFrames = _code("InvalidVideoFrames", "invalid_video_frames")
SessionResumeExpired = _code("SessionResumeExpired", "session_resume_expired")
SessionClosed = _code("SessionClosed", "session_closed")
IllegalState = _code("IllegalState", "illegal_state")
InputBackpressure = _code("InputBackpressure", "input_backpressure", "rate_limit_error")
ResourceExhausted = _code("ResourceExhausted", "resource_exhausted", "rate_limit_error", 429)
InternalError = _code("InternalError", "internal_error", "server_error", 500)
EngineError = _code("EngineError", "engine_error", "server_error")
UnsupportedEvent = _code("UnsupportedEvent", "unsupported_event")
UnsupportedParameter = _code("UnsupportedParameter", "unsupported_parameter")
UnsupportedTurnDetection = _code("UnsupportedTurnDetection", "unsupported_turn_detection")
ItemNotFound = _code("ItemNotFound", "item_not_found")
AudioEndOutOfRange = _code("AudioEndOutOfRange", "audio_end_ms_out_of_range")
FirstEventTimeout = _code("FirstEventTimeout", "first_event_timeout")
InvalidPayload = _code("InvalidPayload", "invalid_payload")
RateLimited = _code("RateLimited", "rate_limited", "rate_limit_error", 429)
ToolsNotCallable = _code("ToolsNotCallable", "tools_not_supported")
"""A warning, not a refusal: ``tools`` were taken, and the reply model cannot call them."""


class EngineSleeping(ResourceExhausted):  # type: ignore[misc,valid-type]
    """The engine sleeps (``POST /v1/omni/sleep``): no new session or request until it is
    woken; a ``ResourceExhausted``, so a socket refused closes 1013 (try again later)."""

    code: ClassVar[str] = "engine_sleeping"
    error_type: ClassVar[str] = "server_error"
    status_hint: ClassVar[int] = 503


class InvalidParameters(ProtocolError):
    """Several fields of one event are refused: ``problems`` holds one error per field.

    A client fixing a ``session.update`` learns every bad field from one answer, not
    one per round trip. ``param`` lists the fields, comma-separated, in the order found;
    the message repeats each problem's own.
    """

    code: ClassVar[str] = "invalid_parameters"

    def __init__(self, problems: tuple[ProtocolError, ...], *, event_id: str | None = None):
        self.problems = problems
        message = "; ".join(p.message for p in problems)  # each names its own field
        params = ", ".join(str(p.param) for p in problems)
        super().__init__(
            f"{len(problems)} fields refused: {message}", event_id=event_id, param=params
        )


def refuse_all(problems: list[ProtocolError]) -> None:
    """Raise the one problem, or all of them as `InvalidParameters`; nothing if none."""
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise InvalidParameters(tuple(problems))


ERROR_CLASSES: dict[str, type[ProtocolError]] = {
    cls.code: cls
    for cls in (
        InvalidJson, UnknownEvent, BadEvent, BadAudio, EventTooLarge, BinaryFrameUnsupported,
        UnsupportedAudioFormat, InputAudioBufferEmpty, ResponseAlreadyActive, ResponseNotActive,
        PlaybackItemNotFound, PlaybackAckTooLate, VideoInputUnsupported, InvalidVideoFrames,
        SessionResumeExpired, SessionClosed, IllegalState, InputBackpressure,
        ResourceExhausted, InternalError, EngineError, UnsupportedEvent, UnsupportedParameter,
        UnsupportedTurnDetection, ItemNotFound, AudioEndOutOfRange, FirstEventTimeout,
        InvalidPayload, RateLimited, ToolsNotCallable, InvalidParameters, EngineSleeping,
    )
}  # fmt: skip


def error_type_for(code: str) -> str:
    """The Realtime error family of a wire code; unknown codes are request errors."""
    cls = ERROR_CLASSES.get(code)
    return cls.error_type if cls else "invalid_request_error"


class ModelError(DuplexError):
    """Errors of engines and model runners; the session maps them to ``EngineError`` on the wire."""


class UnknownModel(ModelError, LookupError):
    """No model is registered under the requested name; the message lists the known ones."""


class SlotReleased(ModelError):
    """A slot handle was used after it was released; its slot may already serve someone else."""


class PromptUnsupported(ModelError, ValueError):
    """A slot was asked for with a prompt the model cannot take (no prompt support,
    or a voice it does not have); refused when the slot is taken, never ignored."""


class RunnerContractError(ModelError):
    """A model runner returned output that does not match its plan (slots, shapes, dtypes)."""


class RequestError(ModelError):
    """A request-batched model (robot policy, TTS, diffusion, ASR); its endpoint answers
    with an error frame or an HTTP error, and the connection stays usable."""


class RequestFailed(RequestError):
    """The runner raised, or returned no result for a request; clients are told that it
    failed (never the cause, which is chained and logged)."""


class EngineUnavailable(RequestFailed):
    """The engine process that runs the request engine exited, or is not linked yet (it is
    being restarted): the request did not fail on its own, a retry in a moment will run
    it. HTTP answers 503 with ``Retry-After``, not a 500."""


class RequestsOverloaded(RequestError):
    """The request engine's queue is full; the request was not run.

    ``retry_after_s``: how long the queue takes to drain, by its latest batch (the
    ``Retry-After`` an HTTP endpoint answers with).
    """

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RequestCancelled(RequestError):
    """Raised inside a runner at its next unit when every request of its batch was
    withdrawn (the clients left): the batch stops and frees the engine."""


class SpeechError(ModelError):
    """Text to speech (``duplex.models.tts``): a runner that cannot load or speak."""


class UnknownVoice(SpeechError, ValueError):
    """A voice the TTS engine does not have; the message lists the valid ones."""
