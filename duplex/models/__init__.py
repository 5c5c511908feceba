"""duplex.models: frame-synchronous engines, their trio driver and model runners.

A runner (`ModelRunner`) executes batched steps over slots; the `Scheduler`
decides admission on numbers; the `Engine` owns both and steps synchronously;
the `EngineDriver` ticks it on trio's clock and fans outputs out to sessions.
"""

from ._actor import EngineActor
from ._driver import DriverStatistics, EngineDriver, Offload
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
    SlotInput,
    StepOutput,
    StepPlan,
    VideoFrame,
)
from ._loopback import LOOPBACK_SPEC, LoopbackRunner
from ._registry import get_model, model_names, register_model
from ._scheduler import Scheduler, SchedulerStatistics, SlotState

__all__ = [
    "LOOPBACK_SPEC",
    "DriverStatistics",
    "Engine",
    "EngineActor",
    "EngineDriver",
    "EngineStatistics",
    "FrameOutput",
    "InputPush",
    "LoopbackRunner",
    "ModelRunner",
    "ModelSpec",
    "Offload",
    "PcmFrame",
    "RunnerFactory",
    "Scheduler",
    "SchedulerStatistics",
    "SlotHandle",
    "SlotInput",
    "SlotOutput",
    "SlotState",
    "SlotStatistics",
    "StepOutput",
    "StepPlan",
    "VideoFrame",
    "get_model",
    "model_names",
    "register_model",
]
