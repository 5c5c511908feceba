"""Which request-batched models a server runs, and where: built from the config, supervised.

`runner_specs` is the one list of request-batched models a config serves
(the robot policy, the TTS; images and videos add theirs here). Where they
run follows the engine: with engine processes each engine process builds
them beside its realtime engine, in that process's slack (``_engine_process``),
and session processes reach them over the engine link; without, the session
process builds them here (`open_request_engines`), in its own slack.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, final

import trio

from duplex.actors import ActorRef, ActorSystem
from duplex.config import Config
from duplex.metrics import MetricsRegistry
from duplex.models import (
    BatchRunner,
    ModelOptions,
    PolicyOptions,
    PolicyRunner,
    RequestActor,
    RequestEngine,
    Slack,
    load_policy,
)
from duplex.models.agent import ASR_RUNNER, AgentOptions, build_asr, reply_capabilities
from duplex.models.diffusion import (
    load_audio_runner,
    load_image_runner,
    load_video_runner,
    resolve_diffusion,
)
from duplex.models.tts import TTS_RUNNER, SpeechRunner, load_tts
from duplex.runtime import RequestEngines

__all__ = [
    "BATCH_SWITCH_INTERVAL_S",
    "RunnerSpec",
    "model_cards",
    "open_request_engines",
    "runner_specs",
    "start_request_engines",
]

BATCH_SWITCH_INTERVAL_S = 0.001
"""The GIL switch interval of a process that hosts request runners (Python's default: 5 ms)."""


@final
@dataclass(frozen=True, slots=True)
class RunnerSpec:
    """One request-batched model: how to build it (off the event loop: it loads weights)
    and how its engine batches.

    Args:
        name: what endpoints ask for (``policy``, ...) and the metrics' ``runner`` label.
        build: makes the runner.
        max_wait_s: how long a request waits for others before its batch runs.
        max_queue: the most requests of one priority class waiting at once; more are
            refused (429, or an error frame).

    Every engine runs in the process's slack; a live session's requests (the voice agent's,
    ``Priority.REALTIME``) run first and ungated, so one TTS engine serves the agent's
    sentences and HTTP speech (in the slack) alike.
    """

    name: str
    build: Callable[[], BatchRunner[Any, Any]]
    max_wait_s: float = 0.002
    max_queue: int = 64


def _policy(config: Config, device: str) -> RunnerSpec:
    policy = config.policy
    options = PolicyOptions(
        device=device,
        seed=config.engine.model_seed,
        action_horizon=policy.action_horizon,
        action_dim=policy.action_dim,
    )

    def build() -> PolicyRunner:
        return PolicyRunner(load_policy(policy.model, options), max_batch=policy.max_batch)

    return RunnerSpec("policy", build, policy.batch_wait_ms / 1000.0, max_queue=1024)


def _diffusion(config: Config, device: str, kind: Literal["image", "video", "audio"]) -> RunnerSpec:
    """``--image-model`` / ``--video-model``: a diffusion step is the unit of preemption, and
    no request waits for others; images batch up to ``image_max_batch`` (the requests that
    gathered while a call ran), videos one chunk a call."""
    media, engine = config.media, config.engine
    name = {"image": media.image_model, "video": media.video_model,
            "audio": media.audio_model}[kind]  # fmt: skip
    options = ModelOptions(
        device=device,
        seed=engine.model_seed,
        cache_dir=Path(engine.model_cache_dir).expanduser() if engine.model_cache_dir else None,
    )

    def build() -> BatchRunner[Any, Any]:
        model = resolve_diffusion(name, kind, options)
        beside = media.batch_beside_realtime
        if kind == "image":
            return load_image_runner(model, device, media.image_max_batch, beside_realtime=beside)
        if kind == "audio":
            return load_audio_runner(model, device, beside_realtime=beside)
        return load_video_runner(model, device, beside_realtime=beside)

    return RunnerSpec(kind, build, 0.0, max_queue=media.max_queue)


def _tts(config: Config, device: str) -> RunnerSpec:
    speech = config.speech

    def build() -> SpeechRunner:
        runner = load_tts(speech.tts, device=device, max_batch=speech.max_batch)
        assert runner is not None  # "none" is never a spec
        return runner

    wait_s = speech.batch_wait_ms / 1000.0
    return RunnerSpec(TTS_RUNNER, build, wait_s, max_queue=speech.max_queue)


def _asr(config: Config, device: str) -> RunnerSpec:
    agent = config.agent
    options = AgentOptions(
        asr=agent.asr, asr_grammar=agent.asr_grammar, asr_workers=agent.asr_workers,
        asr_device=device,
    )  # fmt: skip

    def build() -> BatchRunner[Any, Any]:
        return build_asr(options)

    return RunnerSpec(ASR_RUNNER, build, 0.002, max_queue=1024)


def runner_specs(config: Config, device: str | None = None) -> list[RunnerSpec]:
    """The request-batched models ``config`` serves, built for ``device`` (the first model
    device by default: an engine process passes its own)."""
    device = device if device is not None else config.engine.devices[0]
    specs = []
    if config.policy.model != "none":
        specs.append(_policy(config, device))
    if config.media.image_model:
        specs.append(_diffusion(config, device, "image"))
    if config.media.video_model:
        specs.append(_diffusion(config, device, "video"))
    if config.media.audio_model:
        specs.append(_diffusion(config, device, "audio"))
    if config.speech.tts != "none":
        specs.append(_tts(config, device))
    if config.agent.enabled:
        specs.append(_asr(config, device))
    return specs


async def start_request_engines(
    system: ActorSystem,
    specs: Sequence[RunnerSpec],
    engines: RequestEngines,
    slack: Slack | None,
) -> list[ActorRef[Any]]:
    """Spawn one supervised `RequestEngine` per spec (each told to ``engines`` when it runs,
    and again after a crash); their batches run in ``slack``. Returns the actors.

    A runner's thread runs Python between its kernels (a diffusion pipeline launches
    hundreds per step): at the default 5 ms switch interval the tick loop could wait that
    long for the GIL each time it wakes to hand outputs on, so the process switches at
    `BATCH_SWITCH_INTERVAL_S` while it hosts runners.
    """
    if specs:
        sys.setswitchinterval(min(sys.getswitchinterval(), BATCH_SWITCH_INTERVAL_S))
    refs = []
    for spec in specs:

        def build(spec: RunnerSpec = spec) -> RequestEngine[Any, Any]:
            return RequestEngine(
                spec.build(),
                max_wait_s=spec.max_wait_s,
                max_queue=spec.max_queue,
                slack=slack,
            )

        refs.append(
            await system.spawn(
                RequestActor, build, engines.started, trio.to_thread.run_sync, name=spec.name
            )
        )
    return refs


@asynccontextmanager
async def open_request_engines(
    config: Config,
    system: ActorSystem,
    registry: MetricsRegistry | None,
    slack: Slack | None,
    *,
    local: bool,
) -> AsyncIterator[RequestEngines]:
    """This process's registry of request engines, stopped on the way out.

    ``local``: build them here (no engine processes); else the registry is filled by the
    links to the engine processes that host them.
    """
    specs = runner_specs(config)
    engines = RequestEngines([spec.name for spec in specs], registry)
    refs = await start_request_engines(system, specs, engines, slack) if local else []
    try:
        yield engines
    finally:
        with trio.CancelScope(shield=True):
            for ref in reversed(refs):
                await system.stop(ref)


_KINDS: Final = {"image": "image", "video": "video", "audio": "audio", TTS_RUNNER: "speech",
                 ASR_RUNNER: "transcription", "policy": "policy"}  # fmt: skip
"""Each request engine's ``kind`` on its model card, in the order ``/v1/models`` lists them."""


def _shown(name: str) -> str:
    """A model's name as clients see it: a checkpoint folder by its last part only."""
    return Path(name).name if "/" in name else name


def model_cards(
    config: Config,
    requests: RequestEngines,
    agent_llm: Callable[[], str | None],
    chat_modalities: Callable[[], list[str]] | None = None,
) -> list[dict[str, Any]]:
    """OpenAI's model cards of the request-batched models ``config`` serves, and of the
    agent's reply model: the running engine's own name for its model (``metadata["model"]``)
    where it says one, else the configured one; ``ready`` is false while it starts.
    ``agent_llm``: the running agent's reply model (``None``: not running yet). The reply
    model's card carries its ``capabilities`` (``tools``, ``instructions``, ``text_only``);
    ``chat_modalities``: what the chat model takes (``/v1/chat/completions``), once it runs.
    A checkpoint's card is named as ``model`` names it in a chat request (its folder)."""
    configured = {
        "image": config.media.image_model, "video": config.media.video_model,
        "audio": config.media.audio_model,
        TTS_RUNNER: config.speech.tts, ASR_RUNNER: config.agent.asr, "policy": config.policy.model,
    }  # fmt: skip
    cards = []
    for name, kind in _KINDS.items():
        if name not in requests.configured:
            continue
        engine = requests.get(name)
        model = engine.metadata.get("model") if engine is not None else None
        cards.append(_card(str(model or _shown(configured[name])), kind, engine is not None))
    if config.agent.enabled:
        llm = agent_llm()
        name = _shown(config.agent.llm) if config.agent.llm else (llm or "echo")
        card = _card(name, "chat", llm is not None)
        # what it does with a session's tools and instructions, before anyone finds out
        card["capabilities"] = reply_capabilities(config.agent.llm).as_dict()
        if config.agent.llm and chat_modalities is not None:
            card["modalities"] = chat_modalities()
        cards.append(card)
    return cards


def _card(model: str, kind: str, ready: bool) -> dict[str, Any]:
    return {
        "id": model,
        "object": "model",
        "owned_by": "duplex",
        "created": 0,
        "kind": kind,
        "ready": ready,
    }
