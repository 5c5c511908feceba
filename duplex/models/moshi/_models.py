"""The ``--model`` values that name Moshi models, as registry entries (spec + factory).

``tiny`` is built (seeded, cached) and loaded; ``moshi-7b``, ``personaplex-7b``,
``PATH`` and ``PRESET:PATH`` are found by `find_checkpoint` and loaded. Finding
happens when the name is resolved (startup checks it, so a missing folder stops
``duplex serve`` with one line); building and loading happen in the factory,
when the engine starts.

With ``random_weights`` a preset name (``tiny``, ``moshi-7b``, ...) is built by
`random_moshi` on the model device instead: no folder is looked for, nothing is
written, and the runner is the same. A folder with ``random_weights`` is refused:
its weights would be ignored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import torch

from duplex.exceptions import ConfigError
from duplex.kernels.kv_int4 import int4_row_bytes
from duplex.progress import note

from .._interface import ModelRunner, ModelSpec, RunnerFactory
from .._options import ModelOptions
from ._checkpoint import (
    HF_REPOS,
    LoadedMoshi,
    find_checkpoint,
    load_checkpoint,
    mimi_for,
    random_moshi,
    tiny_checkpoint,
)
from ._config import MOSHI_PRESETS, MoshiConfig, moshi_preset
from ._engine_runner import MoshiEngineRunner
from ._fp8 import FP8_CAPABILITY, probe_tensor_cores
from ._kv import INT4, KVDtype
from ._mimi_config import MimiConfig
from ._mimi_weights import cast_mimi, expected_mimi_tensors, is_codebook
from ._weights import expected_tensors

__all__ = [
    "MOSHI_MODEL_NAMES",
    "memory_slots",
    "moshi_spec",
    "per_slot_bytes",
    "resolve_moshi",
    "weight_bytes",
]

MOSHI_MODEL_NAMES = ("tiny", *HF_REPOS)
"""Names resolved without a path; any folder path (or ``PRESET:PATH``) works too."""

_MAX_SLOTS = {"tiny": 16, "tiny-personaplex": 16}
_DEFAULT_MAX_SLOTS = 32  # 7B on CPU (a test or a demo): ~1.6 GB of KV ring a slot
MAX_GPU_SLOTS = 512
"""A sanity bound on a GPU slot pool (its CUDA graph buckets go up to the pool size); what
keeps a large pool on time is admission's step-time rule. It was 256 while 256 full-context
sessions of the 7B stepped over the frame on an H200 (88 ms); at 55 ms (docs/benchmarks.md,
"One H200 again") that bound only left about 16 of the card's int4 slots unused."""
GPU_RESERVE_BYTES = 4 << 30
"""Kept free on the GPU: allocator fragmentation, cuBLAS workspaces, graph pools."""
_SLOT_OVERHEAD = 1.1
"""Per-slot activations and graph buffers on top of the rings (measured peak on the
H200 at 64 slots: about 1.5 GiB a slot for 7B in bf16, rings 1.4 GiB)."""


def moshi_spec(preset: str, max_slots: int | None = None) -> ModelSpec:
    """The engine spec of a Moshi preset: 24 kHz, 80 ms frames, model-native turns;
    PersonaPlex presets (``user_lag == 1``) take prompts. ``max_slots``: the pool
    size (by default a fixed CPU-sized pool; on a GPU, `memory_slots`)."""
    return ModelSpec(
        name=preset,
        sample_rate=24_000,
        frame_samples=1_920,
        supports_video_input=False,
        supports_model_native_turn_policy=True,
        max_slots=max_slots or _MAX_SLOTS.get(preset, _DEFAULT_MAX_SLOTS),
        supports_prompts=moshi_preset(preset).user_lag == 1,
    )


_FP8_WEIGHTS = re.compile(
    r"^transformer\.layers\.\d+\.(self_attn\.in_proj_weight|self_attn\.out_proj\.weight"
    r"|gating\.linear_in\.weight|gating\.linear_out\.weight)$"
)
"""The LM tensors ``weight_dtype = "fp8"`` stores in e4m3 (`MoshiLM.temporal_to_fp8`)."""


def weight_bytes(
    lm: MoshiConfig,
    mimi: MimiConfig,
    *,
    lm_bytes: int = 2,
    mimi_bytes: int = 4,
    fp8_temporal: bool = False,
) -> int:
    """Bytes of the loaded weights: the LM at ``lm_bytes`` a value (its temporal linears at
    one byte and a float32 scale a row with ``fp8_temporal``), Mimi at ``mimi_bytes`` but for
    its codebook statistics (float32 in any dtype, as `cast_mimi` keeps them)."""
    lm_total = sum(
        math.prod(shape) + 4 * shape[0]
        if fp8_temporal and _FP8_WEIGHTS.match(name)
        else math.prod(shape) * lm_bytes
        for name, shape in expected_tensors(lm).items()
    )
    mimi_bytes_total = sum(
        math.prod(shape) * (4 if is_codebook(name) else mimi_bytes)
        for name, shape in expected_mimi_tensors(mimi).items()
    )
    return lm_total + mimi_bytes_total


KV_DTYPES: dict[str, KVDtype | None] = {"auto": None, "fp8": torch.float8_e4m3fn, "int4": INT4}
"""The temporal KV ring's storage for each ``kv_cache_dtype`` (``None``: the LM's dtype)."""
KV_BYTES: dict[str, float] = {"auto": 2, "fp8": 1, "int4": int4_row_bytes(128) / 128}
"""Bytes a stored value takes (int4: half a byte and its share of a float16 scale a group;
the 7B's and PersonaPlex's heads are 128 wide)."""
CODEC_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bf16": torch.bfloat16}
"""Mimi's compute dtype for each ``codec_dtype``."""


def per_slot_bytes(
    lm: MoshiConfig, mimi: MimiConfig, *, kv_bytes: float = 2, mimi_bytes: int = 4
) -> int:
    """Bytes one slot holds: its temporal KV ring, Mimi's rings, and working room."""
    rings = lm.kv_bytes_per_slot(kv_bytes) + mimi.kv_bytes_per_slot(mimi_bytes)
    return int(rings * _SLOT_OVERHEAD)


def memory_slots(
    free_bytes: int,
    weights: int,
    per_slot: int,
    *,
    reserve: int = GPU_RESERVE_BYTES,
    cap: int = MAX_GPU_SLOTS,
) -> int:
    """The largest slot pool that fits next to the weights in ``free_bytes`` (at most ``cap``).

    Raises:
        ConfigError: not even one slot fits.
    """
    slots = min(cap, (free_bytes - weights - reserve) // per_slot)
    if slots < 1:
        gib = 1 << 30
        raise ConfigError(
            f"not enough GPU memory for one session: {free_bytes / gib:.1f} GiB free, "
            f"weights {weights / gib:.1f} GiB, {per_slot / gib:.2f} GiB a session, "
            f"{reserve / gib:.0f} GiB kept free"
        )
    return int(slots)


def _spec_for(lm: MoshiConfig, mimi: MimiConfig, options: ModelOptions) -> ModelSpec:
    """On a GPU the pool is as large as free memory allows; on CPU it is fixed."""
    if not options.device.startswith("cuda"):
        return moshi_spec(lm.name)
    device = torch.device(options.device)
    if options.weight_dtype == "fp8":
        _check_fp8(device, options.device)
    free, _total = torch.cuda.mem_get_info(device)
    mimi_bytes = CODEC_DTYPES[options.codec_dtype].itemsize
    fp8 = options.weight_dtype == "fp8"
    weights = weight_bytes(lm, mimi, mimi_bytes=mimi_bytes, fp8_temporal=fp8)
    kv_bytes = KV_BYTES[options.kv_cache_dtype]
    per_slot = per_slot_bytes(lm, mimi, kv_bytes=kv_bytes, mimi_bytes=mimi_bytes)
    slots = memory_slots(free, weights, per_slot)
    return moshi_spec(lm.name, slots)


def _check_fp8(device: torch.device, named: str) -> None:
    """Raises ConfigError: fp8 weights would run emulated here (no fp8 tensor cores: slower
    and larger than bf16), or this torch's ``_scaled_mm`` does not compute on this card."""
    name = torch.cuda.get_device_name(device)
    if torch.cuda.get_device_capability(device) < FP8_CAPABILITY:
        raise ConfigError(
            f"weight_dtype = fp8 needs fp8 tensor cores (compute capability 8.9 or later); "
            f"{named} ({name}) has none, where fp8 weights would be slower and larger "
            "than bf16: use weight_dtype = auto"
        )
    problem = probe_tensor_cores(device)
    if problem is not None:
        raise ConfigError(f"weight_dtype = fp8 on {named} ({name}): {problem}; use auto")


def _check_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"model device {device!r} requested but no CUDA device is available")


def resolve_moshi(name: str, options: ModelOptions) -> tuple[ModelSpec, RunnerFactory] | None:
    """The spec and factory for a Moshi ``--model`` value, or ``None`` if it is not one.

    Raises:
        ConfigError: a Moshi checkpoint is named but missing or incomplete (the message
            names ``--random-weights``), the device is unavailable, or ``random_weights``
            is asked of a folder.
    """
    if options.random_weights:
        return _random(name, options)
    if name == "tiny":
        _check_device(options.device)
        cache = options.cache_folder

        def load_tiny(lm_dtype: torch.dtype) -> LoadedMoshi:
            checkpoint = tiny_checkpoint(cache, options.seed)
            return load_checkpoint(checkpoint, device=options.device, lm_dtype=lm_dtype)

        return moshi_spec("tiny"), _factory(load_tiny, options)
    found = find_checkpoint(name)
    if found is None:
        return None
    _check_device(options.device)

    def load(lm_dtype: torch.dtype) -> LoadedMoshi:
        return load_checkpoint(found, device=options.device, lm_dtype=lm_dtype)

    return _spec_for(found.lm, found.mimi, options), _factory(load, options)


def _random(name: str, options: ModelOptions) -> tuple[ModelSpec, RunnerFactory] | None:
    """A preset built with random weights; ``None`` for a name that is no Moshi model."""
    if name not in MOSHI_PRESETS:
        if find_checkpoint(name) is None:
            return None
        raise ConfigError(
            f"random_weights: {name!r} is a checkpoint folder, whose weights would be "
            f"ignored; drop --random-weights or name a preset ({', '.join(MOSHI_PRESETS)})"
        )
    _check_device(options.device)
    lm, mimi = moshi_preset(name), mimi_for(name)

    def build(lm_dtype: torch.dtype) -> LoadedMoshi:
        return random_moshi(name, options.seed, device=options.device, lm_dtype=lm_dtype)

    return _spec_for(lm, mimi, options), _factory(build, options)


def _factory(load: Callable[[torch.dtype], LoadedMoshi], options: ModelOptions) -> RunnerFactory:
    """Loads (bf16 LM on a GPU, float32 on CPU) when the engine starts, then the runner."""

    def build(spec: ModelSpec) -> ModelRunner:
        cuda = options.device.startswith("cuda")
        note(f"loading model {spec.name} on {options.device}")
        loaded = load(torch.bfloat16 if cuda else torch.float32)
        if options.weight_dtype == "fp8":
            loaded.lm.temporal_to_fp8()
            if cuda:
                torch.cuda.empty_cache()  # the bf16 copies, so free memory reads true
        if options.codec_dtype != "float32":
            cast_mimi(loaded.mimi, CODEC_DTYPES[options.codec_dtype])
        note(f"model {spec.name} loaded; making its runner")
        kv_dtype = KV_DTYPES[options.kv_cache_dtype]
        runner = MoshiEngineRunner(
            loaded, spec, seed=options.seed, kv_dtype=kv_dtype, voice_dir=options.voice_dir
        )
        if cuda:  # before the engine is handed over, so /health says starting meanwhile
            runner.prepare_graphs()
            runner.warm_up()
        return runner

    return build
