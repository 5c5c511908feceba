"""Speech recognition for the agent: streamed chunks in, growing transcripts out.

A stream is one user turn (``stream``: any key unique while it runs). Its chunks go to
the runner in order, each as one `AsrChunk` request, and each answer is the transcript
heard so far; the chunk with ``final`` closes the stream and answers the turn's final
transcript. Requests of many sessions batch together in one ``run_batch`` call.

`PocketSphinxRunner` is the default (its en-US model ships in the ``pocketsphinx``
wheel: no download). It keeps one decoder per open stream, taken from a pool that grows
on demand (a decoder takes about a second to load, so the pool is warmed at start) and
given back when the stream closes. A JSGF ``grammar`` narrows what it can hear (tests
use one, so what it hears is deterministic).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, final

import numpy as np
import numpy.typing as npt

from duplex.models import UnitGate

__all__ = [
    "ASR_SAMPLE_RATE",
    "FAST_SEARCH",
    "FEED_SAMPLES",
    "AsrChunk",
    "AsrProcess",
    "AsrProcessLost",
    "AsrText",
    "PocketSphinxRunner",
]

ASR_SAMPLE_RATE = 16_000
"""What every ASR runner takes: mono int16 at 16 kHz."""
FEED_SAMPLES = 320
"""Audio per decoder call (20 ms). pocketsphinx holds the GIL for a whole call, so a long
one stalls the process's event loop (a 240 ms chunk took 100-300 ms here); between short
calls the interpreter hands the GIL to the trio thread."""
FAST_SEARCH = {"maxhmmpf": 3000, "maxwpf": 5, "pl_window": 10, "fwdflat": False, "bestpath": False}
"""A narrower search and no second passes at the end of a turn (the final transcript is
the first pass's): about half the CPU of the defaults on the fixtures, same words."""


@final
@dataclass(frozen=True, slots=True, eq=False)
class AsrChunk:
    """The next audio of ``stream`` (int16, 16 kHz); ``final`` closes it; ``abort`` drops
    it without an answer worth reading (a cancelled turn)."""

    stream: str
    pcm: npt.NDArray[np.int16] = field(repr=False)
    final: bool = False
    abort: bool = False


@final
@dataclass(frozen=True, slots=True)
class AsrText:
    """What ``stream`` holds so far (``final``: all of it)."""

    stream: str
    text: str
    final: bool = False


class PocketSphinxRunner:
    """Streaming pocketsphinx, one decoder per open stream.

    Args:
        grammar: a JSGF grammar to decode with instead of the language model.
        max_batch: the most chunks one call takes.
        warm: decoders loaded by `prepare`.
        max_streams: the most streams open at once (a new one beyond it evicts the oldest).
    """

    name = "asr"

    def __init__(
        self,
        *,
        grammar: str | None = None,
        max_batch: int = 32,
        warm: int = 2,
        max_streams: int = 256,
    ) -> None:
        self.max_batch = max_batch
        self._grammar = grammar
        self._warm = warm
        self._max_streams = max_streams
        self._free: list[Any] = []
        self._open: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _new_decoder(self) -> Any:
        from pocketsphinx import Decoder  # imported here: the server starts without it

        decoder = Decoder(loglevel="FATAL", **FAST_SEARCH)
        if self._grammar is not None:
            decoder.add_jsgf_string("grammar", self._grammar)
            decoder.activate_search("grammar")
        return decoder

    def prepare(self) -> None:
        """Load the warm decoders (blocking: run it off the trio thread)."""
        while len(self._free) < self._warm:
            self._free.append(self._new_decoder())

    @property
    def open_streams(self) -> int:
        return len(self._open)

    def run_batch(self, requests: Sequence[AsrChunk], gate: UnitGate) -> list[AsrText]:
        with self._lock:
            return [self._chunk(request) for request in requests]

    def _chunk(self, request: AsrChunk) -> AsrText:
        decoder = self._open.get(request.stream)
        if decoder is None:
            if request.abort:
                return AsrText(request.stream, "", True)
            while len(self._open) >= self._max_streams:  # evict the oldest
                oldest = next(iter(self._open))
                self._close(oldest)
            decoder = self._free.pop() if self._free else self._new_decoder()
            decoder.start_utt()
            self._open[request.stream] = decoder
        if request.abort:
            self._close(request.stream)
            return AsrText(request.stream, "", True)
        pcm = np.ascontiguousarray(request.pcm, "<i2")
        for start in range(0, pcm.size, FEED_SAMPLES):  # the GIL goes free between pieces
            decoder.process_raw(pcm[start : start + FEED_SAMPLES].tobytes(), False, False)
        if not request.final:
            hyp = decoder.hyp()
            return AsrText(request.stream, hyp.hypstr if hyp is not None else "")
        text = self._close(request.stream)
        return AsrText(request.stream, text, True)

    def _close(self, stream: str) -> str:
        decoder = self._open.pop(stream)
        decoder.end_utt()
        hyp = decoder.hyp()
        self._free.append(decoder)
        return hyp.hypstr if hyp is not None else ""


class AsrProcessLost(RuntimeError):
    """The ASR child died during a batch (the batch fails; a new child is running)."""


class AsrProcess:
    """A `PocketSphinxRunner` in a child process: the same runner shape, but its decoding
    never holds this process's GIL (pocketsphinx holds it for each call, which stalls the
    event loop and inflates the realtime engine's measured step time: its admission then
    refuses sessions). Requests and results cross a pipe; the wait releases the GIL.

    Args:
        grammar, max_batch, warm, max_streams: as `PocketSphinxRunner`'s.
    """

    name = "asr"

    def __init__(self, **options: Any) -> None:
        self.max_batch = int(options.get("max_batch", 32))
        self._options = options
        self._conn: Any = None
        self._process: Any = None
        self._lock = threading.Lock()
        self._starting: threading.Thread | None = None

    restarts: int = 0
    """Children started again after one died (a crash, a kill, out of memory)."""

    def prepare(self) -> None:
        """Start the child and wait for its warm decoders (blocking)."""
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self._process = context.Process(
            target=_serve_asr, args=(child, self._options), name="duplex-asr", daemon=True
        )
        self._process.start()
        child.close()
        self._conn = parent
        ready = parent.recv()
        if isinstance(ready, BaseException):
            raise ready

    def run_batch(self, requests: Sequence[AsrChunk], gate: UnitGate) -> list[AsrText]:
        """One batch through the child. A child that died (its pipe broke) fails this
        batch at once and a new one starts in the background; the next batch waits for
        it. Its open streams are lost (a chunk of one opens a new stream). Before, a dead
        child failed every later batch: the agent heard nothing until the server
        restarted."""
        with self._lock:
            if self._starting is not None:  # a replacement is starting: wait for it
                self._starting.join()
                self._starting = None
            if self._conn is None:  # it failed to start: try again here (raises)
                self.prepare()
            try:
                self._conn.send(list(requests))
                answer = self._conn.recv()
            except (EOFError, OSError) as exc:
                self._replace()
                raise AsrProcessLost(
                    "the ASR process exited; a new one takes the next chunks"
                ) from exc
        if isinstance(answer, BaseException):
            raise answer
        results: list[AsrText] = answer
        return results

    def _replace(self) -> None:
        """Reap the dead child; start the next one in a thread (it takes seconds: the
        failed batch is not held for it)."""
        self._stop()
        self.restarts += 1

        def start() -> None:
            try:
                self.prepare()
            except Exception:  # the next batch tries again, and raises what it gets
                self._stop()

        self._starting = threading.Thread(target=start, name="duplex-asr-restart", daemon=True)
        self._starting.start()

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join(5)
        if self._conn is not None:
            self._conn.close()
        self._conn = self._process = None

    def close(self) -> None:
        """Stop the child (it also ends with this process: it is a daemon)."""
        if self._starting is not None:
            self._starting.join(30)
        self._stop()


def _serve_asr(conn: Any, options: dict[str, Any]) -> None:
    """The child's loop: a batch in, its results out, until the pipe closes."""
    try:
        runner = PocketSphinxRunner(**options)
        runner.prepare()
    except Exception as exc:
        conn.send(exc)
        return
    conn.send(True)
    while True:
        try:
            batch = conn.recv()
        except EOFError:
            return
        try:
            conn.send(runner.run_batch(batch, _NoGate()))
        except Exception as exc:  # the batch fails; the parent raises it for every request
            conn.send(exc)


class _NoGate:
    def next_unit(self) -> None:
        return None
