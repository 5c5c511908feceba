"""Step time of our Moshi engine against Kyutai's reference loop, one process, one GPU.

One command runs every phase and writes what it has after each batch size:

``smoke``
    Correctness first: the ``tiny`` LM and ``tiny`` Mimi with seeded random
    weights, greedy, four slots joining at staggered frames, run on the CPU and
    on ``--device``; tokens must be equal frame by frame and the PCM close
    (cuDNN / matmul TF32 is turned off for this phase only). On CUDA it also
    runs the device twice more, eager and CUDA-graphed (greedy, then sampled
    with seeded counter-based noise): graphed tokens must equal eager ones
    (greedy gates ``passed``; sampled is reported). Also on CUDA: the tiny
    Mimi alone, graphed vs eager (staggered joins, a reset, padded buckets):
    codes equal and PCM within ``MIMI_GRAPH_ATOL`` gate ``passed``.
``ours``
    The full LM preset (``moshi-7b``) with seeded random weights built directly
    on the device (meta device, ``to_empty``, in-place normal fill; bf16 on
    CUDA) and Mimi (``mimi``, float32). For each B: B sessions at staggered
    frames (slot i at ``(i + 0.5) * context / B``, set with
    `MoshiRunner.seek`), i.e. continuous batching with KV fill lengths spread
    over the ring, then ``--steps`` timed frames of exactly what
    `MoshiEngineRunner.execute` does: Mimi encode of ``[B, 1920]`` noise, one
    LM step (temporal transformer, text sampling, 8 depth steps with the
    reference's temperature / top-k), Mimi decode of the valid rows, copy-out
    of PCM and text tokens to the host. The LM step and Mimi's encode and
    decode replay one CUDA graph per batch bucket (``--cuda-graphs``, the
    default; ``--no-cuda-graphs`` runs the same padded static frames
    eagerly); a bucket's graphs are captured in its first warm-up frame
    (``first_frame_ms``).
``ours-full``
    The same with every slot past ``context`` frames (the whole 3000-frame ring
    read: the worst case).
``reference``
    ``moshi==0.2.13`` (``loaders.get_moshi_lm(None)`` / ``get_mimi(None)``:
    random init, no download; bf16 LM, float32 Mimi, its own CUDA graphs, no
    torch.compile): lockstep ``mimi.streaming(B)`` + ``lm_gen.streaming(B)``,
    ``mimi.encode`` -> ``LMGen.step`` (temp 0.8 / 0.7, top-k 250 / 25) ->
    ``mimi.decode(tokens[:, 1:])`` + the same host copy-out, timed the same way
    after at least 5 warm-up frames (it captures CUDA graphs in the first ones).
``ours-fp8``, ``ours-fp8-staggered``
    ``ours-full`` / ``ours`` with the KV ring stored as float8 e4m3 (half the bytes: more
    slots fit, half the attention reads).

Phase order: ``smoke``, ``reference``, then ours. On CUDA the reference runs each B in a
child process of this script (``--reference-per-process``, the default): it keeps each B's KV
cache and graphs alive, so in one process a B = 64 (~102 GiB of KV) no longer fits after
B = 32. Every frame is bracketed by ``torch.cuda.synchronize()``; CUDA events recorded
inside the frame (no extra host sync) split it into encode / LM / decode.
Stats per B: median, p99, mean, min, max ms, peak ``max_memory_allocated``.
B values whose KV ring cannot fit (estimated from free memory) are skipped with
the reason; an out-of-memory error stops that phase from growing B. Each phase
is guarded, so one failure still leaves the others in the output.

Outputs: ``<out>.json`` (everything, rewritten after each B), ``<out>.md`` (a
table) and, when matplotlib imports, ``<out>.png`` (median / p99 step time
against B with the 80 ms frame budget).

Imports: torch, numpy, safetensors, the standard library and our
``duplex.models.moshi`` submodules only (the package ``__init__`` files, which
pull in trio and sentencepiece, are bypassed). For the reference, missing
``huggingface_hub`` / ``sentencepiece`` are replaced by stubs (it never
downloads with ``filename=None``; the tokenizer is not used).

GPU (H200), from the repository root, with the reference package under
``out/moshi-ref``::

    PYTHONPATH=$PWD/out/devdeps:$PWD:$PWD/out/moshi-ref python3 bench/duplex_engine.py \\
        --out out/engine_h200

(``out/devdeps`` only needs to provide ``safetensors`` if the machine lacks it.)
Defaults: all phases, B in 1,8,16,32,64,96,128, 3 (reference: 5) warm-up and
20 timed frames per B, ``--budget-s 420`` after which remaining B are skipped.

CPU check (tiny models, a few seconds)::

    python bench/duplex_engine.py --device cpu --preset tiny --batches 1,4 --steps 5 \\
        --out out/engine_smoke
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("NO_TORCH_COMPILE", "1")  # before moshi is imported: its CUDA graphs only

import numpy as np
import torch
from _source import source_info
from _tiling import int4_defaults

ROOT = Path(__file__).resolve().parents[1]
FRAME_MS = 80.0
GIB = 1024**3
SMOKE_SLOTS = 4
SMOKE_FRAMES = 16
SMOKE_WEIGHT_SEED = 3
WEIGHT_SEED = 1234
PCM_SEED = 99
PCM_ATOL = 1e-3
MIMI_GRAPH_ATOL = 1e-4
"""Graphed vs eager Mimi PCM on one device (same kernels; only capture could differ)."""
REFERENCE_MIN_WARMUP = 5
MEMORY_RESERVE = 4 * GIB
"""Kept free when sizing slot pools (allocator fragmentation, cuBLAS workspaces, Mimi)."""

OUR_PHASES: dict[str, tuple[str, str, str]] = {
    "ours": ("staggered", "auto", "ours (staggered)"),
    "ours-full": ("full", "auto", "ours (full context)"),
    "ours-fp8": ("full", "fp8", "ours (full context, fp8 KV)"),
    "ours-fp8-staggered": ("staggered", "fp8", "ours (staggered, fp8 KV)"),
    "ours-int4": ("full", "int4", "ours (full context, int4 KV)"),
    "ours-int4-staggered": ("staggered", "int4", "ours (staggered, int4 KV)"),
}
"""Our phases: (session offsets, the server's ``kv_cache_dtype``, label)."""
PHASES = ("smoke", *OUR_PHASES, "reference")
PRESET_MIMI = {"moshi-7b": "mimi", "tiny": "tiny"}


# --------------------------------------------------------------------------- imports


def _bare_package(name: str, path: Path) -> None:
    """Register package ``name`` (searching ``path``) without running its ``__init__``."""
    if name in sys.modules:
        return
    module = types.ModuleType(name)
    module.__path__ = [str(path)]
    module.__package__ = name
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


def import_ours() -> types.SimpleNamespace:
    """Our Moshi modules, without ``duplex.models`` / ``duplex.models.moshi`` package imports."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import duplex  # noqa: F401  (version string only)

    _bare_package("duplex.models", ROOT / "duplex" / "models")
    _bare_package("duplex.models.moshi", ROOT / "duplex" / "models" / "moshi")
    config = importlib.import_module("duplex.models.moshi._config")
    lm = importlib.import_module("duplex.models.moshi._lm")
    runner = importlib.import_module("duplex.models.moshi._runner")
    weights = importlib.import_module("duplex.models.moshi._weights")
    mimi_config = importlib.import_module("duplex.models.moshi._mimi_config")
    mimi_streams = importlib.import_module("duplex.models.moshi._mimi_streams")
    mimi_weights = importlib.import_module("duplex.models.moshi._mimi_weights")
    kv = importlib.import_module("duplex.models.moshi._kv")
    int4_row_bytes = importlib.import_module("duplex.kernels.kv_int4").int4_row_bytes
    return types.SimpleNamespace(
        KV_DTYPES={"auto": None, "fp8": torch.float8_e4m3fn, "int4": kv.INT4},
        KV_BYTES={"auto": 2, "fp8": 1, "int4": int4_row_bytes(128) / 128},
        moshi_preset=config.moshi_preset,
        MoshiLM=lm.MoshiLM,
        MoshiRunner=runner.MoshiRunner,
        SlotSampling=runner.SlotSampling,
        GREEDY=runner.GREEDY,
        random_lm=weights.random_lm,
        mimi_preset=mimi_config.mimi_preset,
        MimiStreams=mimi_streams.MimiStreams,
        random_mimi=mimi_weights.random_mimi,
        cast_mimi=mimi_weights.cast_mimi,
    )


def _stub_if_missing(name: str, attrs: dict[str, Any]) -> bool:
    """Import ``name``; if that fails, install a stub module with ``attrs``. True if stubbed."""
    try:
        importlib.import_module(name)
        return False
    except Exception:  # a wheel built for another Python raises ImportError or OSError
        pass
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, module)
    return True


def import_reference() -> tuple[Any, Any, list[str]]:
    """``moshi.models.loaders``, ``moshi.models.lm.LMGen`` and the names that were stubbed."""

    def no_download(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("huggingface_hub is stubbed in this benchmark: nothing is downloaded")

    class _NotFound(Exception):
        pass

    class _NoTokenizer:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("sentencepiece is stubbed in this benchmark")

    stubbed = []
    if _stub_if_missing("huggingface_hub", {"hf_hub_download": no_download}):
        stubbed.append("huggingface_hub")
        for sub in ("errors", "utils"):
            _stub_if_missing(f"huggingface_hub.{sub}", {"EntryNotFoundError": _NotFound})
    if _stub_if_missing("sentencepiece", {"SentencePieceProcessor": _NoTokenizer}):
        stubbed.append("sentencepiece")
    loaders = importlib.import_module("moshi.models.loaders")
    lm = importlib.import_module("moshi.models.lm")
    return loaders, lm.LMGen, stubbed


# --------------------------------------------------------------------------- helpers


class Results:
    """The JSON document, rewritten on every `save`."""

    def __init__(self, out: Path, data: dict[str, Any]) -> None:
        self.path = out.with_suffix(".json")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.data = data

    def save(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        tmp.replace(self.path)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def gib(value: float) -> float:
    return round(value / GIB, 3)


def is_oom(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


EMBEDDING_TABLE = re.compile(
    r"(^|\.)(text_emb|emb|depformer_emb|depformer_text_emb)(\.\d+)?\.weight$"
)
"""The LM's embedding tables: a step reads one row of each a token, not the table."""


def lm_step_bytes(lm: Any, fills: Sequence[int], kv_bytes: float) -> int:
    """Bytes one LM step reads at the least: every weight (fp8 ones and their scales as
    stored) but the embedding tables, and each row's filled temporal KV (keys and values,
    every layer, at ``kv_bytes`` a value). The depth transformer's few KV rows are left out."""
    tensors = [*lm.named_parameters(), *lm.named_buffers()]
    weights = sum(
        t.numel() * t.element_size() for name, t in tensors if not EMBEDDING_TABLE.search(name)
    )
    config = lm.config  # a row's share of a full slot's ring
    kv = config.kv_bytes_per_slot(kv_bytes) * sum(fills) / config.context
    return int(weights + kv)


def bytes_floor(
    lm: Any, fills: Sequence[int], kv_bytes: float, entry: dict, read_gbps: float | None
) -> dict[str, Any]:
    """The LM step's bytes (`lm_step_bytes`), and with ``read_gbps`` its floor (those bytes at
    the card's measured read bandwidth) and the measured LM step over it."""
    nbytes = lm_step_bytes(lm, fills, kv_bytes)
    out: dict[str, Any] = {"lm_step_gb": round(nbytes / 1e9, 2)}
    if read_gbps:
        floor = nbytes / read_gbps / 1e6
        out["lm_floor_ms"] = round(floor, 2)
        lm_step = entry.get("split_median_ms", {}).get("lm_step")
        if lm_step:
            out["lm_over_floor"] = round(lm_step / floor, 2)
    return out


def log_batch(entry: dict[str, Any]) -> None:
    """One line per measured B: median, p99, split and peak memory."""
    log(
        f"  median {entry['median_ms']} ms, p99 {entry['p99_ms']} ms, "
        f"{entry.get('split_median_ms')}, {entry.get('max_allocated_gib')} GiB"
    )


def record_failure(entry: dict[str, Any], error: Exception) -> bool:
    """Put a failed B's error in its entry; True when it ran out of memory (stop growing B).

    Call it from the ``except`` block: the traceback is the one being handled.
    """
    entry["error"] = f"{type(error).__name__}: {error}"[:2000]
    log(f"  failed: {entry['error'][:300]}")
    if is_oom(error):
        entry["oom"] = True
        return True
    entry["traceback"] = traceback.format_exc()[-4000:]
    return False


class FrameClock:
    """Wall time of one frame (synchronized at both ends) and a split from marks inside it.

    On CUDA the marks are events (no host sync); on the CPU they are wall-clock reads.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._events: list[Any] = []
        self._start = 0.0

    def start(self) -> None:
        sync(self.device)
        self._events = []
        self._start = time.perf_counter()
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._events.append(event)
        else:
            self._events.append(time.perf_counter())

    def stop(self) -> tuple[float, list[float]]:
        self.mark()
        sync(self.device)
        total = (time.perf_counter() - self._start) * 1e3
        if self.cuda:
            parts = [
                a.elapsed_time(b) for a, b in zip(self._events, self._events[1:], strict=False)
            ]
        else:
            parts = [(b - a) * 1e3 for a, b in zip(self._events, self._events[1:], strict=False)]
        return total, parts


def summarize(totals: list[float], parts: list[list[float]], names: Sequence[str]) -> dict:
    """Median / p99 / mean / min / max of the frame times, and the median of each part."""
    values = np.asarray(totals, dtype=np.float64)
    stats: dict[str, Any] = {
        "frames": len(totals),
        "median_ms": round(float(np.median(values)), 3),
        "p99_ms": round(float(np.percentile(values, 99)), 3),
        "mean_ms": round(float(values.mean()), 3),
        "min_ms": round(float(values.min()), 3),
        "max_ms": round(float(values.max()), 3),
        "frame_ms": [round(float(v), 3) for v in values],
    }
    if parts and all(len(p) == len(names) for p in parts):
        split = np.asarray(parts, dtype=np.float64)
        stats["split_median_ms"] = {
            name: round(float(np.median(split[:, i])), 3) for i, name in enumerate(names)
        }
    return stats


def peak_memory(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    return {
        "max_allocated_gib": gib(torch.cuda.max_memory_allocated(device)),
        "max_reserved_gib": gib(torch.cuda.max_memory_reserved(device)),
    }


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def test_pcm(frames: int, batch: int, device: torch.device, seed: int = PCM_SEED) -> torch.Tensor:
    """``[frames, batch, 1920]`` float32 noise at 0.1 RMS, generated on ``device``."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return 0.1 * torch.randn(frames, batch, 1920, generator=generator, device=device)


def lm_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


# --------------------------------------------------------------------------- our engine


def as_served(
    ours: types.SimpleNamespace, lm: Any, mimi: Any, weight_dtype: str, codec_dtype: str
) -> None:
    """``--weight-dtype`` and ``--codec-dtype`` applied to built models, as the server's
    factory applies them after loading."""
    if weight_dtype == "fp8":
        lm.temporal_to_fp8()
        if lm.text_linear.weight.is_cuda:
            torch.cuda.empty_cache()  # the bf16 copies
    if codec_dtype == "bf16":
        ours.cast_mimi(mimi, torch.bfloat16)


def build_lm_on_device(
    ours: types.SimpleNamespace, config: Any, device: torch.device, dtype: torch.dtype, seed: int
) -> Any:
    """`MoshiLM` with seeded random weights made on ``device`` (no CPU copy of 7B).

    Same law as `random_lm`: normal with std ``1/sqrt(fan_in)``, RMSNorm gains ``1 + 0.1 N``.
    """
    with torch.device("meta"):
        model = ours.MoshiLM(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            if not tensor.is_floating_point():
                raise RuntimeError(f"unexpected non-float LM tensor {name}")
            if name.endswith(".alpha"):
                tensor.normal_(1.0, 0.1, generator=generator)
            else:
                tensor.normal_(0.0, 1.0 / math.sqrt(tensor.shape[-1]), generator=generator)
    return model.eval().requires_grad_(False)


class OurEngine:
    """`MoshiRunner` + `MimiStreams` stepped exactly as `MoshiEngineRunner.execute` does."""

    def __init__(
        self,
        ours: types.SimpleNamespace,
        lm: Any,
        mimi: Any,
        max_slots: int,
        kv_dtype: torch.dtype | str | None = None,
        cuda_graphs: bool = False,
    ) -> None:
        self.ours = ours
        self.device = lm.text_linear.weight.device
        self.config = lm.config
        self.runner = ours.MoshiRunner(
            lm, max_slots=max_slots, kv_dtype=kv_dtype, cuda_graphs=cuda_graphs
        )
        self.streams = ours.MimiStreams(
            mimi,
            max_slots=max_slots,
            num_codebooks=self.config.user_q,
            cuda_graphs=cuda_graphs,
        )

    def start(self, slot: int, frame: int, sampling: Any) -> None:
        """A fresh session on ``slot`` whose LM is already ``frame`` frames in."""
        self.streams.reset_slot(slot)
        self.runner.reset_slot(slot, sampling)
        if frame:
            self.runner.seek(slot, frame)

    def frame(
        self, slots: list[int], pcm: torch.Tensor, clock: FrameClock | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, torch.Tensor]:
        """One tick: host text ``[B]``, host audio codes ``[B, q]``, host PCM, device PCM."""
        max_delay = self.config.max_delay
        warm = [self.runner.frames(s) + 1 > max_delay for s in slots]
        user = self.streams.encode(slots, pcm)
        if clock:
            clock.mark()
        tokens = self.runner.step(slots, user)
        if clock:
            clock.mark()
        out = torch.zeros(len(slots), pcm.shape[1], device=self.device)
        rows = [r for r, ok in enumerate(warm) if ok]
        if rows:
            index = torch.tensor(rows, device=self.device)
            decoded = self.streams.decode(
                [slots[r] for r in rows], tokens.audio[index], check_values=False
            )
            out[index] = decoded.float().clamp(-1.0, 1.0)
        if clock:
            clock.mark()
        pcm_host = out.cpu().numpy()
        codes = torch.cat([tokens.text[:, None], tokens.audio], dim=1).cpu().numpy()
        return codes[:, 0], codes[:, 1:], pcm_host, out


def mimi_graph_check(ours: types.SimpleNamespace, mimi_cpu: Any, device: torch.device) -> dict:
    """Tiny Mimi on CUDA, graphed vs eager: staggered joins, a reset, buckets 1, 2 and 4."""
    mimi = copy.deepcopy(mimi_cpu).to(device)
    eager = ours.MimiStreams(mimi, max_slots=SMOKE_SLOTS, cuda_graphs=False)
    graphed = ours.MimiStreams(mimi, max_slots=SMOKE_SLOTS, cuda_graphs=True)
    pcm = test_pcm(SMOKE_FRAMES, SMOKE_SLOTS, device)
    generator = torch.Generator().manual_seed(SMOKE_WEIGHT_SEED)
    shape = (SMOKE_FRAMES, SMOKE_SLOTS, mimi.config.num_codebooks)
    codes = torch.randint(0, mimi.config.bins, shape, generator=generator).to(device)
    codes_equal, pcm_diff = True, 0.0
    for index in range(SMOKE_FRAMES):
        for slot in range(SMOKE_SLOTS):
            if index == 2 * slot or (slot == 0 and index == SMOKE_FRAMES // 2):
                eager.reset_slot(slot)
                graphed.reset_slot(slot)
        live = [s for s in range(SMOKE_SLOTS) if 2 * s <= index][::-1]
        frame = pcm[index, live]
        codes_equal &= bool(torch.equal(graphed.encode(live, frame), eager.encode(live, frame)))
        want = eager.decode(live, codes[index, live], check_values=False)
        got = graphed.decode(live, codes[index, live], check_values=False)
        pcm_diff = max(pcm_diff, float((got - want).abs().max()))
    return {
        "mimi_graphs_codes_equal": codes_equal,
        "mimi_graphs_pcm_max_abs_diff": pcm_diff,
        "mimi_graphs_captured": graphed.captured,
        "mimi_graphs_passed": codes_equal and pcm_diff <= MIMI_GRAPH_ATOL,
    }


def run_smoke(args: argparse.Namespace, ours: types.SimpleNamespace, device: torch.device) -> dict:
    """Tiny LM + tiny Mimi, greedy, staggered joins: CPU vs ``device``, frame by frame."""
    config = ours.moshi_preset("tiny")
    mimi_config = ours.mimi_preset("tiny")
    lm_cpu = ours.random_lm(config, SMOKE_WEIGHT_SEED)
    mimi_cpu = ours.random_mimi(mimi_config, SMOKE_WEIGHT_SEED)
    pcm = test_pcm(SMOKE_FRAMES, SMOKE_SLOTS, torch.device("cpu"))
    joins = [2 * slot for slot in range(SMOKE_SLOTS)]

    def trace(
        target: torch.device, graphs: bool = False, sampled: bool = False
    ) -> dict[str, np.ndarray]:
        lm = copy.deepcopy(lm_cpu).to(target)
        mimi = copy.deepcopy(mimi_cpu).to(target)
        engine = OurEngine(ours, lm, mimi, SMOKE_SLOTS, cuda_graphs=graphs)
        text = np.full((SMOKE_FRAMES, SMOKE_SLOTS), -9, dtype=np.int64)
        audio = np.full((SMOKE_FRAMES, SMOKE_SLOTS, config.agent_q), -9, dtype=np.int64)
        out = np.zeros((SMOKE_FRAMES, SMOKE_SLOTS, 1920), dtype=np.float32)
        for index in range(SMOKE_FRAMES):
            for slot, join in enumerate(joins):
                if join == index:
                    sampling = ours.SlotSampling(seed=500 + slot) if sampled else ours.GREEDY
                    engine.start(slot, 0, sampling)
            live = [s for s, join in enumerate(joins) if join <= index]
            t, a, p, _ = engine.frame(live, pcm[index, live].to(target))
            text[index, live], audio[index, live], out[index, live] = t, a, p
        return {"text": text, "audio": audio, "pcm": out}

    tf32 = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    graphed: dict[str, Any] = {}
    try:
        cpu = trace(torch.device("cpu"))
        dev = trace(device)
        if device.type == "cuda":
            graphed.update(mimi_graph_check(ours, mimi_cpu, device))
            for mode in ("greedy", "sampled"):
                sampled = mode == "sampled"
                eager = dev if not sampled else trace(device, sampled=True)
                replayed = trace(device, graphs=True, sampled=sampled)
                graphed[f"graphs_{mode}_tokens_equal"] = bool(
                    (eager["text"] == replayed["text"]).all()
                    and (eager["audio"] == replayed["audio"]).all()
                )
                graphed[f"graphs_{mode}_pcm_max_abs_diff"] = float(
                    np.abs(eager["pcm"] - replayed["pcm"]).max()
                )
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    same = (cpu["text"] == dev["text"]) & (cpu["audio"] == dev["audio"]).all(axis=-1)
    bad = np.argwhere(~same)
    first = int(bad[:, 0].min()) if len(bad) else SMOKE_FRAMES
    pcm_diff = float(np.abs(cpu["pcm"][:first] - dev["pcm"][:first]).max()) if first else 0.0
    tokens_equal = bool(same.all())
    passed = (
        tokens_equal
        and pcm_diff <= PCM_ATOL
        and graphed.get("graphs_greedy_tokens_equal", True)
        and graphed.get("mimi_graphs_passed", True)
    )
    valid = cpu["text"] >= 0
    return {
        **graphed,
        "passed": passed,
        "tokens_equal": tokens_equal,
        "mismatched_slot_frames": int((~same).sum()),
        "first_mismatch_frame": None if tokens_equal else first,
        "pcm_max_abs_diff_before_mismatch": pcm_diff,
        "pcm_atol": PCM_ATOL,
        "frames": SMOKE_FRAMES,
        "slots": SMOKE_SLOTS,
        "joins": joins,
        "valid_outputs": int(valid.sum()),
        "distinct_text_tokens": len(np.unique(cpu["text"][valid])),
        "devices": ["cpu", str(device)],
        "weight_seed": SMOKE_WEIGHT_SEED,
    }


def fit_slots(device: torch.device, want: int, per_slot: int) -> tuple[int, dict]:
    """Largest slot count up to ``want`` whose per-slot bytes fit in free memory."""
    if device.type != "cuda":
        return want, {}
    free, total = torch.cuda.mem_get_info(device)
    fit = max(0, (free - MEMORY_RESERVE) // per_slot)
    info = {
        "free_gib": gib(free),
        "total_gib": gib(total),
        "per_slot_estimate_gib": gib(per_slot),
        "fits_slots": int(fit),
    }
    return int(min(want, fit)), info


def our_per_slot_bytes(config: Any, mimi_config: Any, kv_bytes: float, mimi_bytes: int = 4) -> int:
    """KV ring + Mimi state of one slot (an estimate for sizing).

    The ring attention kernel reads the rings in place in their stored dtype, so
    an fp8 ring needs no bf16 copy.
    """
    ring = config.kv_bytes_per_slot(kv_bytes)
    mimi = mimi_config.kv_bytes_per_slot(mimi_bytes) + 16 * 1024**2
    return ring + mimi


def run_ours(
    args: argparse.Namespace,
    ours: types.SimpleNamespace,
    device: torch.device,
    lm: Any,
    mimi: Any,
    phase: str,
    results: Results,
    record: dict,
    deadline: float,
    hbm_read_gbps: float | None = None,
) -> None:
    """Time our engine for each B, as `OUR_PHASES` says for ``phase``; with the card's
    measured read bandwidth, each B's LM step against its bytes floor."""
    config = lm.config
    mode, kv_name, _ = OUR_PHASES[phase]
    kv_dtype = ours.KV_DTYPES[kv_name]
    kv_bytes = ours.KV_BYTES[kv_name] if kv_dtype else torch.finfo(lm_dtype(device)).bits // 8
    mimi_bytes = next(mimi.parameters()).element_size()
    per_slot = our_per_slot_bytes(config, mimi.config, kv_bytes, mimi_bytes)
    want = max(args.batches)
    max_slots, memory = fit_slots(device, want, per_slot)
    graphs = bool(args.cuda_graphs and device.type == "cuda")
    record.update(
        {
            "mode": mode,
            "cuda_graphs": graphs,
            "kv_dtype": str(kv_dtype or lm_dtype(device)),
            "kv_ring_bytes_per_slot": config.kv_bytes_per_slot(kv_bytes),
            "mimi_kv_bytes_per_slot": mimi.config.kv_bytes_per_slot(mimi_bytes),
            "max_slots": max_slots,
            "sizing": memory,
            "per_batch": {},
        }
    )
    results.save()
    if max_slots < 1:
        record["error"] = "no slot fits in memory"
        return
    engine = OurEngine(ours, lm, mimi, max_slots, kv_dtype=kv_dtype, cuda_graphs=graphs)
    record["mimi_ring_kernel"] = engine.streams.ring_kernel
    record["pool_allocated_gib"] = (
        gib(torch.cuda.memory_allocated(device)) if device.type == "cuda" else None
    )
    context = config.context
    names = ("encode", "lm_step", "decode", "copy_out")
    try:
        for batch in args.batches:
            entry: dict[str, Any] = {}
            record["per_batch"][str(batch)] = entry
            if batch > max_slots:
                entry["skipped"] = (
                    f"{batch} slots do not fit: about {gib(per_slot)} GiB a slot, {max_slots} fit"
                )
                continue
            if time.monotonic() > deadline:
                entry["skipped"] = "time budget spent"
                continue
            log(f"{phase} B={batch}")
            slots = list(range(batch))
            if mode == "staggered":
                starts = [int((i + 0.5) * context / batch) for i in range(batch)]
            else:
                starts = [context + i for i in range(batch)]
            try:
                free_memory(device)
                reset_peak(device)
                for slot, frame in zip(slots, starts, strict=True):
                    engine.start(slot, frame, ours.SlotSampling(seed=1000 + slot))
                pcm = test_pcm(args.warmup + args.steps, batch, device)
                clock = FrameClock(device)
                totals, parts = [], []
                last_out = None
                text = audio = None
                with torch.no_grad():
                    for index in range(args.warmup + args.steps):
                        clock.start()
                        text, audio, _, last_out = engine.frame(slots, pcm[index], clock)
                        total, split = clock.stop()
                        if index == 0:
                            entry["first_frame_ms"] = round(total, 3)
                        if index >= args.warmup:
                            totals.append(total)
                            parts.append(split)
                entry.update(summarize(totals, parts, names))
                entry.update(peak_memory(device))
                entry["padded_batch"] = engine.runner.graph_step.bucket_for(batch)
                entry["graphs_captured"] = engine.runner.graph_step.captured
                fills = [min(s + 1, context) for s in starts]
                entry["kv_rows_read_max"] = max(fills)
                entry["kv_rows_mean_fill"] = round(float(np.mean(fills)), 1)
                entry.update(bytes_floor(lm, fills, kv_bytes, entry, hbm_read_gbps))
                assert last_out is not None and text is not None and audio is not None
                entry["pcm_finite"] = bool(torch.isfinite(last_out).all())
                entry["codes_in_range"] = bool(
                    ((audio >= 0) & (audio < config.card)).all()
                    and ((text >= 0) & (text < config.text_card)).all()
                )
                log_batch(entry)
            except Exception as error:
                if record_failure(entry, error):
                    break
            finally:
                results.save()
    finally:
        del engine
        free_memory(device)


# --------------------------------------------------------------------------- reference


def reference_arguments(config: Any, mimi_config: Any) -> tuple[Any, Any]:
    """``get_moshi_lm`` kwargs and ``get_mimi`` config for our presets: None for the 7B and
    ``mimi`` (the loaders' defaults), else the parity tools' mapping (tools/reference_configs.py).
    Call after `import_ours`: the mapping imports our config modules."""
    sys.path.insert(0, str(ROOT / "tools"))
    from reference_configs import reference_kwargs, reference_mimi_config

    lm_kwargs = None if config.name == "moshi-7b" else reference_kwargs(config)
    mimi = None if mimi_config.name == "mimi" else reference_mimi_config(mimi_config)
    return lm_kwargs, mimi


def _reinit_if_not_finite(model: torch.nn.Module, seed: int) -> bool:
    """Refill parameters like ours if any is NaN/inf (uninitialized memory); True if it did."""
    with torch.no_grad():
        bad = any(not bool(torch.isfinite(p).all()) for p in model.parameters())
        if not bad:
            return False
        generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
        for name, param in model.named_parameters():
            if name.endswith(".alpha"):
                param.normal_(1.0, 0.1, generator=generator)
            else:
                param.normal_(0.0, 1.0 / math.sqrt(param.shape[-1]), generator=generator)
    return True


def run_reference(
    args: argparse.Namespace,
    ours: types.SimpleNamespace,
    device: torch.device,
    results: Results,
    record: dict,
    deadline: float,
) -> None:
    """Time moshi 0.2.13's lockstep loop for each B."""
    loaders, lm_gen_class, stubbed = import_reference()
    import moshi

    config = ours.moshi_preset(args.preset)
    mimi_config = ours.mimi_preset(PRESET_MIMI[args.preset])
    record.update(
        {
            "moshi_version": getattr(moshi, "__version__", "?"),
            "moshi_path": str(Path(moshi.__file__).parent),
            "stubbed_modules": stubbed,
            "env": {k: os.environ.get(k) for k in ("NO_TORCH_COMPILE", "NO_CUDA_GRAPH")},
            "per_batch": {},
        }
    )
    results.save()
    log("reference: building LM and Mimi")
    started = time.monotonic()
    torch.manual_seed(WEIGHT_SEED)
    lm_kwargs, mimi_kwargs = reference_arguments(config, mimi_config)
    lm = loaders.get_moshi_lm(None, lm_kwargs=lm_kwargs, device=device, dtype=lm_dtype(device))
    lm.eval()
    mimi = loaders.get_mimi(None, mimi_kwargs, device=device)
    record["reinitialized_lm"] = _reinit_if_not_finite(lm, WEIGHT_SEED)
    record["lm_params"] = sum(p.numel() for p in lm.parameters())
    record["mimi_params"] = sum(p.numel() for p in mimi.parameters())
    record["build_s"] = round(time.monotonic() - started, 2)
    lm_gen = lm_gen_class(lm, temp=0.8, temp_text=0.7, top_k=250, top_k_text=25)
    weights_bytes = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    record["weights_allocated_gib"] = gib(weights_bytes)
    # Per row: RingKVCache [2, B, H, context, D] per layer (bf16) + Mimi + graph pools.
    per_row = config.kv_bytes_per_slot(torch.finfo(lm_dtype(device)).bits // 8) + 128 * 1024**2
    warmup = max(args.warmup, REFERENCE_MIN_WARMUP)
    record["warmup_frames"] = warmup
    names = ("encode", "lm_step", "decode", "copy_out")
    try:
        for batch in args.batches:
            entry: dict[str, Any] = {}
            record["per_batch"][str(batch)] = entry
            if device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(device)
                if batch * per_row > free - MEMORY_RESERVE:
                    entry["skipped"] = (
                        f"KV for {batch} rows (~{gib(batch * per_row)} GiB) exceeds the "
                        f"{gib(free)} GiB free"
                    )
                    continue
            if time.monotonic() > deadline:
                entry["skipped"] = "time budget spent"
                continue
            log(f"reference B={batch}")
            try:
                free_memory(device)
                reset_peak(device)
                pcm = test_pcm(warmup + args.steps, batch, device)
                clock = FrameClock(device)
                totals, parts = [], []
                returned = 0
                last_out = None
                with torch.no_grad(), mimi.streaming(batch), lm_gen.streaming(batch):
                    for index in range(warmup + args.steps):
                        clock.start()
                        codes = mimi.encode(pcm[index][:, None])
                        clock.mark()
                        tokens = lm_gen.step(codes)
                        clock.mark()
                        if tokens is not None:
                            returned += 1
                            last_out = mimi.decode(tokens[:, 1:])
                            clock.mark()
                            last_out.cpu()
                            tokens[:, 0].cpu()
                        total, split = clock.stop()
                        if index >= warmup:
                            totals.append(total)
                            parts.append(split)
                    entry.update(summarize(totals, parts, names))
                    entry.update(peak_memory(device))
                    entry["frames_returned"] = returned
                    entry["pcm_finite"] = (
                        bool(torch.isfinite(last_out).all()) if last_out is not None else None
                    )
                log_batch(entry)
            except Exception as error:
                if record_failure(entry, error):
                    break
            finally:
                results.save()
    finally:
        del lm_gen, lm, mimi
        free_memory(device)


def reference_per_process(args: argparse.Namespace, record: dict) -> None:
    """`run_reference` for each B in a child process of this script, merged into ``record``."""
    record["per_batch"] = {}
    record["per_process"] = True
    scratch = Path(tempfile.mkdtemp(prefix="duplex-engine-reference-"))
    for batch in args.batches:
        out = scratch / f"b{batch}"
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            *("--device", str(args.device), "--preset", args.preset),
            *("--phases", "reference", "--batches", str(batch)),
            *("--steps", str(args.steps), "--warmup", str(args.warmup)),
            *("--out", str(out), "--no-reference-per-process"),
        ]
        log(f"reference B={batch} in a child process")
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        try:
            child = json.loads(out.with_suffix(".json").read_text())["phases"]["reference"]
        except (OSError, KeyError, ValueError) as error:
            tail = (done.stdout + done.stderr)[-1500:]
            record["per_batch"][str(batch)] = {"error": f"child failed ({error}): {tail}"}
            continue
        record["per_batch"][str(batch)] = child.get("per_batch", {}).get(str(batch), child)
        for key in ("moshi_version", "moshi_path", "stubbed_modules", "lm_params", "build_s"):
            record.setdefault(key, child.get(key))


# --------------------------------------------------------------------------- report


def ratios(data: dict[str, Any]) -> dict[str, dict[str, float]]:
    """ours / reference median and p99 per B, for each of our phases."""
    reference = data.get("phases", {}).get("reference", {}).get("per_batch", {})
    out: dict[str, dict[str, float]] = {}
    for phase in OUR_PHASES:
        per_batch = data.get("phases", {}).get(phase, {}).get("per_batch", {})
        for batch, entry in per_batch.items():
            ref = reference.get(batch, {})
            if "median_ms" in entry and "median_ms" in ref:
                out.setdefault(phase, {})[batch] = {
                    "median": round(entry["median_ms"] / ref["median_ms"], 3),
                    "p99": round(entry["p99_ms"] / ref["p99_ms"], 3),
                }
    return out


def _cell(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "—"
    if "median_ms" in entry:
        memory = entry.get("max_allocated_gib")
        tail = f" ({memory} GiB)" if memory is not None else ""
        return f"{entry['median_ms']:.1f} / {entry['p99_ms']:.1f}{tail}"
    if entry.get("oom"):
        return "OOM"
    if "skipped" in entry:
        return "skipped"
    if "error" in entry:
        return "error"
    return "—"


def write_markdown(out: Path, data: dict[str, Any]) -> None:
    phases = data.get("phases", {})
    columns = [p for p in PHASES[1:] if p in phases]
    batches = sorted({int(b) for p in columns for b in phases[p].get("per_batch", {})})
    rat = data.get("ratios", {})
    lines = [
        f"# Moshi engine step time ({data['params']['preset']}, {data['machine']['device_name']})",
        "",
        f"Command: `{data['command']}`",
        "",
        "ms per 80 ms frame, median / p99 (peak allocated GiB); ratio = ours / reference (median).",
        "",
    ]
    smoke = phases.get("smoke")
    if smoke:
        verdict = "PASS" if smoke.get("passed") else "FAIL"
        lines += [
            f"Smoke (tiny, greedy, CPU vs {data['params']['device']}): {verdict} "
            f"(tokens equal: {smoke.get('tokens_equal')}, graphed = eager greedy / sampled: "
            f"{smoke.get('graphs_greedy_tokens_equal')} / "
            f"{smoke.get('graphs_sampled_tokens_equal')}, Mimi graphed = eager: "
            f"{smoke.get('mimi_graphs_passed')}, PCM max diff "
            f"{smoke.get('pcm_max_abs_diff_before_mismatch')}"
            f"{', error: ' + smoke['error'][:200] if 'error' in smoke else ''})",
            "",
        ]
    header = ["B", *columns] + [f"{p} / ref" for p in OUR_PHASES if p in rat]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---:|" * len(header))
    for batch in batches:
        row = [str(batch)]
        row += [_cell(phases[p].get("per_batch", {}).get(str(batch))) for p in columns]
        for phase in OUR_PHASES:
            if phase in rat:
                value = rat[phase].get(str(batch))
                row.append(f"{value['median']:.2f}" if value else "—")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for phase in columns:
        per_batch = phases[phase].get("per_batch", {})
        splits = [
            f"B={b}: {e['split_median_ms']}" for b, e in per_batch.items() if "split_median_ms" in e
        ]
        notes = [
            f"B={b}: {e.get('skipped') or e.get('error', '')[:160]}"
            for b, e in per_batch.items()
            if "median_ms" not in e
        ]
        if "error" in phases[phase]:
            notes.append(f"phase error: {phases[phase]['error'][:300]}")
        lines.append(
            f"- {phase}: split medians (encode / lm_step / decode / copy_out; CUDA events on GPU): "
            + ("; ".join(splits) or "—")
        )
        if notes:
            lines.append(f"  - not measured: {'; '.join(notes)}")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def write_plot(out: Path, data: dict[str, Any]) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as error:
        return f"no plot: {type(error).__name__}: {error}"
    phases = data.get("phases", {})
    figure, axis = plt.subplots(figsize=(7, 4.5))
    styles = {phase: label for phase, (_, _, label) in OUR_PHASES.items()}
    styles["reference"] = "reference moshi 0.2.13 (lockstep)"
    for index, (phase, label) in enumerate(styles.items()):
        color = f"C{index}"
        per_batch = phases.get(phase, {}).get("per_batch", {})
        points = sorted((int(b), e) for b, e in per_batch.items() if "median_ms" in e)
        if not points:
            continue
        xs = [b for b, _ in points]
        axis.plot(
            xs, [e["median_ms"] for _, e in points], "o-", color=color, label=f"{label} median"
        )
        axis.plot(
            xs,
            [e["p99_ms"] for _, e in points],
            "x--",
            color=color,
            alpha=0.6,
            label=f"{label} p99",
        )
    axis.axhline(FRAME_MS, color="k", linestyle=":", label="80 ms frame budget")
    axis.set_xscale("log", base=2)
    axis.set_xticks(data["params"]["batches"], [str(b) for b in data["params"]["batches"]])
    axis.set_xlabel("concurrent sessions B")
    axis.set_ylabel("ms per 80 ms frame")
    axis.set_title(f"{data['params']['preset']} on {data['machine']['device_name']}")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(out.with_suffix(".png"), dpi=120)
    plt.close(figure)
    return None


# --------------------------------------------------------------------------- main


def machine_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "device": str(device),
        "device_name": platform.processor() or "cpu",
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            {
                "device_name": torch.cuda.get_device_name(device),
                "device_memory_gib": gib(props.total_memory),
                "sm_count": props.multi_processor_count,
                "capability": f"{props.major}.{props.minor}",
            }
        )
    return info


def _from_root(script: str) -> str:
    """``script`` relative to the repository root where it lies inside it."""
    path = Path(script).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else script


def guarded(name: str, data: dict, results: Results, body: Callable[[dict], None]) -> None:
    """Run one phase; its record lands in ``data['phases'][name]`` whatever happens."""
    record: dict[str, Any] = {}
    data["phases"][name] = record
    started = time.monotonic()
    log(f"phase {name}")
    try:
        body(record)
    except Exception as error:
        record["error"] = f"{type(error).__name__}: {error}"[:2000]
        record["traceback"] = traceback.format_exc()[-4000:]
        log(f"phase {name} failed: {record['error'][:300]}")
    record["phase_s"] = round(time.monotonic() - started, 2)
    results.save()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", default="moshi-7b", choices=sorted(PRESET_MIMI))
    parser.add_argument("--batches", default="1,8,16,32,64,96,128")
    parser.add_argument("--steps", type=int, default=20, help="timed frames per B")
    parser.add_argument(
        "--warmup", type=int, default=3, help="untimed frames per B (reference: >= 5)"
    )
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="skip remaining B once this much wall time has passed",
    )
    parser.add_argument("--out", type=Path, default=Path("out/engine_bench"))
    parser.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ours phases: replay the LM step and Mimi frames as CUDA graphs per batch "
        "bucket (CUDA only)",
    )
    parser.add_argument(
        "--weight-dtype",
        choices=("auto", "fp8"),
        default="auto",
        help="ours phases: the temporal transformer's weights (`duplex serve --weight-dtype`)",
    )
    parser.add_argument(
        "--codec-dtype",
        choices=("float32", "bf16"),
        default="float32",
        help="ours phases: Mimi's dtype (`duplex serve --codec-dtype`)",
    )
    parser.add_argument(
        "--int4-kernel",
        default="",
        help="ours int4 phases: the int4 ring kernel's tiling and switches made its defaults "
        "for the run, named as bench/kernels.py's --int4-sweep names them "
        "(split/block/warps[/dot][/sN][/rN][/kw]); empty: the module's",
    )
    parser.add_argument(
        "--reference-per-process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="CUDA: time the reference at each B in a fresh child process (it keeps each "
        "B's KV cache and graphs alive, so after B = 32 a B = 64 no longer fits)",
    )
    args = parser.parse_args(argv)
    args.batches = sorted({int(b) for b in args.batches.split(",") if b.strip()})
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown or not args.batches or min(args.batches) < 1 or args.steps < 1:
        parser.error(f"bad --phases {unknown} / --batches / --steps")
    int4_kernel: dict[str, Any] = {}
    if args.int4_kernel:
        try:
            int4_kernel = int4_defaults(args.int4_kernel)
        except ValueError as error:
            parser.error(f"--int4-kernel: {error}")
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        kv_int4 = importlib.import_module("duplex.kernels.kv_int4")
        for constant, value in int4_kernel.items():
            setattr(kv_int4, constant, value)
    device = torch.device(args.device)
    if device.type == "cuda":
        if device.index is None:  # memory / event calls want an indexed device
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    started = time.monotonic()
    deadline = started + args.budget_s

    data: dict[str, Any] = {
        # the script as run from the repository root (a parent, e.g. bench/served.py, names it
        # by absolute path): result files carry no machine path
        "command": " ".join([Path(sys.executable).name, _from_root(sys.argv[0]), *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(device),
        "source": source_info(),
        "params": {
            "device": str(device),
            "preset": args.preset,
            "mimi_preset": PRESET_MIMI[args.preset],
            "batches": args.batches,
            "steps": args.steps,
            "warmup": args.warmup,
            "phases": phases,
            "budget_s": args.budget_s,
            "cuda_graphs": bool(args.cuda_graphs and device.type == "cuda"),
            "lm_dtype": str(lm_dtype(device)),
            "weight_dtype": args.weight_dtype,
            "int4_kernel": args.int4_kernel or None,
            "int4_defaults": int4_kernel,
            "mimi_dtype": "torch.bfloat16" if args.codec_dtype == "bf16" else "torch.float32",
            "sampling": {"text": [0.7, 25], "audio": [0.8, 250]},
            "frame_ms": FRAME_MS,
        },
        "phases": {},
    }
    if device.type == "cuda" and any(p in OUR_PHASES for p in phases):
        # the card's read bandwidth, for our phases' bytes floors (a reference-only child
        # run, one per B, needs none)
        from kernels import hbm_bandwidth  # a sibling: the same measurement as its run's

        data["machine"]["hbm"] = hbm_bandwidth(reps=10)
        free_memory(device)
    results = Results(args.out, data)
    results.save()
    ours = import_ours()

    if "smoke" in phases:

        def smoke(record: dict) -> None:
            record.update(run_smoke(args, ours, device))
            log(
                f"smoke passed={record['passed']} tokens_equal={record['tokens_equal']} "
                f"graphs greedy/sampled equal={record.get('graphs_greedy_tokens_equal')}/"
                f"{record.get('graphs_sampled_tokens_equal')} "
                f"mimi graphs ok={record.get('mimi_graphs_passed')} "
                f"pcm diff {record['pcm_max_abs_diff_before_mismatch']:.2e}"
            )

        guarded("smoke", data, results, smoke)

    config = ours.moshi_preset(args.preset)
    mimi_config = ours.mimi_preset(PRESET_MIMI[args.preset])
    models: dict[str, Any] = {}

    def ensure_models(record: dict) -> tuple[Any, Any]:
        if "lm" not in models:
            log(f"building {config.name} ({lm_dtype(device)}) and {mimi_config.name} on {device}")
            t0 = time.monotonic()
            models["lm"] = build_lm_on_device(ours, config, device, lm_dtype(device), WEIGHT_SEED)
            models["mimi"] = ours.random_mimi(mimi_config, WEIGHT_SEED).to(device)
            sync(device)
            models["build_s"] = round(time.monotonic() - t0, 2)
            models["lm_params"] = sum(p.numel() for p in models["lm"].parameters())
            models["mimi_params"] = sum(p.numel() for p in models["mimi"].parameters())
            as_served(ours, models["lm"], models["mimi"], args.weight_dtype, args.codec_dtype)
            log(
                f"  built in {models['build_s']} s: {models['lm_params']:,} + "
                f"{models['mimi_params']:,} params"
            )
        record.update({k: models[k] for k in ("build_s", "lm_params", "mimi_params")})
        if device.type == "cuda":
            record["weights_allocated_gib"] = gib(torch.cuda.memory_allocated(device))
        return models["lm"], models["mimi"]

    def release_models() -> None:
        models.clear()
        free_memory(device)

    def measure(phase: str) -> None:
        def body(record: dict) -> None:
            lm, mimi = ensure_models(record)
            read = data["machine"].get("hbm", {}).get("read_gbps")
            run_ours(args, ours, device, lm, mimi, phase, results, record, deadline, read)

        guarded(phase, data, results, body)

    if "reference" in phases:
        if args.reference_per_process and device.type == "cuda":
            guarded("reference", data, results, lambda record: reference_per_process(args, record))
        else:
            guarded(
                "reference",
                data,
                results,
                lambda record: run_reference(args, ours, device, results, record, deadline),
            )
    for phase in OUR_PHASES:
        if phase in phases:
            measure(phase)
    release_models()

    data["ratios"] = ratios(data)
    data["total_s"] = round(time.monotonic() - started, 2)
    results.save()
    try:
        write_markdown(args.out, data)
    except Exception as error:
        log(f"markdown failed: {error}")
    plot_error = write_plot(args.out, data)
    if plot_error:
        data["plot"] = plot_error
        results.save()
    log(f"wrote {results.path} ({data['total_s']} s)")
    print(args.out.with_suffix(".md").read_text() if args.out.with_suffix(".md").exists() else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
