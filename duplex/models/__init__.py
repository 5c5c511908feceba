"""duplex.models: frame-synchronous engines, their trio driver and model runners.

A runner (`ModelRunner`) executes batched steps over slots; the `Scheduler`
decides admission on numbers; the `Engine` owns both and steps synchronously;
the `EngineDriver` ticks it on trio's clock and fans outputs out to sessions.
`get_model` maps a ``--model`` value (and `ModelOptions`: device, seed, cache
folder) to a spec and runner factory; Moshi models live in ``duplex.models.moshi``.

Voice activity: the silero VAD is one more runner on the same core
(`silero_engine`: an `Engine` over a `SileroRunner`, driven by an `EngineDriver`
and supervised by an `EngineActor`): it scores 32 ms windows of every session's
16 kHz input in one batched forward per step, only for slots with a window
queued, and each output's score is a `VadWindow`; a per-session
`duplex.sessions.SpeechSegmenter` (session policy) turns them into OpenAI server_vad
events.

Request-batched models (robot policies, TTS, diffusion, ASR): a `BatchRunner`
answers a batch of requests in one call; the `RequestEngine` batches concurrent
``submit`` calls into those calls (a `RequestBatcher` decides when, on numbers)
and, through the process's `Slack`, runs each unit of preemption only in the
windows the realtime tick driver leaves; the `RequestActor` supervises it. A
`Policy` answers a batch of `PolicyRequest`s (`ReferencePolicy` is the built-in
seeded model; `load_policy` reads ``--policy``); `PolicyRunner` serves it.
"""

from ._actor import EngineActor
from ._batcher import BatcherStatistics, Priority, RequestBatcher
from ._delivery import STALL_PERIODS, SlotDelivery, SlotEngine
from ._driver import ENGINE_METRICS, DriverStatistics, EngineDriver, Offload
from ._engine import (
    Engine,
    EngineStatistics,
    InputPush,
    SlotHandle,
    SlotOutput,
    SlotStatistics,
)
from ._interface import (
    NO_AUDIO,
    FrameOutput,
    ModelRunner,
    ModelSpec,
    PcmFrame,
    RunnerFactory,
    SamplingRequest,
    SlotInput,
    SlotPrompt,
    StepOutput,
    StepPlan,
    VideoFrame,
)
from ._loopback import LOOPBACK_SPEC, LoopbackRunner
from ._options import ModelOptions, default_cache_dir
from ._policy import (
    OneAtATime,
    Policy,
    PolicyOptions,
    PolicyRequest,
    PolicyResult,
    PolicyRunner,
    load_policy,
    policy_factory,
)
from ._policy_reference import ReferencePolicy
from ._recorder import ENGINE_HISTOGRAMS, EngineRecorder, RecorderSnapshot
from ._registry import get_model, model_names, register_model
from ._request_actor import RequestActor
from ._requests import (
    REQUEST_METRICS,
    BatchRunner,
    Completed,
    RequestEngine,
    RequestEngineStatistics,
    UnitGate,
)
from ._scheduler import CapacityLimit, CapacityReport, Scheduler, SchedulerStatistics, SlotState
from ._silero import (
    VAD_MAX_STEPS_PER_TICK,
    VAD_METRICS,
    VAD_SAMPLE_RATE,
    VAD_WINDOW_MS,
    VAD_WINDOW_SAMPLES,
    SileroRunner,
    VadWindow,
    silero_engine,
    silero_spec,
    silero_weights_path,
    vad_metric,
)
from ._slack import Slack, SlackStatistics, UnitEstimate
from ._ticker import Fanout, Subscriber
from ._uploaded_voices import UPLOADED_VOICE_NAME, uploaded_voice_path

__all__ = [
    "ENGINE_HISTOGRAMS",
    "ENGINE_METRICS",
    "LOOPBACK_SPEC",
    "NO_AUDIO",
    "REQUEST_METRICS",
    "STALL_PERIODS",
    "UPLOADED_VOICE_NAME",
    "VAD_MAX_STEPS_PER_TICK",
    "VAD_METRICS",
    "VAD_SAMPLE_RATE",
    "VAD_WINDOW_MS",
    "VAD_WINDOW_SAMPLES",
    "BatchRunner",
    "BatcherStatistics",
    "CapacityLimit",
    "CapacityReport",
    "Completed",
    "DriverStatistics",
    "Engine",
    "EngineActor",
    "EngineDriver",
    "EngineRecorder",
    "EngineStatistics",
    "Fanout",
    "FrameOutput",
    "InputPush",
    "LoopbackRunner",
    "ModelOptions",
    "ModelRunner",
    "ModelSpec",
    "Offload",
    "OneAtATime",
    "PcmFrame",
    "Policy",
    "PolicyOptions",
    "PolicyRequest",
    "PolicyResult",
    "PolicyRunner",
    "Priority",
    "RecorderSnapshot",
    "ReferencePolicy",
    "RequestActor",
    "RequestBatcher",
    "RequestEngine",
    "RequestEngineStatistics",
    "RunnerFactory",
    "SamplingRequest",
    "Scheduler",
    "SchedulerStatistics",
    "SileroRunner",
    "Slack",
    "SlackStatistics",
    "SlotDelivery",
    "SlotEngine",
    "SlotHandle",
    "SlotInput",
    "SlotOutput",
    "SlotPrompt",
    "SlotState",
    "SlotStatistics",
    "StepOutput",
    "StepPlan",
    "Subscriber",
    "UnitEstimate",
    "UnitGate",
    "VadWindow",
    "VideoFrame",
    "default_cache_dir",
    "get_model",
    "load_policy",
    "model_names",
    "policy_factory",
    "register_model",
    "silero_engine",
    "silero_spec",
    "silero_weights_path",
    "uploaded_voice_path",
    "vad_metric",
]
