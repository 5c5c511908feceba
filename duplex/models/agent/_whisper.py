"""Whisper (transformers) as the agent's ASR: a local checkpoint, batched across sessions.

The same contract as `PocketSphinxRunner` (`AsrChunk` in, `AsrText` out, one answer per
chunk), but Whisper is not streaming: it transcribes a whole window of audio at once. So
the runner keeps each open stream's audio and one `run_batch` call runs **one batched
``generate``** over every stream of the batch that needs an answer:

- the chunk that closes a stream (``final``), and a ``provisional`` one (the turn may end
  there: a prepared reply answers it), always;
- any other chunk only once the stream has gathered `PARTIAL_MS` of audio since its last
  transcription; until then it is answered with the stream's last transcript (as is any
  chunk, final or not, when no audio came since that transcription: greedy decoding of
  the same window says the same). Each
  transcription costs a whole 30 s encoder pass (Whisper pads every input to its window)
  plus the decoder over the words so far, whatever the audio's length: so a partial
  costs at most one such pass per `PARTIAL_MS` of speech per stream.

Whisper hears at most 30 s at once (`WINDOW_SAMPLES`). A stream that outgrows its window
has the full window transcribed in the batch that fills it (one more row of the same
``generate``); that text becomes a fixed prefix of the stream's transcript and the audio
beyond opens the next window. A stream holds at most one window of audio (960 KB), so
``max_streams`` bounds the memory; a word cut at a window's edge may be misheard.

Decoding is greedy, with English and ``transcribe`` forced (a multilingual checkpoint
does not detect the language, so a random test model cannot wander into one), no
timestamps, and at most ``max_new_tokens`` tokens a window. Loaded with
``from_pretrained(folder, local_files_only=True)``: weights never download.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Final, final

import numpy as np
import numpy.typing as npt

from duplex.exceptions import ConfigError
from duplex.models import UnitGate
from duplex.pcm import pcm16_to_float

from ._asr import ASR_SAMPLE_RATE, AsrChunk, AsrText

__all__ = [
    "PARTIAL_MS",
    "WINDOW_SAMPLES",
    "WhisperRunner",
    "WhisperStatistics",
    "check_whisper_folder",
]

WINDOW_SAMPLES: Final = 30 * ASR_SAMPLE_RATE
"""Whisper's window: 30 s at 16 kHz (its encoder takes exactly 3000 mel frames)."""
PARTIAL_MS: Final = 960.0
"""New audio a stream gathers before a partial transcript is worth a decode: four of the
agent link's 240 ms chunks (docs/agent.md, "Whisper")."""
MAX_NEW_TOKENS: Final = 128
"""Tokens a window may decode to: 30 s of English speech is about 80 words, ~110 tokens."""


def check_whisper_folder(path: str, *, key: str = "agent.asr") -> Path:
    """``path`` as a Whisper checkpoint folder (its ``config.json`` says ``whisper``).

    Raises:
        ConfigError: it is not one (no folder, no config, another model type).
    """
    folder = Path(path)
    config = folder / "config.json"
    if not config.is_file():
        raise ConfigError(
            f"{key}: {path!r} is neither pocketsphinx nor a Whisper checkpoint folder "
            "(no config.json)",
            key=key,
        )
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as exc:
        raise ConfigError(f"{key}: {path!r}: unreadable config.json ({exc})", key=key) from exc
    if model_type != "whisper":
        raise ConfigError(
            f"{key}: {path!r} is a {model_type!r} checkpoint, not a Whisper one", key=key
        )
    return folder


@final
@dataclass(frozen=True, slots=True)
class WhisperStatistics:
    """What the runner has done.

    Args:
        generates: batched ``generate`` calls (one per `run_batch` with work).
        rows: windows transcribed in them (largest batch: ``largest``).
        largest: the most rows of one call.
        skipped: chunks answered without a decode: partial ones under `PARTIAL_MS` of new
            audio, and any with no audio since the stream's last transcription.
        windows_sealed: full 30 s windows fixed as a prefix.
        evicted: streams dropped to open a new one beyond ``max_streams``.
        open_streams: streams open now.
    """

    generates: int
    rows: int
    largest: int
    skipped: int
    windows_sealed: int
    evicted: int
    open_streams: int


@dataclass(slots=True, eq=False)
class _Stream:
    """One open stream: its current window's audio and the text of the windows before."""

    key: str
    window: npt.NDArray[np.int16] = field(default_factory=lambda: np.zeros(0, np.int16))
    prefix: str = ""
    text: str = ""
    fresh: int = 0  # samples since the last transcription of the window
    decoded: bool = False  # ``text`` is a transcription of the window (as of ``fresh`` 0)

    def feed(self, pcm: npt.NDArray[np.int16]) -> list[npt.NDArray[np.int16]]:
        """Add audio; returns the windows it filled (each to be transcribed and fixed)."""
        sealed = []
        pcm = np.asarray(pcm, np.int16).reshape(-1)
        self.fresh += pcm.size
        while self.window.size + pcm.size > WINDOW_SAMPLES:
            room = WINDOW_SAMPLES - self.window.size
            sealed.append(np.concatenate([self.window, pcm[:room]]))
            self.window, pcm = np.zeros(0, np.int16), pcm[room:]
        self.window = np.concatenate([self.window, pcm])
        return sealed


class _Job(Enum):
    """What a batch does for one chunk, in order, once its ``generate`` has run."""

    SEAL = "seal"  # a full window's text (a row) joins the stream's fixed prefix
    ANSWER = "answer"  # the chunk's answer is its window's text (a row) after the prefix
    DONE = "done"  # closed with nothing left in its window: the prefix is the transcript
    LAST = "last"  # no decode needed (or aborted): the last answer again


def _quiet_max_length(record: logging.LogRecord) -> bool:
    """False for transformers' per-call warning that ``max_new_tokens`` wins over
    ``max_length`` (a filter is added once: the same function object)."""
    return not str(record.msg).startswith("Both `max_new_tokens`")


def _join(prefix: str, text: str) -> str:
    return " ".join(part for part in (prefix.strip(), text.strip()) if part)


@final
class WhisperRunner:
    """Whisper from a local checkpoint folder, every stream that needs an answer in one
    batched ``generate`` (the `BatchRunner` shape; blocking: it runs off the trio thread).

    Args:
        folder: a Whisper checkpoint (``config.json``, weights, the processor's files).
        device: torch device (``engine.model_device``); float16 on a GPU, float32 on the CPU.
        max_batch: the most chunks one call takes.
        partial_ms: new audio before a partial chunk is transcribed again.
        max_new_tokens: the most tokens one window decodes to (capped by the model's
            ``max_target_positions``).
        max_streams: the most streams open at once (a new one beyond it evicts the oldest).
    """

    name = "asr"

    def __init__(
        self,
        folder: str | Path,
        *,
        device: str = "cpu",
        max_batch: int = 32,
        partial_ms: float = PARTIAL_MS,
        max_new_tokens: int = MAX_NEW_TOKENS,
        max_streams: int = 256,
    ) -> None:
        self.folder = check_whisper_folder(str(folder))
        self.device = device
        self.max_batch = max_batch
        self._partial = int(partial_ms * ASR_SAMPLE_RATE / 1000.0)
        self._max_new_tokens = max_new_tokens
        self._max_streams = max_streams
        self._open: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._model: Any = None
        self._processor: Any = None
        self._language: dict[str, str] = {}
        self._counts = {"generates": 0, "rows": 0, "largest": 0, "skipped": 0}
        self._counts |= {"windows_sealed": 0, "evicted": 0}

    def prepare(self) -> None:
        """Load the model and processor (blocking: seconds for a real checkpoint).

        Raises:
            ConfigError: the folder does not load as a Whisper checkpoint.
        """
        import torch
        from transformers import WhisperForConditionalGeneration, WhisperProcessor

        dtype = torch.float16 if self.device.startswith("cuda") else torch.float32
        try:
            processor = WhisperProcessor.from_pretrained(self.folder, local_files_only=True)
            model = WhisperForConditionalGeneration.from_pretrained(
                self.folder, local_files_only=True, dtype=dtype
            )
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"agent.asr: {str(self.folder)!r} does not load as a Whisper checkpoint: {exc}",
                key="agent.asr",
            ) from exc
        self._model = model.to(self.device).eval()
        self._processor = processor
        self._dtype = dtype
        generation = model.generation_config
        # ``max_new_tokens`` bounds every call, and transformers warns at each call that it
        # overrides a ``max_length`` (even its default): a log line per batch, dropped here
        logging.getLogger("transformers.generation.utils").addFilter(_quiet_max_length)
        # an English-only checkpoint (``*.en``) takes no language or task: it only transcribes
        if getattr(generation, "is_multilingual", False):
            self._language = {"language": "en", "task": "transcribe"}
        room = int(model.config.max_target_positions) - 4  # the forced prompt's tokens
        self._max_new_tokens = max(1, min(self._max_new_tokens, room))

    @property
    def metadata(self) -> Mapping[str, str]:
        return {"model": self.folder.name}

    @property
    def open_streams(self) -> int:
        return len(self._open)

    def statistics(self) -> WhisperStatistics:
        return WhisperStatistics(**self._counts, open_streams=len(self._open))

    def run_batch(self, requests: Sequence[AsrChunk], gate: UnitGate) -> list[AsrText]:
        """Apply every chunk in order, then one ``generate`` over the windows to transcribe,
        then the answers in order (a stream's answer sees the windows fixed before it).

        A ``generate`` that raises fails the batch: its chunks' audio stays in their streams
        (a stream goes on with its next chunk) and the streams it closed are gone (the agent
        link ends those turns with what it had heard)."""
        with self._lock:
            jobs: list[tuple[_Job, int, _Stream]] = []  # (what, request index, stream)
            rows: list[npt.NDArray[np.int16]] = []
            for index, request in enumerate(requests):
                self._plan(index, request, jobs, rows)
            texts = iter(self.transcribe(rows)) if rows else iter(())
            results: list[AsrText | None] = [None] * len(requests)
            for kind, index, stream in jobs:
                request = requests[index]
                if kind is _Job.SEAL:
                    stream.prefix = _join(stream.prefix, next(texts))
                elif kind is _Job.ANSWER:
                    stream.text = _join(stream.prefix, next(texts))
                    results[index] = AsrText(request.stream, stream.text, request.final)
                elif kind is _Job.DONE:
                    results[index] = AsrText(request.stream, stream.prefix, True)
                else:
                    final = request.final or request.abort
                    results[index] = AsrText(request.stream, stream.text, final)
            return [r for r in results if r is not None]

    def _plan(
        self,
        index: int,
        request: AsrChunk,
        jobs: list[tuple[_Job, int, _Stream]],
        rows: list[npt.NDArray[np.int16]],
    ) -> None:
        stream = self._open.get(request.stream)
        if request.abort:
            self._open.pop(request.stream, None)
            jobs.append((_Job.LAST, index, _Stream(request.stream)))
            return
        if stream is None:
            while len(self._open) >= self._max_streams:  # evict the oldest
                del self._open[next(iter(self._open))]
                self._counts["evicted"] += 1
            stream = self._open[request.stream] = _Stream(request.stream)
        for window in stream.feed(request.pcm):
            rows.append(window)
            jobs.append((_Job.SEAL, index, stream))
            self._counts["windows_sealed"] += 1
        # no audio since the window was last transcribed: greedy decoding would say the same
        unchanged = stream.decoded and stream.fresh == 0
        if request.final:
            del self._open[request.stream]
            if stream.window.size == 0:
                jobs.append((_Job.DONE, index, stream))
                return
        if unchanged or (
            not request.final and not request.provisional and stream.fresh < self._partial
        ):
            self._counts["skipped"] += 1
            jobs.append((_Job.LAST, index, stream))
            return
        stream.fresh = 0
        stream.decoded = True
        rows.append(stream.window.copy())
        jobs.append((_Job.ANSWER, index, stream))

    def features(self, windows: Sequence[npt.NDArray[np.int16]]) -> Any:
        """Whisper's log-mel input of each window, padded to 30 s (a float32 tensor).

        The feature extractor pads every input with zeros to 30 s before its STFT, and
        frames of zeros all come out as the same floor value (the row's maximum less 8,
        normalised). So the STFT runs over the longest window and ``n_fft`` zeros after it,
        and the rest of the 3000 frames repeat its last (all-zero) frame: the same
        features, for a turn of 3 s a tenth of the work. With ``dither`` (noise added to
        every sample) the padding is not zeros, and the whole 30 s is computed.
        """
        import torch

        extractor = self._processor.feature_extractor
        audio = [pcm16_to_float(w) for w in windows]
        full = int(extractor.n_samples)
        hop = int(extractor.hop_length)
        length = full
        if not getattr(extractor, "dither", 0.0):
            needed = max(a.size for a in audio) + int(extractor.n_fft)
            length = min(full, -(-needed // hop) * hop)
        features = extractor(
            audio,
            sampling_rate=ASR_SAMPLE_RATE,
            return_tensors="pt",
            max_length=length,
            device=self.device,
        ).input_features
        missing = full // hop - features.shape[-1]
        if missing > 0:
            features = torch.cat([features, features[..., -1:].expand(-1, -1, missing)], dim=-1)
        return features

    def transcribe(self, windows: Sequence[npt.NDArray[np.int16]]) -> list[str]:
        """The text of each window (int16, 16 kHz, at most 30 s), in one batched ``generate``.

        Raises:
            RuntimeError: `prepare` has not run.
        """
        if self._model is None:
            raise RuntimeError("WhisperRunner.prepare() has not run")
        import torch

        features = self.features(windows).to(self.device, self._dtype)
        with torch.inference_mode():
            tokens = self._model.generate(
                features,
                **self._language,
                max_new_tokens=self._max_new_tokens,
                do_sample=False,
                num_beams=1,
                return_timestamps=False,
            )
        self._counts["generates"] += 1
        self._counts["rows"] += len(windows)
        self._counts["largest"] = max(self._counts["largest"], len(windows))
        texts: list[str] = self._processor.tokenizer.batch_decode(tokens, skip_special_tokens=True)
        return [text.strip() for text in texts]
