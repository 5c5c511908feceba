"""The agent link's hearing: a stream whose chunk failed is closed in the ASR as well."""

from __future__ import annotations

import numpy as np
import trio

from duplex.exceptions import RequestFailed, RequestsOverloaded
from duplex.models.agent import AsrChunk, AsrText
from duplex.runtime._agent_link import AgentLink
from duplex.runtime._heard import Hearing
from duplex.sessions import Transcribe

RATE = 24_000


class FailsFirst:
    """Agent stages whose ASR refuses its first chunk with ``error``, then hears silence."""

    def __init__(self, error: Exception) -> None:
        self.error: Exception | None = error
        self.chunks: list[AsrChunk] = []

    async def hear(self, chunk: AsrChunk) -> AsrText:
        self.chunks.append(chunk)
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return AsrText(chunk.stream, "", final=chunk.final)


async def _one_turn(models: FailsFirst) -> list[object]:
    link = AgentLink(models, "s1", RATE)  # type: ignore[arg-type]
    delivered: list[object] = []

    async def deliver(event: object) -> None:
        delivered.append(event)

    async with trio.open_nursery() as nursery:
        await nursery.start(link.run, deliver)
        link.transcribe(Transcribe("item-1", 0.0, end_ms=1000.0))
        # one second of input (the turn's end), as the session's Hearing hands it on
        link.push(Hearing(RATE).push(np.zeros(RATE, np.float32), 0.0))
        with trio.fail_after(5):
            while not delivered:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    return delivered


async def test_a_full_asr_queue_ends_the_turn_and_closes_its_stream_in_the_asr() -> None:
    """The refused chunk never reached the decoder; without the abort the stream would
    stay open there (and in the pool's table) for the life of the process."""
    models = FailsFirst(RequestsOverloaded("asr: 64 requests already wait"))
    (result,) = await _one_turn(models)
    assert result.final and result.error.startswith("RequestsOverloaded")  # type: ignore[attr-defined]
    first, last = models.chunks[0], models.chunks[-1]
    assert len(models.chunks) == 2 and last.stream == first.stream
    assert last.abort and last.final and last.pcm.size == 0


async def test_a_lost_asr_process_ends_the_turn_and_frees_the_streams_entry() -> None:
    models = FailsFirst(RequestFailed("asr failed: AsrProcessLost"))
    (result,) = await _one_turn(models)
    assert result.final and result.error  # type: ignore[attr-defined]
    assert [c.abort for c in models.chunks] == [False, True]
