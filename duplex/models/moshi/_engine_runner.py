"""Moshi behind the engine: PCM frames in, PCM frames and text out, per slot.

`MoshiEngineRunner` is the `ModelRunner` the ``tiny``, ``moshi-7b`` and
``personaplex-7b`` models run on. One ``execute`` over the live slots is:

1. Mimi-encode each slot's input frame (zeros on an underrun) to the
   ``user_q`` codes the LM listens to (its streams ``agent_q+1..n_q``);
2. one `MoshiRunner.step` over those slots (text, then ``agent_q`` audio codes);
3. Mimi-decode the audio codes of the slots past their first ``max_delay``
   frames, clipped to full scale (the others output a silent frame and their
   decoder has not started, as the reference ``LMGen`` returns nothing while
   it warms up);
4. copy the PCM, each slot's output level and text token to the host once, and
   map text tokens to text through a table (special tokens and PAD are ``""``).

``speaking``: the frame is past warm-up and either its text token is a word
piece (not PAD, end-of-padding or another special token) or its audio RMS
exceeds ``speech_rms`` (-40 dBFS by default). Moshi's text stream leads its
voice, and its voice can carry sound the text does not name (laughter, "hm"),
hence either signal.

``end_of_turn`` is always false: Moshi is full duplex and has no end-of-turn
token, and a pause in its speech is not a turn boundary it declared (a
session that wants turns from silence can run its VAD on the output).

Sampling seeds: every session that starts on a slot (it is in
``plan.new_slots``) takes the next *generation* of that slot, counted by the
runner, and its sampling noise is keyed by ``mix(seed, slot, generation)``
and the slot's frame counter; an epoch reset within the session (`reset_slot`
on a live slot) restarts with the same key. So a session's output depends
only on the configured seed, where it ran (slot and generation) and its own
input, never on its neighbours, and a server restarted with the same seed
replays it exactly.

Per-session sampling: a new slot's `SlotPrompt` may carry a `SamplingRequest`.
Its temperatures replace the runner's; its top-k values too, but never above
`MoshiEngineRunner.top_k_limits` (the widths the step was built for: a wider one
would widen every row's top-k and, on a GPU, capture new CUDA graphs mid-run),
and a top-k of 0 ("keep all") becomes that limit. Its seeds, when either is set,
key the slot's noise by ``session_seed(text_seed, audio_seed)`` instead of the
slot and generation, so the same seeds and input give the same output on any
slot, any server with the same weights. The slot has one noise key, so the two
seeds act as one pair. ``repetition_penalty``, ``repetition_penalty_context``
and ``pad_mult`` have no counterpart here and are ignored.

Prompts (PersonaPlex, ``spec.supports_prompts``: configs with ``user_lag == 1``):
a new slot's `SlotPrompt` becomes a `PromptReplay` (``_prompt.py``) built once
per distinct prompt (a WAV voice is Mimi-encoded once, through the new slot's
own encoder stream, which is then reset; a ``.pt`` voice's codes were recovered
from its embeddings when the slot was taken; the text is sentencepiece-encoded
inside the system tags). The slot's first ``held`` ticks replay it: their user codes
come from the replay (the engine holds the session's input, ``holds_input``),
their text and audio are forced, the slot's Mimi encoder and decoder do not
run, and the output is a silent frame with no text and ``speaking=False``.
The delayed streams stay forced for ``max_delay`` more frames, then the slot
samples freely. A `reset_slot` of a live slot replays the prompt again.

No host sync happens inside ``execute`` before the final copy-out: slot lists,
frame counters and warm-up are known on the host, and Mimi's code-range check
(a device read) is skipped because the codes come from ``card``-way sampling.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from pathlib import Path
from typing import final

import numpy as np
import sentencepiece
import torch

from duplex.exceptions import PromptUnsupported

from .._batcher import Priority
from .._interface import (
    FrameOutput,
    ModelSpec,
    SamplingRequest,
    SlotInput,
    SlotPrompt,
    StepOutput,
    StepPlan,
)
from .._streams import priority_stream
from ._checkpoint import LoadedMoshi
from ._kv import KVDtype
from ._mimi_streams import MimiStreams
from ._prompt import (
    PromptReplay,
    Voice,
    VoiceLibrary,
    VoiceStamp,
    build_replay,
    wrap_with_system_tags,
)
from ._runner import MoshiRunner, SlotSampling
from ._sampling import SamplingParams, effective_top_k

__all__ = ["MoshiEngineRunner", "session_seed", "stream_seed"]


def _mixed(key: str) -> int:
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def stream_seed(seed: int, slot: int, generation: int) -> int:
    """The sampling seed of the ``generation``-th session on ``slot`` (63-bit, well mixed)."""
    return _mixed(f"{seed}/{slot}/{generation}")


def session_seed(text_seed: int | None, audio_seed: int | None) -> int:
    """The noise key of a session that chose its seeds (63-bit; independent of the slot)."""
    return _mixed(f"session/{text_seed}/{audio_seed}")


@final
class MoshiEngineRunner:
    """Runs Moshi's LM and Mimi codec over the engine's live slots, one frame per tick.

    Args:
        loaded: the LM, Mimi and token texts of one checkpoint (all on one device).
        spec: the model spec; ``max_slots`` sizes every per-slot state.
        seed: base sampling seed (see the module docstring).
        sampling: temperature / top-k of text and audio; its ``seed`` is ignored.
        speech_rms: output RMS (full scale 1.0) above which a frame counts as speech.
        cuda_graphs: replay the LM step and Mimi's frames as CUDA graphs (default: on
            when the model is on CUDA).
        kv_dtype: storage of the temporal KV rings (default: the LM's dtype); float8
            e4m3 halves their bytes (the server's ``kv_cache_dtype = "fp8"``).

    Raises:
        ValueError: the spec's frame or rate is not Mimi's, or it claims prompts for a
            config that cannot take them.
    """

    _MAX_CACHED_PROMPTS = 64

    def __init__(
        self,
        loaded: LoadedMoshi,
        spec: ModelSpec,
        *,
        seed: int = 0,
        sampling: SlotSampling | None = None,
        speech_rms: float = 0.01,
        cuda_graphs: bool | None = None,
        kv_dtype: KVDtype | None = None,
        voice_dir: Path | None = None,
    ) -> None:
        mimi_config = loaded.mimi.config
        if (spec.sample_rate, spec.frame_samples) != (
            mimi_config.sample_rate,
            mimi_config.frame_size,
        ):
            raise ValueError(
                f"spec {spec.name!r} runs {spec.frame_samples} samples at {spec.sample_rate} Hz; "
                f"Mimi needs {mimi_config.frame_size} at {mimi_config.sample_rate} Hz"
            )
        self._spec = spec
        self._config = loaded.lm.config
        self._lm = MoshiRunner(
            loaded.lm, max_slots=spec.max_slots, cuda_graphs=cuda_graphs, kv_dtype=kv_dtype
        )
        self._mimi = MimiStreams(
            loaded.mimi,
            max_slots=spec.max_slots,
            num_codebooks=self._config.user_q,
            cuda_graphs=cuda_graphs,
        )
        self._device = loaded.lm.text_linear.weight.device
        self._stream = priority_stream(self._device, Priority.REALTIME)
        """Every device call of this runner (steps, resets, captures) runs on it: ahead of
        batch units on the same GPU (`priority_stream`)."""
        self._pieces = loaded.pieces
        self._seed = seed
        self._sampling = sampling or SlotSampling()
        self._speech_rms = speech_rms
        self._generation = np.full(spec.max_slots, -1, dtype=np.int64)
        self._requests: list[SamplingRequest | None] = [None] * spec.max_slots
        caps = self._lm.top_k_caps
        self._top_k_limits = (
            max(caps[0], effective_top_k(self._sampling.text, self._config.text_card)),
            max(caps[1], effective_top_k(self._sampling.audio, self._config.card)),
        )
        if spec.supports_prompts and self._config.user_lag != 1:
            raise ValueError(f"spec {spec.name!r} claims prompts; only PersonaPlex takes them")
        self._initial = loaded.lm.initial_tokens
        self._tokenizer_model = loaded.tokenizer
        self._voices = VoiceLibrary(
            None if loaded.checkpoint is None else loaded.checkpoint.folder,
            mimi_config.sample_rate,
            lm=loaded.lm if spec.supports_prompts else None,
            uploaded=voice_dir,
        )
        self._tokenizer: sentencepiece.SentencePieceProcessor | None = None
        self._slot_replays: list[PromptReplay | None] = [None] * spec.max_slots
        self._replays: OrderedDict[tuple[SlotPrompt, VoiceStamp], PromptReplay] = OrderedDict()
        """Replays by prompt and the voice file's stamp: an uploaded voice deleted and
        uploaded again under its name is a new replay."""
        self._voice_codes: dict[tuple[str, VoiceStamp], torch.Tensor] = {}
        self._stepped = False

    @property
    def spec(self) -> ModelSpec:
        """The model this runner executes."""
        return self._spec

    @property
    def lm_runner(self) -> MoshiRunner:
        """The token-level runner underneath (tests read frame counters through it)."""
        return self._lm

    @property
    def mimi_streams(self) -> MimiStreams:
        """The codec's per-slot streams."""
        return self._mimi

    def prepare_graphs(self) -> None:
        """Capture every batch bucket's CUDA graphs (LM step, Mimi encode and decode) now.

        The server calls it while the engine is built, before ``/health`` says ``ok``:
        captured lazily, a bucket's first step takes seconds and stalls every live
        session. On the CPU it only allocates the buckets' small static buffers.
        """
        with torch.cuda.stream(self._stream):
            self._lm.prepare_graphs()
            self._mimi.prepare([self._config.agent_q])

    def warm_up(self) -> None:
        """Step slot 0 on silence until it has decoded twice, then leave it as it was.

        The server calls it after `prepare_graphs`, before ``/health`` says ``ok``: what
        runs outside the captured graphs (the host copies, the output's level and text,
        the decode's row index) loads its kernels on first use, and the first served step
        had been a fresh server's first session's (one warm-up step in the first round on
        an H100). With it the first round on an H200 had no warm-up step and no late tick;
        its clients still saw missed ticks, whose cause is past the engine (docs/benchmarks.md,
        "One H200: 256 sessions served"). Its first step is the runner's one flagged
        warm-up; a session's first step is not.
        """
        slot, frame = 0, self._spec.frame_samples
        ticks = self._config.max_delay + 2  # decoding starts after max_delay frames
        for tick in range(ticks):
            first = tick == 0
            silence = SlotInput(slot, np.zeros(frame, np.float32), position=tick * frame)
            plan = StepPlan(
                tick=tick,
                frame_samples=frame,
                new_slots=(slot,) if first else (),
                continuing_slots=() if first else (slot,),
                released_slots=(),
                inputs=(silence,),
            )
            self.execute(plan)
        self._generation[slot] = -1  # as never used: its first session is generation 0
        self.reset_slot(slot)

    @property
    def top_k_limits(self) -> tuple[int, int]:
        """The largest (text, audio) top-k a session may ask for (see the module docstring)."""
        return self._top_k_limits

    def generation(self, slot: int) -> int:
        """Sessions started on ``slot`` so far, minus one (-1: none yet)."""
        return int(self._generation[slot])

    def reset_slot(self, slot: int) -> None:
        """Make the slot fresh in the LM and both Mimi directions; reseed its sampling.

        A live prompted slot replays its prompt again from its next tick.
        """
        with torch.cuda.stream(self._stream):
            self._mimi.reset_slot(slot)
            self._lm.reset_slot(slot, self._slot_sampling(slot))

    def check_prompt(self, prompt: SlotPrompt) -> None:
        """Refuse a prompt this checkpoint cannot replay; called when a slot is taken.

        Reads the voice's WAV, or recovers a ``.pt`` voice's codes (once per voice),
        so a bad voice fails the session's start, not a tick.

        Raises:
            PromptUnsupported: the model takes no prompts, or the voice is unusable.
        """
        if not self._spec.supports_prompts:
            raise PromptUnsupported(f"model {self._spec.name!r} takes no prompt")
        if prompt.voice:
            self._voices.check(prompt.voice)

    def replay(self, slot: int) -> PromptReplay | None:
        """The prompt replay of the slot's current session (``None``: unprompted)."""
        return self._slot_replays[slot]

    def execute(self, plan: StepPlan) -> StepOutput:
        """Encode, step and decode one frame for every live slot (see the module docstring).

        The output is flagged ``warmup`` on the runner's first step and on every step
        that captured a CUDA graph (a new bucket): their time is not the batch's.
        """
        with torch.cuda.stream(self._stream):
            return self._execute(plan)

    def _execute(self, plan: StepPlan) -> StepOutput:
        graphs = self._lm.graph_step.captured + self._mimi.captured
        for slot in plan.released_slots:
            self._requests[slot] = None
        for slot in plan.new_slots:  # already reset by the engine; start its next generation
            self._generation[slot] += 1
            prompt = plan.new_prompts.get(slot)
            self._requests[slot] = None if prompt is None else prompt.sampling
            self._lm.reset_slot(slot, self._slot_sampling(slot))
            replays = prompt is not None and not prompt.empty
            self._slot_replays[slot] = self._prepare(prompt.replay, slot) if replays else None
        slots = list(plan.live_slots)
        frame = self._spec.frame_samples
        frames = [self._lm.frames(s) for s in slots]
        replays = [self.replay(s) for s in slots]
        held = [r is not None and n < r.held for r, n in zip(replays, frames, strict=True)]
        for item, hold in zip(plan.inputs, held, strict=True):
            if hold and item.frame is not None:
                raise ValueError(f"slot {item.slot} replays its prompt; its input must be held")
        live = [r for r, hold in enumerate(held) if not hold]
        pcm_in = np.zeros((len(live), frame), dtype=np.float32)
        for row, r in enumerate(live):
            item = plan.inputs[r]
            if item.frame is not None:
                pcm_in[row] = item.frame
        warm = [
            not hold and n + 1 > self._config.max_delay
            for hold, n in zip(held, frames, strict=True)
        ]
        with torch.no_grad():
            user, forced = self._user_and_forced(slots, live, pcm_in, replays, frames)
            tokens = self._lm.step(slots, user, forced)
            pcm = torch.zeros(len(slots), frame, device=self._device)
            rows = [r for r, ok in enumerate(warm) if ok]
            if rows:
                index = torch.tensor(rows, device=self._device)
                decoded = self._mimi.decode(
                    [slots[r] for r in rows], tokens.audio[index], check_values=False
                )
                pcm[index] = decoded.float().clamp(-1.0, 1.0)  # PcmFrame is full scale
            level = pcm.square().mean(dim=1).sqrt()
            pcm_host = pcm.cpu().numpy()
            meta = torch.stack([tokens.text.double(), level.double()], dim=1).cpu().numpy()
        outputs = []
        for row, slot in enumerate(slots):
            text = "" if held[row] else self._piece(int(meta[row, 0]))
            speaking = warm[row] and (bool(text) or meta[row, 1] > self._speech_rms)
            replay = replays[row]
            holds = replay is not None and frames[row] + 1 < replay.held
            outputs.append(
                FrameOutput(
                    slot=slot,
                    pcm=pcm_host[row],
                    text=text,
                    speaking=bool(speaking),
                    holds_input=holds,
                )
            )
        captured = self._lm.graph_step.captured + self._mimi.captured > graphs
        warmup, self._stepped = captured or not self._stepped, True
        return StepOutput(tuple(outputs), warmup=warmup)

    def _user_and_forced(
        self,
        slots: list[int],
        live: list[int],
        pcm_in: np.ndarray,
        replays: list[PromptReplay | None],
        frames: list[int],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """User codes (Mimi for live rows, the replay's for held ones) and forced tokens."""
        config = self._config
        user = torch.zeros(len(slots), config.user_q, dtype=torch.long, device=self._device)
        if live:
            codes = self._mimi.encode(
                [slots[r] for r in live], torch.from_numpy(pcm_in).to(self._device)
            )
            user[torch.tensor(live, device=self._device)] = codes
        forced: torch.Tensor | None = None
        for row, (replay, n) in enumerate(zip(replays, frames, strict=True)):
            if replay is None or n >= replay.frames:
                continue
            if forced is None:
                forced = torch.full(
                    (len(slots), 1 + config.agent_q), -1, dtype=torch.long, device=self._device
                )
            forced[row] = replay.forced[n]
            if n < replay.held:
                user[row] = replay.user[n]
        return user, forced

    def _prepare(self, prompt: SlotPrompt, slot: int) -> PromptReplay:
        """Build (or reuse) the prompt's replay; a voice is encoded on ``slot``'s Mimi."""
        loaded = self._voices.voice(prompt.voice) if prompt.voice else None
        stamp = None if loaded is None else loaded.stamp
        cached = self._replays.get((prompt, stamp))
        if cached is not None:
            self._replays.move_to_end((prompt, stamp))
            return cached
        voice = None
        if prompt.voice and loaded is not None:
            voice = self._voice_codes.get((prompt.voice, stamp))
            if voice is None:
                voice = loaded.codes  # a .pt voice: its codes, recovered by check_prompt
                if voice is None:
                    voice = self._encode_voice(loaded, slot)
                self._voice_codes[(prompt.voice, stamp)] = voice
        tokens: list[int] = []
        if prompt.text and prompt.text.strip():
            tokens = list(self._text_tokenizer().Encode(wrap_with_system_tags(prompt.text)))
            if any(not 0 <= t < self._config.text_card for t in tokens):
                raise PromptUnsupported("the tokenizer produced ids outside the text vocabulary")
        replay = build_replay(self._config, self._initial, tokens, voice, self._device)
        self._replays[(prompt, stamp)] = replay
        while len(self._replays) > self._MAX_CACHED_PROMPTS:
            self._replays.popitem(last=False)
        return replay

    def _encode_voice(self, voice: Voice, slot: int) -> torch.Tensor:
        """The voice's Mimi codes ``[frames, agent_q]``, through the slot's (then reset) encoder."""
        pcm = voice.pcm
        assert pcm is not None
        frame = self._spec.frame_samples
        padded = np.zeros(-(-pcm.size // frame) * frame, dtype=np.float32)
        padded[: pcm.size] = pcm  # the reference pads the last frame with zeros
        codes = []
        with torch.no_grad():
            for start in range(0, padded.size, frame):
                chunk = torch.from_numpy(padded[start : start + frame]).to(self._device)
                codes.append(self._mimi.encode([slot], chunk[None])[0])
        self._mimi.reset_slot(slot)
        return torch.stack(codes)[:, : self._config.agent_q].cpu()

    def _text_tokenizer(self) -> sentencepiece.SentencePieceProcessor:
        if self._tokenizer is None:
            tokenizer = sentencepiece.SentencePieceProcessor()
            tokenizer.LoadFromSerializedProto(self._tokenizer_model)
            self._tokenizer = tokenizer
        return self._tokenizer

    def _piece(self, token: int) -> str:
        return self._pieces[token] if 0 <= token < len(self._pieces) else ""

    def _slot_sampling(self, slot: int) -> SlotSampling:
        """The runner's sampling, with the slot's session's request applied."""
        base, request = self._sampling, self._requests[slot]
        if request is None:
            seed = stream_seed(self._seed, slot, max(int(self._generation[slot]), 0))
            return SlotSampling(seed=seed, text=base.text, audio=base.audio)
        if request.text_seed is None and request.audio_seed is None:
            seed = stream_seed(self._seed, slot, max(int(self._generation[slot]), 0))
        else:
            seed = session_seed(request.text_seed, request.audio_seed)
        text_limit, audio_limit = self._top_k_limits
        text = _params(base.text, request.text_temperature, request.text_top_k, text_limit)
        audio = _params(base.audio, request.audio_temperature, request.audio_top_k, audio_limit)
        return SlotSampling(seed=seed, text=text, audio=audio)


def _params(
    base: SamplingParams, temperature: float | None, top_k: int | None, limit: int
) -> SamplingParams:
    """``base`` with a session's temperature and top-k (at most ``limit``; 0 means it)."""
    if temperature is not None:
        base = SamplingParams(float(temperature), base.top_k)
    if top_k is not None:
        base = SamplingParams(base.temperature, min(top_k, limit) if top_k > 0 else limit)
    return base
