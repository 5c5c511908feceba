"""PersonaPlex system prompts: the token sequence a slot replays before it goes live.

NVIDIA's PersonaPlex loop (``LMGen.step_system_prompts``) conditions the model
with one LM call per frame of, in order:

1. the voice prompt: each 80 ms frame of a reference recording, Mimi-encoded,
   forced into the *agent* audio stream, with text PAD;
2. 0.5 s (6 frames) of silence: the agent stream forced to `SILENCE_CODES`, text PAD;
3. the text prompt: ``"<system> {text} <system>"`` tokenized by the checkpoint's
   sentencepiece model, one token per frame forced into the text stream, the
   agent stream forced to silence;
4. 6 more silence frames.

Throughout, the *user* stream gets `SINE_CODES` (the codes of a 440 Hz tone the
model was trained to read as "nobody is talking yet"). Each call provides the
tokens of column ``call + delay`` of every stream.

Our frame ``n`` is the reference's call ``n + 1`` (its call 0 runs no model and
everything it writes is overwritten by start tokens; that is what
``MoshiConfig.user_lag == 1`` mirrors). So a sequence of ``L`` calls is
`PromptReplay`: ``L - 1`` *held* frames that take the user codes from the
sequence (no user input is consumed) and force every stream, then the slot is
live; the streams with delay ``d`` keep being forced for ``d`` more frames (the
acoustic codebooks of the last silence frame reach the first live frame), as in
the reference, where they were written ahead of time.

Voices: a name resolves to ``voices/<name>.wav`` (or ``<name>.wav``) in the
checkpoint folder, else to ``voices/<name>.pt``. The reference normalises a WAV
to -24 LUFS (pyloudnorm); we scale it to -24 dBFS RMS, which is close for
speech but not identical.

A ``.pt`` voice is what the reference saves after a WAV voice pass
(``torch.save({"embeddings", "cache"})``): the temporal transformer's input
embedding of each column it consumed (columns ``0 .. V-2`` of a ``V``-frame
voice, ``[V-1, 1, 1, dim]``, summed audio codebooks first, then text, in the
model's dtype) and its token ring (``[1, 1+n_q, max_delay+3]``, slot
``c % width`` holding column ``c``). Those columns are known except for the
agent codes (``_voice_columns``), so we turn the file back into the voice's Mimi
codes and replay them like a WAV's:

1. the file is read with ``torch.load(weights_only=True)`` (no code runs) and
   its keys, shapes and dtypes are checked;
2. column 0 must embed to the start tokens (a cheap test of the checkpoint);
3. each column's unknown agent codes are found with *this* checkpoint's
   embedding tables, in float32: subtract the known rows (text PAD, the user
   SINE codes or start tokens), then coordinate descent over the unknown
   codebooks, each step the nearest code to what the others leave; a column
   that does not verify is retried from a greedy start, then from seeded
   random starts;
4. the last columns are read from the token ring (column ``V-1`` whole, the
   delayed rows of column ``V``);
5. every column is embedded again in the reference's order and dtype and must
   match the file (every entry within ``2 * eps * max|column|``, ``eps`` of
   the file's dtype: 2 to 4 ulps of the column's largest entry; with the
   checkpoint that made the file the match is exact), and the ring's written
   rows must equal the columns.

A voice made with other weights fails 2 or 5 and is refused. The voice's frame
0 does not reach the model (the reference discards it), so the recovered codes
hold `SILENCE_CODES` there; the replay is then the WAV voice's, token for token.
The reference replays a ``.pt`` by stepping its transformer on the embeddings
and copying the ring back, which leaves the model as the WAV pass did; so does
replaying the codes. The search reads `VoiceTables`, host copies of the rows
taken when a prompt-capable runner starts, so it never touches the model's
device from the caller's thread.
"""

from __future__ import annotations

import pickle
import re
import threading
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, final

import numpy as np
import numpy.typing as npt
import torch

from duplex.exceptions import PromptUnsupported

from .._uploaded_voices import uploaded_voice_path
from ._config import MoshiConfig

if TYPE_CHECKING:
    from ._lm import MoshiLM

__all__ = [
    "PROMPT_SILENCE_FRAMES",
    "SILENCE_CODES",
    "SINE_CODES",
    "PromptReplay",
    "Voice",
    "VoiceLibrary",
    "VoiceTables",
    "build_replay",
    "prompt_codes",
    "voice_codes_from_embeddings",
    "wrap_with_system_tags",
]

SILENCE_CODES = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)
"""The reference's Mimi codes of a silent frame (``lm.SILENCE_TOKENS``)."""
SINE_CODES = (430, 1268, 381, 1611, 1095, 1495, 56, 472)
"""The reference's Mimi codes of a 440 Hz tone frame (``lm.SINE_TOKENS``)."""
PROMPT_SILENCE_FRAMES = 6
"""``int(0.5 s * 12.5 Hz)``: silence frames after the voice and after the text prompt."""
_TARGET_RMS = 10 ** (-24 / 20)
_VOICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_UNWRITTEN = -2
"""A ring row the reference has not written yet (its ``ungenerated_token_id``)."""
_UNKNOWN = -3
"""A placeholder code: the agent rows of a column that a voice frame fills."""
_SWEEPS = 8
_RESTARTS = 16
_EMBEDDING_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def wrap_with_system_tags(text: str) -> str:
    """``"<system> text <system>"`` unless the text already carries the tags (as the reference)."""
    cleaned = text.strip()
    if cleaned.startswith("<system>") and cleaned.endswith("<system>"):
        return cleaned
    return f"<system> {cleaned} <system>"


def prompt_codes(config: MoshiConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(silence, sine) codes for ``config``'s codebooks.

    The reference constants belong to the official 2048-bin Mimi; for other codecs
    (``tiny``) they are taken modulo ``card``, arbitrary but fixed codes.
    """
    if config.agent_q != len(SILENCE_CODES) or config.user_q != len(SINE_CODES):
        raise PromptUnsupported(f"{config.name}: prompts need 8 agent and 8 user codebooks")
    return (
        tuple(c % config.card for c in SILENCE_CODES),
        tuple(c % config.card for c in SINE_CODES),
    )


@final
@dataclass(frozen=True, slots=True)
class PromptReplay:
    """One prompt as per-frame tensors (see the module docstring).

    Args:
        held: frames that consume no user input (``L - 1``).
        user: ``[held, user_q]`` user codes of the held frames.
        forced: ``[held + max_delay, 1 + agent_q]`` tokens forced at each frame
            (``-1``: sample); the rows past ``held`` force only delayed streams.
    """

    held: int
    user: torch.Tensor = field(repr=False)
    forced: torch.Tensor = field(repr=False)

    @property
    def frames(self) -> int:
        """Frames with any forcing (held plus the delayed tail)."""
        return int(self.forced.shape[0])


def build_replay(
    config: MoshiConfig,
    initial: list[int],
    text_tokens: list[int],
    voice_codes: torch.Tensor | None,
    device: torch.device,
) -> PromptReplay:
    """The `PromptReplay` of a voice (``[V, agent_q]`` codes) and text tokens.

    Args:
        config: the LM's configuration (delays, PAD, codebooks).
        initial: the start token of every stream (``MoshiLM.initial_tokens``).
        text_tokens: the tokenized, tagged text prompt (may be empty).
        voice_codes: the voice prompt's Mimi codes, or ``None``.
        device: where the tensors live.
    """
    silence, sine = prompt_codes(config)
    pad = config.text_padding_id
    agent = config.agent_q
    rows: list[list[int]] = []  # per reference call: text, agent codes..., user codes...
    if voice_codes is not None:
        for codes in voice_codes.tolist():
            rows.append([pad, *codes, *sine])
    rows += [[pad, *silence, *sine]] * PROMPT_SILENCE_FRAMES
    rows += [[token, *silence, *sine] for token in text_tokens]
    rows += [[pad, *silence, *sine]] * PROMPT_SILENCE_FRAMES
    calls = torch.tensor(rows, dtype=torch.long)
    length = calls.shape[0]
    held = length - 1
    delays = config.delays[: 1 + agent]
    forced = torch.full((held + max(delays), 1 + agent), -1, dtype=torch.long)
    for n in range(forced.shape[0]):
        column = n + 1  # frame n samples column n + 1 (the reference's call n + 1)
        for k, delay in enumerate(delays):
            source = column - delay
            if column <= delay:
                forced[n, k] = initial[k]  # the reference overwrites these with start tokens
            elif source < length:
                forced[n, k] = calls[source, k]
    user = calls[1:, 1 + agent :]
    return PromptReplay(held, user.to(device), forced.to(device))


def _voice_columns(config: MoshiConfig, voice: torch.Tensor, stop: int) -> torch.Tensor:
    """Columns ``0 .. stop-1`` of the reference's voice pass, ``[stop, 1 + n_q]``.

    The pass makes ``V = len(voice)`` calls; call ``t`` writes text PAD,
    ``voice[t]`` and the SINE codes at column ``t + delay`` of each stream, and
    the reference writes start tokens where ``column <= delay``. Rows no call
    wrote are ``-2``.
    """
    _, sine = prompt_codes(config)
    calls = voice.shape[0]
    initial = [config.text_card] + [config.card] * config.n_q
    columns = torch.full((stop, config.num_streams), _UNWRITTEN, dtype=torch.long)
    for k, delay in enumerate(config.delays):
        for c in range(stop):
            if c <= delay:
                if c < calls:  # call c writes its start tokens
                    columns[c, k] = initial[k]
            elif c - delay >= calls:
                continue
            elif k == 0:
                columns[c, k] = config.text_padding_id
            elif k <= config.agent_q:
                columns[c, k] = voice[c - delay, k - 1]
            else:
                columns[c, k] = sine[k - 1 - config.agent_q]
    return columns


@final
@dataclass(frozen=True, slots=True)
class VoiceTables:
    """Host copies of the temporal input-embedding rows a `.pt` voice is a sum of.

    Taken once from the LM (`of`), so turning a voice back into codes, which runs on
    the caller of `Engine.acquire_slot`, never touches the model's device.

    Args:
        config: the LM's configuration.
        text: ``[2, dim]``: the text PAD and start tokens.
        agent: ``[agent_q, card + 1, dim]``: every agent code and the start token.
        user: ``[user_q, 2, dim]``: each user codebook's SINE code and start token.
    """

    config: MoshiConfig
    text: torch.Tensor = field(repr=False)
    agent: torch.Tensor = field(repr=False)
    user: torch.Tensor = field(repr=False)

    @staticmethod
    def of(lm: MoshiLM) -> VoiceTables:
        """Copy the rows out of ``lm`` (in its dtype)."""
        config = lm.config
        _, sine = prompt_codes(config)
        agent = config.agent_q
        with torch.no_grad():
            text = lm.text_emb.weight[[config.text_padding_id, config.text_card]].cpu()
            agents = torch.stack([lm.emb[j].weight.cpu() for j in range(agent)])
            users = torch.stack(
                [lm.emb[agent + j].weight[[code, config.card]].cpu() for j, code in enumerate(sine)]
            )
        return VoiceTables(config, text, agents, users)

    def embed(self, columns: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``[N, dim]`` inputs of ``[N, 1 + n_q]`` columns as the reference sums them:
        audio codebooks in order, then text, each row and sum in ``dtype``.

        Text must be PAD or start tokens and user rows SINE or start tokens.
        """
        config = self.config
        total: torch.Tensor | None = None
        for k in range(1, config.num_streams):
            ids = columns[:, k]
            if k <= config.agent_q:
                row = self.agent[k - 1][ids]
            else:
                row = self.user[k - 1 - config.agent_q][(ids == config.card).long()]
            row = row.to(dtype)
            total = row if total is None else total + row
        text = self.text[(columns[:, 0] == config.text_card).long()].to(dtype)
        return text if total is None else total + text


def _matches(embedded: torch.Tensor, saved: torch.Tensor) -> torch.Tensor:
    """Per row: within ``2 * eps`` (of ``saved``'s dtype) of the row's largest entry."""
    eps = torch.finfo(saved.dtype).eps
    saved32 = saved.float()
    scale = saved32.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
    return (embedded.float() - saved32).abs().amax(dim=1) <= 2 * eps * scale


def _descend(
    target: torch.Tensor, free: torch.Tensor, tables: torch.Tensor, codes: torch.Tensor
) -> torch.Tensor:
    """Coordinate descent: each free code becomes the nearest to what the others leave.

    Args:
        target: ``[n, dim]`` float32, the sum the free codes' embeddings should make.
        free: ``[n, J]`` which codes are unknown (the others contribute nothing here).
        tables: ``[J, card, dim]`` float32.
        codes: ``[n, J]`` the start; updated and returned.
    """
    norms = tables.square().sum(dim=2)
    books = torch.arange(tables.shape[0])
    parts = tables[books[None, :], codes] * free[..., None]
    for _ in range(_SWEEPS):
        changed = False
        for j in range(tables.shape[0]):
            rows = free[:, j]
            if not rows.any():
                continue
            rest = target[rows] - parts[rows].sum(dim=1) + parts[rows, j]
            best = (2 * rest @ tables[j].T - norms[j]).argmax(dim=1)
            changed = changed or bool((best != codes[rows, j]).any())
            codes[rows, j] = best
            parts[rows, j] = tables[j, best]
        if not changed:
            break
    return codes


def _pursue(target: torch.Tensor, free: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """Greedy start: take the free (codebook, code) that best explains the rest, repeatedly."""
    norms = tables.square().sum(dim=2)
    card = tables.shape[1]
    codes = torch.zeros(free.shape, dtype=torch.long)
    free = free.clone()
    rest = target.clone()
    for _ in range(tables.shape[0]):
        rows = free.any(dim=1).nonzero()[:, 0]
        if rows.numel() == 0:
            break
        score = 2 * torch.einsum("nd,jcd->njc", rest[rows], tables) - norms
        score = score.masked_fill(~free[rows][..., None], float("-inf"))
        best = score.flatten(1).argmax(dim=1)
        book, code = best // card, best % card
        codes[rows, book] = code
        free[rows, book] = False
        rest[rows] -= tables[book, code]
    return codes


def _invert(
    tables: VoiceTables, columns: torch.Tensor, free: torch.Tensor, saved: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fill the ``free`` agent rows of ``columns`` so each column embeds to ``saved``.

    Returns the filled columns and which of them match ``saved`` (`_matches`).
    """
    config = tables.config
    every = tables.agent.float()
    agent = every[:, : config.card]  # candidates: real codes, not the start token
    known = columns.clone()
    agent_rows = known[:, 1 : 1 + config.agent_q]
    agent_rows[free] = 0
    parts = every[torch.arange(config.agent_q)[None, :], agent_rows]
    fixed = tables.embed(known, torch.float32) - (parts * free[..., None]).sum(dim=1)
    target = saved.float() - fixed  # what the free codes' embeddings must sum to

    def attempt(rows: torch.Tensor, start: torch.Tensor) -> None:
        codes = _descend(target[rows], free[rows], agent, start)
        filled = columns[rows].clone()
        filled[:, 1 : 1 + config.agent_q] = torch.where(
            free[rows], codes, filled[:, 1 : 1 + config.agent_q]
        )
        ok = _matches(tables.embed(filled, saved.dtype), saved[rows])
        columns[rows] = torch.where(ok[:, None], filled, columns[rows])
        good[rows] = ok

    good = torch.zeros(columns.shape[0], dtype=torch.bool)
    attempt(torch.arange(columns.shape[0]), torch.zeros(free.shape, dtype=torch.long))
    if (~good).sum() * 2 > columns.shape[0]:
        return columns, good  # mostly wrong: other weights, not an unlucky start
    rows = (~good).nonzero()[:, 0]
    if rows.numel():
        attempt(rows, _pursue(target[rows], free[rows], agent))
    generator = torch.Generator().manual_seed(0)
    for _ in range(_RESTARTS):
        rows = (~good).nonzero()[:, 0]
        if rows.numel() == 0:
            break
        start = torch.randint(0, config.card, (rows.numel(), config.agent_q), generator=generator)
        attempt(rows, start)
    return columns, good


def voice_codes_from_embeddings(path: Path, tables: VoiceTables) -> torch.Tensor:
    """The Mimi codes ``[V, agent_q]`` of a reference ``.pt`` voice (module docstring).

    Row 0 (a frame the reference discards) is `SILENCE_CODES`.

    Raises:
        PromptUnsupported: not a ``.pt`` voice file, or not one made with these weights.
    """
    config = tables.config
    silence, _ = prompt_codes(config)
    name = path.name
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PromptUnsupported(f"voice {name}: not a readable torch file ({first})") from None
    if not isinstance(state, dict) or set(state) != {"embeddings", "cache"}:
        raise PromptUnsupported(
            f"voice {name}: expected a dict of 'embeddings' and 'cache' (a PersonaPlex voice)"
        )
    saved, cache = state["embeddings"], state["cache"]
    width = config.max_delay + 3
    if (
        not isinstance(saved, torch.Tensor)
        or saved.dim() != 4
        or saved.shape[0] < 1
        or saved.shape[1:] != (1, 1, config.dim)
        or saved.dtype not in _EMBEDDING_DTYPES
    ):
        what = tuple(saved.shape) if isinstance(saved, torch.Tensor) else type(saved).__name__
        raise PromptUnsupported(
            f"voice {name}: embeddings must be [N, 1, 1, {config.dim}] bfloat16, float16 or "
            f"float32 with N >= 1, got {what}"
        )
    if (
        not isinstance(cache, torch.Tensor)
        or cache.shape != (1, config.num_streams, width)
        or cache.dtype != torch.long
    ):
        what = tuple(cache.shape) if isinstance(cache, torch.Tensor) else type(cache).__name__
        raise PromptUnsupported(
            f"voice {name}: cache must be int64 [1, {config.num_streams}, {width}], got {what}"
        )
    if not torch.isfinite(saved).all():
        raise PromptUnsupported(f"voice {name}: embeddings are not finite")
    saved = saved[:, 0, 0]
    count = saved.shape[0]  # columns 0 .. V-2
    frames = count + 1
    mismatch = PromptUnsupported(
        f"voice {name}: its embeddings do not match this checkpoint (made with other weights?)"
    )
    # columns from placeholder codes: the agent rows a voice frame fills are the unknowns
    columns = _voice_columns(
        config, torch.full((frames, config.agent_q), _UNKNOWN), frames + config.max_delay
    )
    if not _matches(tables.embed(columns[:1], saved.dtype), saved[:1]).all():
        raise mismatch  # column 0 is all start tokens: no unknowns
    agent = slice(1, 1 + config.agent_q)
    free = columns[:count, agent] == _UNKNOWN
    head, good = _invert(tables, columns[:count].clone(), free, saved)
    if not good.all():
        raise mismatch
    # the last columns come from the ring: slot c % width holds column c
    tail = columns[count : frames + config.max_delay]
    ring = cache[0].T[[c % width for c in range(count, frames + config.max_delay)]]
    written = tail != _UNWRITTEN
    unknown = tail == _UNKNOWN
    tail = torch.where(unknown, ring, tail)
    codes = ring[unknown]
    if bool(((codes < 0) | (codes >= config.card)).any()) or not torch.equal(
        ring[written], tail[written]
    ):
        raise mismatch
    full = torch.cat([head, tail])
    voice = torch.tensor([silence] * frames, dtype=torch.long)
    for k, delay in enumerate(config.delays[agent], start=1):
        rows = range(delay + 1, frames + delay)  # column c holds frame c - delay
        voice[[c - delay for c in rows], k - 1] = full[list(rows), k]
    return voice


VoiceStamp = tuple[int, int, int] | None
"""An uploaded voice file's (inode, size, mtime_ns); ``None`` for a checkpoint's voice."""


@final
@dataclass(frozen=True, slots=True)
class Voice:
    """One loaded voice prompt: its 24 kHz PCM (a WAV) or its Mimi codes (a `.pt`).

    Args:
        pcm: mono float32 samples, scaled as `VoiceLibrary` does.
        codes: ``[V, agent_q]`` codes recovered by `voice_codes_from_embeddings`.
        stamp: an uploaded voice's file (inode, size, mtime) when it was read.
    """

    pcm: npt.NDArray[np.float32] | None = field(default=None, repr=False)
    codes: torch.Tensor | None = field(default=None, repr=False)
    stamp: VoiceStamp = None
    """An uploaded voice's file identity when read (``None``: a checkpoint's voice)."""

    def __post_init__(self) -> None:
        if (self.pcm is None) == (self.codes is None):
            raise ValueError("a Voice holds either PCM or codes")


@final
class VoiceLibrary:
    """Voice prompts of one checkpoint folder, each read once and kept (PCM or codes).

    Thread-safe: `check` runs on the caller of `Engine.acquire_slot`, `voice` on the
    engine's step thread.

    Args:
        folder: the checkpoint folder (``voices/`` inside it is searched first);
            ``None`` for random weights, which have no voice files.
        sample_rate: Mimi's sample rate.
        lm: the prompted LM: the embedding rows ``.pt`` voices are read with are
            copied to the host here (`VoiceTables`: about 134 MB for the 7B), so the
            search never touches the GPU from the caller's thread.
        uploaded: the folder of uploaded voices (``POST /v1/audio/voices``), searched
            after the checkpoint's; its files may change, so `check` re-reads a voice
            whose file is not the one it read (deleted and uploaded again).
    """

    def __init__(
        self,
        folder: Path | None,
        sample_rate: int,
        lm: MoshiLM | None = None,
        uploaded: Path | None = None,
    ) -> None:
        self._folder = folder
        self._rate = sample_rate
        self._uploaded = uploaded
        self._lock = threading.Lock()
        self._voices: dict[str, Voice] = {}
        self._tables = VoiceTables.of(lm) if lm is not None else None

    def check(self, name: str) -> None:
        """Load ``name`` (if not already loaded, or if its uploaded file changed).

        Raises:
            PromptUnsupported: a bad name, no such voice, an unreadable WAV, or a
                ``.pt`` that is malformed or made with other weights.
        """
        with self._lock:
            known = self._voices.get(name)
        if known is not None and (known.stamp is None or known.stamp == self._stamp(name)):
            return
        voice = self._load(name)
        with self._lock:
            self._voices[name] = voice

    def voice(self, name: str) -> Voice:
        """The voice as `check` last read it (loading it if `check` did not): a session
        admitted with an uploaded voice keeps it though the file goes meanwhile."""
        with self._lock:
            known = self._voices.get(name)
        if known is not None:
            return known
        self.check(name)
        with self._lock:
            return self._voices[name]

    def _stamp(self, name: str) -> VoiceStamp:
        path = uploaded_voice_path(self._uploaded, name)
        if path is None:
            return None
        try:
            status = path.stat()
        except OSError:
            return None
        return (status.st_ino, status.st_size, status.st_mtime_ns)

    def _in_checkpoint(self, stem: str) -> bool:
        if self._folder is None:
            return False
        candidates = (
            self._folder / "voices" / f"{stem}.wav",
            self._folder / f"{stem}.wav",
            self._folder / "voices" / f"{stem}.pt",
        )
        return any(path.is_file() for path in candidates)

    def _load(self, name: str) -> Voice:
        stem = name.removesuffix(".wav").removesuffix(".pt")
        if not _VOICE_NAME.match(stem) or ".." in stem:
            raise PromptUnsupported(f"voice name {name!r} is not a plain file name")
        if not self._in_checkpoint(stem):
            path = uploaded_voice_path(self._uploaded, name)
            if path is not None:
                stamp = self._stamp(name)
                return Voice(pcm=_read_wav(path, self._rate), stamp=stamp)
        if self._folder is None:
            raise PromptUnsupported(
                f"no voice {stem!r}: a model with random weights has none but uploaded ones"
                " (GET /v1/audio/voices)"
            )
        for path in (self._folder / "voices" / f"{stem}.wav", self._folder / f"{stem}.wav"):
            if path.is_file():
                return Voice(pcm=_read_wav(path, self._rate))
        path = self._folder / "voices" / f"{stem}.pt"
        if path.is_file():
            if self._tables is None:
                raise PromptUnsupported(f"voice {stem!r}: this model takes no prompts")
            return Voice(codes=voice_codes_from_embeddings(path, self._tables))
        raise PromptUnsupported(
            f"no voice {stem!r} in {self._folder} (voices/{stem}.wav or voices/{stem}.pt)"
        )


def _read_wav(path: Path, rate: int) -> npt.NDArray[np.float32]:
    """A PCM WAV as mono float32 at ``rate`` (linear resampling), scaled to -24 dBFS RMS."""
    try:
        with wave.open(str(path), "rb") as wav:
            width, channels, src_rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
            raw = wav.readframes(wav.getnframes())
    except (OSError, EOFError, wave.Error) as exc:
        raise PromptUnsupported(f"{path}: not a readable PCM WAV ({exc})") from None
    kinds = {1: ("u1", 128.0, 128.0), 2: ("<i2", 0.0, 32768.0), 4: ("<i4", 0.0, 2.0**31)}
    if width not in kinds:
        raise PromptUnsupported(f"{path}: {8 * width}-bit WAV is not supported (8, 16, 32 bit)")
    dtype, offset, scale = kinds[width]
    samples = (np.frombuffer(raw, dtype=dtype).astype(np.float64) - offset) / scale
    samples = samples.reshape(-1, channels).mean(axis=1)
    if samples.size == 0:
        raise PromptUnsupported(f"{path}: the WAV holds no samples")
    if src_rate != rate:
        count = max(1, round(samples.size * rate / src_rate))
        samples = np.interp(np.arange(count) * src_rate / rate, np.arange(samples.size), samples)
    rms = float(np.sqrt(np.mean(samples**2)))
    if rms > 0:
        samples = samples * (_TARGET_RMS / rms)
    return np.clip(samples, -1.0, 1.0).astype(np.float32)
