"""The agent's shared engines: one ASR, one reply model and one TTS per process.

Every session of the process uses the same `AgentModels` (the hub hands it to each
session's agent link); their requests batch together. Built off the trio thread
(`build_agent`: loading decoders and voices takes seconds), run in the server's nursery
(`AgentModels.run`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, final

import numpy as np
import numpy.typing as npt
import trio

from duplex.exceptions import ConfigError
from duplex.models import RequestEngine, Slack

from ._asr import AsrChunk, AsrText, PocketSphinxRunner
from ._reply import EchoReplier, Replier

__all__ = ["AgentModels", "AgentOptions", "build_agent"]


@final
@dataclass(frozen=True, slots=True)
class AgentOptions:
    """Which models the agent runs (``server.agent_*``)."""

    llm: str = ""
    asr: str = "pocketsphinx"
    asr_grammar: str = ""
    tts: str = "espeak"
    seed: int = 0


@final
class AgentModels:
    """The shared stages. ``speak(text, voice)`` makes speech (float32, at its own rate)."""

    def __init__(
        self,
        asr: RequestEngine[AsrChunk, AsrText],
        replier: Replier,
        tts: RequestEngine[Any, Any],
    ) -> None:
        self.asr = asr
        self.replier = replier
        self.tts = tts

    async def speak(self, text: str, voice: str) -> tuple[npt.NDArray[np.float32], int]:
        """``text`` spoken in ``voice``: samples and their rate (the caller resamples)."""
        from duplex.models.tts import SpeechRequest

        audio = await self.tts.submit(SpeechRequest(text, voice=voice))
        return np.asarray(audio.pcm, dtype=np.float32) / 32768.0, audio.sample_rate

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the engines' loops until cancelled."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.asr.run)
            await nursery.start(self.tts.run)
            await nursery.start(self.replier.run)
            task_status.started()


def build_agent(options: AgentOptions, slack: Slack | None = None) -> AgentModels:
    """Load the agent's models (blocking: seconds; run it off the trio thread); their
    engines run their units in ``slack``, the windows the process's realtime engine leaves.

    Raises:
        ConfigError: a named checkpoint or grammar does not exist.
    """
    from duplex.models.tts import load_tts

    if options.asr != "pocketsphinx":
        raise ConfigError(
            f"server.agent_asr: {options.asr!r}: only pocketsphinx is supported so far",
            key="server.agent_asr",
        )
    grammar = None
    if options.asr_grammar:
        path = Path(options.asr_grammar)
        if not path.is_file():
            raise ConfigError(
                f"server.agent_asr_grammar: no file {options.asr_grammar!r}",
                key="server.agent_asr_grammar",
            )
        grammar = path.read_text()
    runner = PocketSphinxRunner(grammar=grammar)
    runner.prepare()
    replier: Replier = EchoReplier()
    if options.llm:
        from ._vllm import VllmReplier

        if not (Path(options.llm) / "config.json").is_file():
            raise ConfigError(
                f"server.agent_llm: {options.llm!r} is not a checkpoint folder (no config.json)",
                key="server.agent_llm",
            )
        vllm = VllmReplier(options.llm, seed=options.seed)
        vllm.load()
        replier = vllm
    speech = load_tts(options.tts)
    if speech is None:
        raise ConfigError("server.agent_tts: the agent needs a TTS (espeak or a VITS folder)")
    return AgentModels(
        RequestEngine(runner, slack=slack),
        replier,
        RequestEngine(speech, slack=slack),  # type: ignore[arg-type]
    )
