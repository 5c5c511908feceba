"""Tiny seeded random-weight diffusers pipelines, built locally and saved like checkpoints.

Tests and demos serve ``--image-model tiny`` and ``--video-model tiny``: a Stable
Diffusion pipeline and an AnimateDiff pipeline whose UNet, VAE and CLIP text encoder
are a few thousand parameters drawn from a seed, with a byte-level CLIP tokenizer
whose vocabulary and (empty) merges are written here. Each is saved with
``save_pretrained`` into the model cache and then loaded by ``from_pretrained``,
the code path of a real checkpoint. Nothing is downloaded.

A build goes to a temporary sibling folder with a manifest (kind, seed, file digests)
and is renamed into place, so a half-written folder is never reused.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

from duplex.progress import note

__all__ = ["TINY_KINDS", "build_tiny_pipeline", "tiny_pipeline"]

TinyKind = Literal["image", "video"]
TINY_KINDS: tuple[TinyKind, ...] = ("image", "video")
_MANIFEST = "duplex-manifest.json"
_TEXT_WIDTH = 32
"""Hidden size of the tiny CLIP text encoder and the UNets' cross-attention width."""


def _byte_alphabet() -> list[str]:
    """One printable character per byte, the byte-level BPE convention CLIP's tokenizer reads:
    printable Latin-1 bytes map to themselves, the others to code points from 256 up."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\xa1"), ord("\xac") + 1),
        *range(ord("\xae"), ord("\xff") + 1),
    ]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def write_tokenizer_files(folder: Path) -> int:
    """A CLIP tokenizer's ``vocab.json`` and ``merges.txt``: every byte as a token, alone and
    word-final, no merges (one token a byte); returns the vocabulary size."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for char in _byte_alphabet():
        vocab[char] = len(vocab)
    for char in _byte_alphabet():
        vocab[char + "</w>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return len(vocab)


def byte_clip_tokenizer(scratch_parent: Path | None = None) -> tuple[Any, int]:
    """A CLIP tokenizer over `write_tokenizer_files`' vocabulary (its files written to a
    scratch folder under ``scratch_parent`` and removed), and the vocabulary's size."""
    from transformers import CLIPTokenizer

    scratch = Path(tempfile.mkdtemp(prefix=".tokenizer-", dir=scratch_parent))
    try:
        vocab_size = write_tokenizer_files(scratch)
        tokenizer = CLIPTokenizer(
            str(scratch / "vocab.json"), str(scratch / "merges.txt"), model_max_length=77
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return tokenizer, vocab_size


def sd_scheduler() -> Any:
    """Stable Diffusion 1.5's DDIM scheduler settings (its published ``scheduler_config``)."""
    from diffusers import DDIMScheduler

    return DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )


def build_tiny_pipeline(folder: Path, kind: TinyKind, seed: int) -> None:
    """Build the tiny ``kind`` pipeline with weights drawn from ``seed`` and save it to
    ``folder`` (``save_pretrained``)."""
    import torch
    from diffusers import (
        AnimateDiffPipeline,
        AutoencoderKL,
        MotionAdapter,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from diffusers.utils import logging as diffusers_logging
    from transformers import CLIPTextConfig, CLIPTextModel

    diffusers_logging.set_verbosity_error()
    diffusers_logging.disable_progress_bar()
    tokenizer, vocab_size = byte_clip_tokenizer(folder.parent)
    torch.manual_seed(seed)
    # attention only at the lower resolution: CPU attention over the full latent dominates
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16),
        layers_per_block=1,
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=_TEXT_WIDTH,
        norm_num_groups=2,
    )
    vae = AutoencoderKL(
        block_out_channels=(8, 16),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=4,
        norm_num_groups=2,
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
            hidden_size=_TEXT_WIDTH,
            intermediate_size=37,
            num_attention_heads=4,
            num_hidden_layers=2,
            vocab_size=vocab_size,
            max_position_embeddings=77,
        )
    )
    scheduler = sd_scheduler()
    parts = {"vae": vae, "text_encoder": text_encoder, "tokenizer": tokenizer}
    if kind == "image":
        pipeline = StableDiffusionPipeline(
            **parts,
            unet=unet,
            scheduler=scheduler,
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
    else:
        adapter = MotionAdapter(
            block_out_channels=(8, 16),
            motion_layers_per_block=1,
            motion_norm_num_groups=2,
            motion_num_attention_heads=4,
        )
        pipeline = AnimateDiffPipeline(
            **parts, unet=unet, motion_adapter=adapter, scheduler=scheduler
        )
    pipeline.save_pretrained(folder)


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != _MANIFEST
    }


def _valid_build(folder: Path, kind: TinyKind, seed: int) -> bool:
    manifest = folder / _MANIFEST
    if not manifest.is_file():
        return False
    try:
        recorded = json.loads(manifest.read_text())
    except ValueError:
        return False
    return recorded == {"kind": kind, "seed": seed, "files": _digests(folder)}


def tiny_pipeline(cache_dir: Path, kind: TinyKind, seed: int) -> Path:
    """The cached ``tiny-<kind>-<seed>`` pipeline folder under ``cache_dir``, built if absent
    or invalid."""
    folder = cache_dir / f"tiny-{kind}-{seed}"
    if _valid_build(folder, kind, seed):
        return folder
    note(f"building the tiny {kind} pipeline into {folder}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".tiny-{kind}-{seed}-", dir=cache_dir))
    try:
        build_tiny_pipeline(scratch / "pipeline", kind, seed)
        built = scratch / "pipeline"
        manifest = {"kind": kind, "seed": seed, "files": _digests(built)}
        (built / _MANIFEST).write_text(json.dumps(manifest))
        shutil.rmtree(folder, ignore_errors=True)
        try:
            built.rename(folder)
        except OSError:
            if not _valid_build(folder, kind, seed):  # not another process's finished build
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder
