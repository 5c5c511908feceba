"""The ASR child process dies (a crash, a kill, out of memory): the agent hears again.

Real pocketsphinx in a real child (``AsrProcess``), killed with SIGKILL between two
batches and during one. Before the fix a dead child failed every later batch
(``BrokenPipeError``), and the agent heard nothing until the server restarted.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import numpy as np
import pytest

from duplex.models.agent import ASR_SAMPLE_RATE, AsrChunk, AsrProcess
from duplex.models.agent._asr import AsrProcessLost, AsrText, _NoGate
from duplex.sessions._resample import StreamingResampler

from .agentkit import GRAMMAR, HELLO, wav_pcm16


def hello_16k() -> np.ndarray:
    pcm = np.frombuffer(wav_pcm16("hello.wav"), "<i2").astype(np.float32) / 32768.0
    out = StreamingResampler(24_000, ASR_SAMPLE_RATE).process(pcm)
    return np.clip(out * 32768.0, -32768, 32767).astype(np.int16)


def hear(runner: AsrProcess, stream: str, pcm: np.ndarray) -> str:
    [text] = runner.run_batch([AsrChunk(stream, pcm, final=True)], _NoGate())
    assert text.final
    return text.text


@pytest.fixture
def runner():
    runner = AsrProcess(grammar=GRAMMAR, max_batch=4, warm=1)
    runner.prepare()
    yield runner
    runner.close()


def test_a_killed_child_fails_one_batch_and_the_next_is_heard(runner: AsrProcess) -> None:
    pcm = hello_16k()
    assert hear(runner, "a", pcm) == HELLO
    first = runner._process.pid
    os.kill(first, signal.SIGKILL)
    runner._process.join(10)
    with pytest.raises(AsrProcessLost):
        hear(runner, "b", pcm)
    assert runner.restarts == 1
    assert runner._starting is not None  # the failed batch did not wait for the new child
    assert hear(runner, "c", pcm) == HELLO
    assert runner._process.pid != first and runner._process.is_alive()


class KilledAfterSend:
    """The child's pipe, but the child is killed as soon as a batch has been sent to it:
    the answer it was computing never comes (deterministic, no race with its speed)."""

    def __init__(self, conn: Any, pid: int) -> None:
        self.conn, self.pid = conn, pid

    def send(self, obj: Any) -> None:
        self.conn.send(obj)
        os.kill(self.pid, signal.SIGKILL)

    def recv(self) -> Any:
        return self.conn.recv()

    def close(self) -> None:
        self.conn.close()


def test_a_child_killed_during_a_batch_fails_that_batch_only(runner: AsrProcess) -> None:
    pcm = hello_16k()
    runner._conn = KilledAfterSend(runner._conn, runner._process.pid)
    with pytest.raises(AsrProcessLost):
        hear(runner, "during", pcm)
    assert runner.restarts == 1
    assert hear(runner, "after", pcm) == HELLO
    assert hear(runner, "again", pcm) == HELLO


def test_a_stream_open_in_a_killed_child_fails_its_next_chunk_and_only_it(
    runner: AsrProcess,
) -> None:
    """A turn half heard by a child that dies between two of its chunks: its next chunk
    fails alone (the new child would hear only the rest, as if it were the whole turn),
    the chunk that ends it frees it, and a stream of the new child is heard whole."""
    pcm = hello_16k()
    half = len(pcm) // 2
    [partial] = runner.run_batch([AsrChunk("turn", pcm[:half])], _NoGate())
    assert isinstance(partial, AsrText) and not partial.final
    os.kill(runner._process.pid, signal.SIGKILL)
    runner._process.join(10)
    with pytest.raises(AsrProcessLost):  # the next batch of anyone meets the dead pipe
        hear(runner, "other", pcm)
    # the half-heard turn's next chunk fails, beside a new stream that is heard whole
    rest, fresh = runner.run_batch(
        [AsrChunk("turn", pcm[half:]), AsrChunk("new", pcm, final=True)], _NoGate()
    )
    assert isinstance(rest, AsrProcessLost)
    assert isinstance(fresh, AsrText) and fresh.text == HELLO
    [ended] = runner.run_batch([AsrChunk("turn", pcm[:0], final=True)], _NoGate())
    assert isinstance(ended, AsrProcessLost)  # its last chunk fails too, and forgets it
    assert runner._lost == {}
    assert hear(runner, "turn", pcm) == HELLO  # the key is free again: a new stream
