"""Moshi checkpoint folders: where they are looked for, how they are checked and loaded.

A folder in the official layout (``kyutai/moshiko-pytorch-bf16``,
``nvidia/personaplex-7b-v1``) holds three files: `LM_FILE` (the LM),
`MIMI_FILE` (the Mimi codec) and `TOKENIZER_FILE` (the sentencepiece text
vocabulary). `find_checkpoint` maps a ``--model`` value to such a folder:

- ``moshi-7b`` / ``personaplex-7b``: the snapshot of the official repo in the
  local Hugging Face cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``~/.cache/huggingface/hub``); nothing is ever downloaded;
- ``PATH``: a folder; the LM preset is inferred from its tensor shapes;
- ``PRESET:PATH``: a folder holding that preset (an 8-step PersonaPlex checkpoint
  has the same shapes as ``moshi-7b``, so it needs the name).

`build_tiny_checkpoint` writes seeded random LM and Mimi weights and a trained
tiny tokenizer in the same layout; `tiny_checkpoint` keeps one per seed in a
cache folder (rebuilt when its manifest does not match the files). Both real
and tiny folders load through `load_checkpoint`, so the loading code is the
one the 7B checkpoints use.

`random_moshi` (``--random-weights``) builds any preset, the 7B ones included,
with seeded random weights drawn on the model's device: the same `MoshiLM` and
`MimiModel` construction, nothing read or written, for benchmarks without a
download.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import final

import torch
from safetensors import SafetensorError, safe_open

from duplex.exceptions import ConfigError
from duplex.progress import note

from ._config import MOSHI_PRESETS, MoshiConfig, moshi_preset
from ._lm import MoshiLM
from ._mimi import MimiModel
from ._mimi_config import MimiConfig, mimi_preset
from ._mimi_weights import load_mimi, random_mimi, save_random_mimi
from ._text import text_pieces, tiny_tokenizer, write_tiny_tokenizer
from ._weights import expected_tensors, load_lm, random_lm, save_random_lm

__all__ = [
    "CHECKPOINT_FILES",
    "HF_REPOS",
    "LM_FILE",
    "MIMI_FILE",
    "TOKENIZER_FILE",
    "LoadedMoshi",
    "MoshiCheckpoint",
    "build_tiny_checkpoint",
    "check_checkpoint",
    "find_checkpoint",
    "hf_hub_cache",
    "load_checkpoint",
    "mimi_for",
    "random_moshi",
    "tiny_checkpoint",
]

LM_FILE = "model.safetensors"
MIMI_FILE = "tokenizer-e351c8d8-checkpoint125.safetensors"
TOKENIZER_FILE = "tokenizer_spm_32k_3.model"
CHECKPOINT_FILES = (LM_FILE, MIMI_FILE, TOKENIZER_FILE)
HF_REPOS = {"moshi-7b": "kyutai/moshiko-pytorch-bf16", "personaplex-7b": "nvidia/personaplex-7b-v1"}
"""The official repo each named 7B model is looked up under in the Hugging Face cache."""

_MANIFEST = "duplex-build.json"
_MIMI_FOR = {"tiny": "tiny", "tiny-personaplex": "tiny"}  # every other preset: "mimi"


@final
@dataclass(frozen=True, slots=True)
class MoshiCheckpoint:
    """A checked folder: its three files exist and the LM holds ``lm``."""

    folder: Path
    lm: MoshiConfig = field(repr=False)
    mimi: MimiConfig = field(repr=False)

    @property
    def lm_path(self) -> Path:
        """The LM safetensors file."""
        return self.folder / LM_FILE

    @property
    def mimi_path(self) -> Path:
        """The Mimi safetensors file."""
        return self.folder / MIMI_FILE

    @property
    def tokenizer_path(self) -> Path:
        """The sentencepiece model."""
        return self.folder / TOKENIZER_FILE


@final
@dataclass(frozen=True, slots=True)
class LoadedMoshi:
    """The loaded parts of a checkpoint: LM, codec, the text of each text token and the
    sentencepiece model (serialized) that encodes prompt text.

    ``checkpoint`` is ``None`` for random weights (`random_moshi`): no folder, no voices.
    """

    checkpoint: MoshiCheckpoint | None
    lm: MoshiLM = field(repr=False)
    mimi: MimiModel = field(repr=False)
    pieces: tuple[str, ...] = field(repr=False)
    tokenizer: bytes = field(repr=False)


def hf_hub_cache() -> Path:
    """The local Hugging Face hub cache folder (read only; nothing is downloaded)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def mimi_for(preset: str) -> MimiConfig:
    """The Mimi codec a Moshi preset runs with (``tiny`` presets: the tiny codec)."""
    return mimi_preset(_MIMI_FOR.get(preset, "mimi"))


def _complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in CHECKPOINT_FILES)


def _hf_snapshot(repo: str, hub: Path) -> Path | None:
    """The cached snapshot holding all three files: ``refs/main`` first, else any."""
    root = hub / f"models--{repo.replace('/', '--')}"
    ref = root / "refs" / "main"
    if ref.is_file():
        pinned = root / "snapshots" / ref.read_text().strip()
        if _complete(pinned):
            return pinned
    snapshots = root / "snapshots"
    found = sorted(p for p in snapshots.iterdir() if _complete(p)) if snapshots.is_dir() else []
    return found[-1] if found else None


def _looks_like_path(name: str) -> bool:
    return os.sep in name or name.startswith((".", "~")) or Path(name).is_dir()


def find_checkpoint(name: str, *, hub: Path | None = None) -> MoshiCheckpoint | None:
    """The checked checkpoint a ``--model`` value names, or ``None`` if it names no Moshi model.

    ``tiny`` is not looked up here (it is built: `tiny_checkpoint`).

    Raises:
        ConfigError: the name is a Moshi model or a folder, but files are missing or
            hold no known preset; the one-line message names what is missing.
    """
    if name in HF_REPOS:
        repo = HF_REPOS[name]
        cache = hub or hf_hub_cache()
        folder = _hf_snapshot(repo, cache)
        if folder is None:
            raise ConfigError(
                f"model {name!r}: no snapshot of {repo} with {', '.join(CHECKPOINT_FILES)} in "
                f"the Hugging Face cache {cache}; weights are never downloaded: fetch them "
                "yourself, pass --model PATH, or pass --random-weights to serve its "
                "architecture with seeded random weights (benchmarks)"
            )
        return check_checkpoint(folder, name)
    preset, sep, path = name.partition(":")
    if sep and preset in MOSHI_PRESETS:
        return check_checkpoint(Path(path).expanduser(), preset)
    if _looks_like_path(name):
        return check_checkpoint(Path(name).expanduser())
    return None


def check_checkpoint(folder: str | Path, preset: str | None = None) -> MoshiCheckpoint:
    """Check the folder's files exist and find the preset; reads tensor headers only.

    Args:
        folder: the checkpoint folder.
        preset: the LM preset it holds; inferred from the LM's tensor shapes if ``None``.

    Raises:
        ConfigError: no such folder, a file is missing, or the LM matches no preset.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"Moshi checkpoint folder {folder} does not exist")
    missing = [name for name in CHECKPOINT_FILES if not (folder / name).is_file()]
    if missing:
        raise ConfigError(f"Moshi checkpoint folder {folder} lacks {', '.join(missing)}")
    lm = moshi_preset(preset) if preset is not None else _infer_preset(folder / LM_FILE)
    return MoshiCheckpoint(folder, lm, mimi_for(lm.name))


def _infer_preset(path: Path) -> MoshiConfig:
    """The one preset whose every tensor the file holds with the same shape."""
    try:
        with safe_open(str(path), "pt") as f:
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as exc:
        raise ConfigError(f"{path}: not a safetensors file ({exc})") from None
    text_emb = shapes.get("text_emb.weight")
    for config in MOSHI_PRESETS.values():
        if text_emb != (config.text_card + 1, config.dim):
            continue
        if all(shapes.get(n) == s for n, s in expected_tensors(config).items()):
            return config
    raise ConfigError(
        f"{path}: tensors match no Moshi preset ({', '.join(sorted(MOSHI_PRESETS))}); "
        "name one as --model PRESET:PATH"
    )


def load_checkpoint(
    checkpoint: MoshiCheckpoint,
    *,
    device: torch.device | str = "cpu",
    lm_dtype: torch.dtype = torch.float32,
) -> LoadedMoshi:
    """Load the LM (in ``lm_dtype``), Mimi (float32) and the token texts onto ``device``.

    Tensors the models do not use are ignored; missing or mis-shaped ones are errors.

    Raises:
        ConfigError: a file does not hold what the preset needs.
    """
    lm = load_lm(checkpoint.lm_path, checkpoint.lm, device=device, dtype=lm_dtype, strict=False)
    mimi = load_mimi(checkpoint.mimi_path, checkpoint.mimi, device=device, strict=False)
    if mimi.config.bins != checkpoint.lm.card:
        raise ConfigError(f"{checkpoint.folder}: Mimi has {mimi.config.bins} bins, LM card is "
                          f"{checkpoint.lm.card}")  # fmt: skip
    tokenizer = checkpoint.tokenizer_path.read_bytes()
    pieces = text_pieces(tokenizer, checkpoint.lm.text_card)
    return LoadedMoshi(checkpoint, lm, mimi, pieces, tokenizer)


def random_moshi(
    preset: str,
    seed: int,
    *,
    device: torch.device | str = "cpu",
    lm_dtype: torch.dtype = torch.float32,
) -> LoadedMoshi:
    """The preset's architecture with seeded random weights, built on ``device``.

    The LM is drawn in place on the device from ``seed`` (never a CPU copy: a 7B LM
    is 14 GB in bf16); Mimi (float32, small) is drawn from ``seed + 1`` and moved
    there; the text vocabulary is the tiny tokenizer, trained in memory (ids past its
    pieces read as ``""``). Nothing is read or written.

    Raises:
        ConfigError: ``preset`` is not a Moshi preset.
    """
    lm_config = moshi_preset(preset)
    mimi_config = mimi_for(preset)
    lm = random_lm(lm_config, seed, dtype=lm_dtype, device=device)
    mimi = random_mimi(mimi_config, seed + 1).to(device)
    tokenizer = tiny_tokenizer(min(lm_config.text_card, moshi_preset("tiny").text_card))
    pieces = text_pieces(tokenizer, lm_config.text_card)
    return LoadedMoshi(None, lm, mimi, pieces, tokenizer)


def build_tiny_checkpoint(folder: str | Path, seed: int, preset: str = "tiny") -> MoshiCheckpoint:
    """Write a seeded random ``tiny`` checkpoint in the official layout; same seed, same bytes.

    The LM and Mimi draw from seeds derived from ``seed`` so they differ from
    each other; the tokenizer is trained deterministically with ``text_card`` pieces.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lm = moshi_preset(preset)
    save_random_lm(folder / LM_FILE, lm, seed)
    save_random_mimi(folder / MIMI_FILE, mimi_preset(_MIMI_FOR.get(preset, "tiny")), seed + 1)
    write_tiny_tokenizer(folder / TOKENIZER_FILE, lm.text_card)
    return check_checkpoint(folder, preset)


def _digests(folder: Path) -> dict[str, str]:
    return {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in CHECKPOINT_FILES}


def tiny_checkpoint(cache_dir: Path, seed: int) -> MoshiCheckpoint:
    """The cached ``tiny-<seed>`` checkpoint under ``cache_dir``, built if absent or invalid.

    A build goes to a temporary sibling folder with a manifest of file digests
    and is renamed into place, so a half-written folder is never reused.
    """
    folder = cache_dir / f"tiny-{seed}"
    if _valid_build(folder, seed):
        return check_checkpoint(folder, "tiny")
    note(f"building the tiny checkpoint into {folder}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".tiny-{seed}-", dir=cache_dir))
    try:
        build_tiny_checkpoint(scratch, seed)
        (scratch / _MANIFEST).write_text(json.dumps({"seed": seed, "files": _digests(scratch)}))
        shutil.rmtree(folder, ignore_errors=True)
        try:
            scratch.rename(folder)
        except OSError:
            if not _valid_build(folder, seed):  # not another process's finished build
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return check_checkpoint(folder, "tiny")


def _valid_build(folder: Path, seed: int) -> bool:
    manifest = folder / _MANIFEST
    if not (manifest.is_file() and _complete(folder)):
        return False
    try:
        recorded = json.loads(manifest.read_text())
    except ValueError:
        return False
    return recorded == {"seed": seed, "files": _digests(folder)}
