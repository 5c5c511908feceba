"""The agent's shared stages: its ASR and TTS are request engines of the process (looked up
by name, ``asr`` and ``tts``, in its registry: built in this process or in an engine
process, restarted by their supervisor); its reply model is one per process.

Every session of the process uses the same `AgentModels` (the hub hands it to each
session's agent link), so their requests batch together. They are a live session's
work: submitted as ``Priority.REALTIME``, first in their engine's queue and run
without waiting for slack, ahead of the HTTP speech the same TTS engine serves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, final

import numpy as np
import numpy.typing as npt

from duplex.exceptions import ConfigError, ModelError
from duplex.pcm import pcm16_to_float

from .._batcher import Priority
from ._asr import AsrChunk, AsrPool, AsrProcess, AsrText
from ._chat import ChatEngine
from ._reply import EchoReplier, Replier
from ._whisper import WhisperRunner

__all__ = ["ASR_RUNNER", "AgentModels", "AgentOptions", "build_asr", "build_replier"]

ASR_RUNNER = "asr"
"""The ASR's name among the process's request engines (and its metrics' ``runner``)."""


class _Service(Protocol):
    async def submit(self, request: Any, *, priority: Priority = Priority.BATCH) -> Any: ...


class _Engines(Protocol):
    """The process's request engines by name (``duplex.runtime.RequestEngines``)."""

    def get(self, name: str) -> Any: ...


@final
@dataclass(frozen=True, slots=True)
class AgentOptions:
    """Which models the agent runs (the ``agent`` section)."""

    llm: str = ""
    asr: str = "pocketsphinx"
    asr_grammar: str = ""
    asr_workers: int = 1
    asr_device: str = "cpu"
    seed: int = 0


@final
class AgentModels:
    """The shared stages: ``requests`` holds the ``asr`` and ``tts`` engines."""

    def __init__(
        self, requests: _Engines, replier: Replier, chat: ChatEngine | None = None
    ) -> None:
        self.requests = requests
        self.replier = replier
        self.chat = chat
        """The same model, serving chat completions (``None``: the deterministic responder,
        which serves none)."""

    def _engine(self, name: str) -> _Service:
        engine = self.requests.get(name)
        if engine is None:
            raise ModelError(f"the {name} engine is not running (starting or restarting)")
        return engine  # type: ignore[no-any-return]

    async def hear(self, chunk: AsrChunk) -> AsrText:
        """One chunk of a stream through the shared ASR."""
        result: AsrText = await self._engine(ASR_RUNNER).submit(chunk, priority=Priority.REALTIME)
        return result

    async def speak(self, text: str, voice: str) -> tuple[npt.NDArray[np.float32], int]:
        """``text`` spoken in ``voice``: samples and their rate (the caller resamples)."""
        from duplex.models.tts import TTS_RUNNER, SpeechRequest

        request = SpeechRequest(text, voice=voice)
        audio = await self._engine(TTS_RUNNER).submit(request, priority=Priority.REALTIME)
        return pcm16_to_float(audio.pcm), audio.sample_rate

    @property
    def metadata(self) -> Mapping[str, str]:
        return {"llm": self.replier.name}


def build_asr(
    options: AgentOptions, *, max_batch: int = 32
) -> AsrProcess | AsrPool | WhisperRunner:
    """The ASR runner (blocking: run it off the trio thread). pocketsphinx runs in its own
    process (``asr_workers`` processes: a pool), which this starts and whose warm decoders
    it waits for; a Whisper checkpoint folder loads here, on ``asr_device``, and runs in
    the request engine's thread (torch releases the GIL in its kernels; docs/agent.md).

    Raises:
        ConfigError: an unknown ASR (neither pocketsphinx nor a Whisper checkpoint folder),
            or a grammar file that does not exist.
    """
    if options.asr != "pocketsphinx":
        whisper = WhisperRunner(options.asr, device=options.asr_device, max_batch=max_batch)
        whisper.prepare()
        return whisper
    grammar = None
    if options.asr_grammar:
        path = Path(options.asr_grammar)
        if not path.is_file():
            raise ConfigError(
                f"agent.asr_grammar: no file {options.asr_grammar!r}",
                key="agent.asr_grammar",
            )
        grammar = path.read_text()
    runner: AsrProcess | AsrPool
    if options.asr_workers > 1:
        runner = AsrPool(options.asr_workers, grammar=grammar, max_batch=max_batch)
    else:
        runner = AsrProcess(grammar=grammar, max_batch=max_batch)
    runner.prepare()
    return runner


def build_replier(options: AgentOptions) -> tuple[Replier, ChatEngine | None]:
    """The reply model, and the same model as a chat engine when it is a checkpoint
    (blocking: vllm loads for seconds; run it off the trio thread).

    Raises:
        ConfigError: ``llm`` is not a checkpoint folder.
    """
    if not options.llm:
        return EchoReplier(), None
    from ._vllm import VllmReplier

    if not (Path(options.llm) / "config.json").is_file():
        raise ConfigError(
            f"agent.llm: {options.llm!r} is not a checkpoint folder (no config.json)",
            key="agent.llm",
        )
    vllm = VllmReplier(options.llm, seed=options.seed)
    vllm.load()
    return vllm, vllm
