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

import math
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, final

import numpy as np
import numpy.typing as npt

from duplex.models import UnitGate

__all__ = [
    "ASR_SAMPLE_RATE",
    "FAST_SEARCH",
    "FEED_SAMPLES",
    "AsrChunk",
    "AsrPool",
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
FAST_SEARCH = {"maxhmmpf": 1500, "maxwpf": 5, "pl_window": 10, "fwdflat": False, "bestpath": False}
"""A narrower search and no second passes at the end of a turn (the final transcript is
the first pass's): about half the CPU of the defaults on the fixtures, same words; and
at most 1500 active HMMs a frame (3000 took twice the CPU again for the same words on
``hello.wav``: 1.3 s against 0.65 s for its 2.7 s, on a loaded core)."""


@final
@dataclass(frozen=True, slots=True, eq=False)
class AsrChunk:
    """The next audio of ``stream`` (int16, 16 kHz); ``final`` closes it; ``abort`` drops
    it without an answer worth reading (a cancelled turn); ``provisional``: the turn may
    end here (a pause), so the answer must cover all of the stream's audio (a runner that
    skips some partials, as Whisper's does, transcribes this one)."""

    stream: str
    pcm: npt.NDArray[np.int16] = field(repr=False)
    final: bool = False
    abort: bool = False
    provisional: bool = False


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
    """The ASR child died during a batch (the batch fails; a new child is running), or
    before a stream's next chunk (that chunk fails: its decoder died with the child)."""


MAX_LOST_STREAMS = 1024
"""Streams remembered as lost with a dead child until their next chunk fails (the oldest
is forgotten beyond this: a stream whose session went without a last chunk)."""


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
        self._open: set[str] = set()
        """Streams with a decoder in the current child."""
        self._lost: dict[str, None] = {}
        """Streams whose decoder died with a child, oldest first: their next chunk fails
        (a new child would open a fresh stream and hear only the turn's rest as all of it)."""
        self._batch: list[bool] = []
        """Per request of the batch `send` handed over: its stream was lost (not sent)."""
        self._sent: list[AsrChunk] = []
        """The chunks of that batch handed to the child."""

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

    def run_batch(
        self, requests: Sequence[AsrChunk], gate: UnitGate
    ) -> list[AsrText | BaseException]:
        """One batch through the child. A child that died (its pipe broke) fails this
        batch at once and a new one starts in the background; the next batch waits for
        it. The streams it held open are lost: the next chunk of each fails alone
        (`AsrProcessLost`, so its turn's transcription fails rather than completing with
        only what came after), and the streams after it are heard by the new child.
        Before, a dead child failed every later batch: the agent heard nothing until the
        server restarted."""
        with self._lock:
            self.send(requests)
            return self.receive()

    def send(self, requests: Sequence[AsrChunk]) -> None:
        """Hand the child a batch (`receive` gets its answer; one batch at a time); the
        chunks of lost streams stay here, answered by `receive` with `AsrProcessLost`.

        Raises:
            AsrProcessLost: the child had died (a new one is starting).
        """
        self._batch = [r.stream in self._lost for r in requests]
        live = [r for r, lost in zip(requests, self._batch, strict=True) if not lost]
        self._sent = live
        for request, lost in zip(requests, self._batch, strict=True):
            ends = request.final or request.abort
            if lost:
                if ends:
                    self._lost.pop(request.stream, None)
            elif ends:
                self._open.discard(request.stream)
            else:
                self._open.add(request.stream)
        if not live:
            return
        if self._starting is not None:  # a replacement is starting: wait for it
            self._starting.join()
            self._starting = None
        if self._conn is None:  # it failed to start: try again here (raises)
            self.prepare()
        try:
            self._conn.send(live)
        except (EOFError, OSError) as exc:
            self._lost_with(exc, live)

    def receive(self) -> list[AsrText | BaseException]:
        """The answer to the batch `send` handed over, in its order (an `AsrProcessLost`
        for each chunk of a lost stream).

        Raises:
            AsrProcessLost: the child died (a new one is starting).
            Exception: what the child raised for the batch.
        """
        answer: Any = []
        if self._sent:
            try:
                answer = self._conn.recv()
            except (EOFError, OSError) as exc:
                self._lost_with(exc, self._sent)
            if isinstance(answer, BaseException):
                raise answer
        answers = iter(answer)
        lost = AsrProcessLost("the ASR process that held this stream exited")
        return [lost if gone else next(answers) for gone in self._batch]

    def _lost_with(self, exc: BaseException, batch: Sequence[AsrChunk]) -> NoReturn:
        """The child died: the streams it held are lost, but for those of the batch that
        fails now (each of those is told by this failure); then a new child starts."""
        failing = {r.stream for r in batch}
        for stream in self._open - failing:
            self._lost[stream] = None
        while len(self._lost) > MAX_LOST_STREAMS:
            del self._lost[next(iter(self._lost))]
        self._open.clear()
        self._replace()
        raise AsrProcessLost("the ASR process exited; a new one takes the next chunks") from exc

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


class AsrPool:
    """Several `AsrProcess` es side by side, so several speakers decode on several cores.

    A stream decodes in one child for its whole life (its decoder lives there): a new
    stream goes to the child with the fewest streams open. A batch's chunks go to their
    children at once, and the answers are gathered in the batch's order.

    Args:
        workers: how many children.
        options: as `AsrProcess`'s (each child's).
    """

    name = "asr"

    def __init__(self, workers: int, **options: Any) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.max_batch = int(options.get("max_batch", 32))
        self.children = [AsrProcess(**options) for _ in range(workers)]
        self._owner: dict[str, int] = {}  # open stream -> its child
        self._open = [0] * workers
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Start every child and wait for their warm decoders (blocking)."""
        errors: list[BaseException] = []
        threads = [
            threading.Thread(target=_catching(child.prepare, errors), name="duplex-asr-start")
            for child in self.children
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def _child(self, chunk: AsrChunk) -> int:
        index = self._owner.get(chunk.stream)
        if index is None:
            index = min(range(len(self.children)), key=self._open.__getitem__)
            self._owner[chunk.stream] = index
            self._open[index] += 1
        if chunk.final or chunk.abort:  # the stream closes in its child with this chunk
            del self._owner[chunk.stream]
            self._open[index] -= 1
        return index

    @property
    def open_streams(self) -> int:
        return len(self._owner)

    def run_batch(self, requests: Sequence[AsrChunk], gate: UnitGate) -> list[AsrText]:
        with self._lock:
            groups: dict[int, list[int]] = {}
            for position, chunk in enumerate(requests):
                groups.setdefault(self._child(chunk), []).append(position)
            results: list[AsrText | None] = [None] * len(requests)
            failure: BaseException | None = None
            sent: dict[int, list[int]] = {}
            for index, positions in groups.items():
                try:
                    self.children[index].send([requests[p] for p in positions])
                except Exception as exc:  # a dead child: its chunks fail, the others go on
                    failure = failure or exc
                    continue
                sent[index] = positions
            for index, positions in sent.items():  # every answer is read, even after a failure
                try:
                    answers = self.children[index].receive()
                except Exception as exc:
                    failure = failure or exc
                    continue
                for position, answer in zip(positions, answers, strict=True):
                    results[position] = answer
        if failure is not None:
            raise failure
        return [r for r in results if r is not None]

    def close(self) -> None:
        """Stop every child."""
        for child in self.children:
            child.close()


def _catching(call: Any, errors: list[BaseException]) -> Any:
    def run() -> None:
        try:
            call()
        except BaseException as exc:  # raised by `AsrPool.prepare` on the caller's thread
            errors.append(exc)

    return run


def _serve_asr(conn: Any, options: dict[str, Any]) -> None:
    """The child's loop: a batch in, its results out, until the pipe closes."""
    # an engine process ignores SIGTERM (the server stops it) and a spawned child inherits
    # that: multiprocessing's exit (terminate, then join) then waited on it for ever
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
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
    until = math.inf

    def next_unit(self, kind: str = "step") -> None:
        return None

    def check(self) -> None:
        pass
