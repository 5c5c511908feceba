"""duplex.models: frame-synchronous engines, their trio driver and model runners.

A runner (`ModelRunner`) executes batched steps over slots; the `Scheduler`
decides admission on numbers; the `Engine` owns both and steps synchronously;
the `EngineDriver` ticks it on trio's clock and fans outputs out to sessions.
`get_model` maps a ``--model`` value (and `ModelOptions`: device, seed, cache
folder) to a spec and runner factory; Moshi models live in ``duplex.models.moshi``.

Voice activity: `SileroVad` scores 32 ms windows of every session's 16 kHz
input in one batched silero-vad forward per step; the `VadDriver` steps it on
trio's clock and delivers `VadWindow`s; a per-session `SpeechSegmenter` turns
them into OpenAI server_vad events; the `VadActor` supervises the driver.

Robot policies: a `Policy` answers a batch of `PolicyRequest`s in one call
(`ReferencePolicy` is the built-in seeded model; `load_policy` reads ``--policy``);
the `PolicyEngine` batches concurrent robots' ``infer`` calls into those calls
(a `PolicyBatcher` decides when, on numbers); the `PolicyActor` supervises it.
"""

from ._actor import EngineActor
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
    load_policy,
    policy_factory,
)
from ._policy_actor import PolicyActor
from ._policy_batcher import BatcherStatistics, PolicyBatcher
from ._policy_driver import POLICY_METRICS, PolicyEngine, PolicyEngineStatistics, PolicyReply
from ._policy_reference import ReferencePolicy
from ._recorder import ENGINE_HISTOGRAMS, EngineRecorder, RecorderSnapshot
from ._registry import get_model, model_names, register_model
from ._scheduler import CapacityLimit, CapacityReport, Scheduler, SchedulerStatistics, SlotState
from ._segmenter import (
    IdleTimeout,
    SegmenterEvent,
    SegmentStarted,
    SegmentStopped,
    ServerVadConfig,
    SpeechSegmenter,
)
from ._silero import (
    VAD_SAMPLE_RATE,
    VAD_WINDOW_MS,
    VAD_WINDOW_SAMPLES,
    SileroVad,
    VadHandle,
    VadPush,
    VadStatistics,
    VadStreamStatistics,
    VadWindow,
    silero_weights_path,
)
from ._ticker import Fanout, Subscriber
from ._vad_actor import VadActor
from ._vad_driver import VAD_METRICS, VadDriver, VadDriverStatistics

__all__ = [
    "ENGINE_HISTOGRAMS",
    "ENGINE_METRICS",
    "LOOPBACK_SPEC",
    "POLICY_METRICS",
    "STALL_PERIODS",
    "VAD_METRICS",
    "VAD_SAMPLE_RATE",
    "VAD_WINDOW_MS",
    "VAD_WINDOW_SAMPLES",
    "BatcherStatistics",
    "CapacityLimit",
    "CapacityReport",
    "DriverStatistics",
    "Engine",
    "EngineActor",
    "EngineDriver",
    "EngineRecorder",
    "EngineStatistics",
    "Fanout",
    "FrameOutput",
    "IdleTimeout",
    "InputPush",
    "LoopbackRunner",
    "ModelOptions",
    "ModelRunner",
    "ModelSpec",
    "Offload",
    "OneAtATime",
    "PcmFrame",
    "Policy",
    "PolicyActor",
    "PolicyBatcher",
    "PolicyEngine",
    "PolicyEngineStatistics",
    "PolicyOptions",
    "PolicyReply",
    "PolicyRequest",
    "PolicyResult",
    "RecorderSnapshot",
    "ReferencePolicy",
    "RunnerFactory",
    "SamplingRequest",
    "Scheduler",
    "SchedulerStatistics",
    "SegmentStarted",
    "SegmentStopped",
    "SegmenterEvent",
    "ServerVadConfig",
    "SileroVad",
    "SlotDelivery",
    "SlotEngine",
    "SlotHandle",
    "SlotInput",
    "SlotOutput",
    "SlotPrompt",
    "SlotState",
    "SlotStatistics",
    "SpeechSegmenter",
    "StepOutput",
    "StepPlan",
    "Subscriber",
    "VadActor",
    "VadDriver",
    "VadDriverStatistics",
    "VadHandle",
    "VadPush",
    "VadStatistics",
    "VadStreamStatistics",
    "VadWindow",
    "VideoFrame",
    "default_cache_dir",
    "get_model",
    "load_policy",
    "model_names",
    "policy_factory",
    "register_model",
    "silero_weights_path",
]
