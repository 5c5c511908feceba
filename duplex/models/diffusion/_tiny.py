"""Tiny seeded random-weight diffusers pipelines, built locally and saved like checkpoints.

Tests and demos serve ``--image-model tiny``, ``--video-model tiny`` and
``--audio-model tiny``: a Stable Diffusion pipeline and an AnimateDiff pipeline whose
UNet, VAE and CLIP text encoder are a few thousand parameters drawn from a seed, with a
byte-level CLIP tokenizer whose vocabulary and (empty) merges are written here; and a
Stable Audio pipeline (DiT, Oobleck VAE, T5 encoder, a character-level unigram T5
tokenizer written here) of the same scale, at 8 kHz, up to 16 s. Each is saved with
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
import warnings
from pathlib import Path
from typing import Any, Literal

from duplex.progress import note

__all__ = ["TINY_KINDS", "build_tiny_pipeline", "tiny_pipeline"]

TinyKind = Literal["image", "video", "audio"]
TINY_KINDS: tuple[TinyKind, ...] = ("image", "video", "audio")
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


def char_t5_tokenizer() -> Any:
    """A T5 tokenizer (``tokenizer.json``) whose unigram vocabulary is printable ASCII, one
    piece a character, plus T5's pad, end and unknown pieces; built here, never downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import T5TokenizerFast

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -1.0)]
    pieces += [(chr(c), -1.0) for c in range(33, 127)]
    model = Tokenizer(models.Unigram(pieces, unk_id=2, byte_fallback=False))
    model.pre_tokenizer = pre_tokenizers.Metaspace()
    model.decoder = decoders.Metaspace()
    return T5TokenizerFast(
        tokenizer_object=model,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=64,
        extra_ids=0,
    )


def _build_tiny_audio() -> Any:
    """A Stable Audio pipeline of a few thousand parameters (the torch seed already set):
    8 kHz stereo, a 2048-sample hop, at most 64 latent frames (16.4 s)."""
    from diffusers import (
        AutoencoderOobleck,
        EDMDPMSolverMultistepScheduler,
        StableAudioDiTModel,
        StableAudioPipeline,
    )
    from diffusers.pipelines.stable_audio import StableAudioProjectionModel
    from transformers import T5Config, T5EncoderModel

    width = 16
    transformer = StableAudioDiTModel(
        sample_size=64,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        num_key_value_attention_heads=1,
        out_channels=4,
        cross_attention_dim=width,
        time_proj_dim=width,
        global_states_input_dim=2 * width,
        cross_attention_input_dim=width,
    )
    vae = AutoencoderOobleck(
        encoder_hidden_size=4,
        downsampling_ratios=[4, 8, 8, 8],
        decoder_channels=2,
        decoder_input_channels=4,
        audio_channels=2,
        channel_multiples=[1, 2, 2, 2, 2],
        sampling_rate=8000,
    )
    text_encoder = T5EncoderModel(
        T5Config(
            vocab_size=128,
            d_model=width,
            d_kv=8,
            d_ff=32,
            num_layers=2,
            num_heads=2,
            decoder_start_token_id=0,
            pad_token_id=0,
            eos_token_id=1,
        )
    )
    projection = StableAudioProjectionModel(
        text_encoder_dim=width, conditioning_dim=width, min_value=0, max_value=512
    )
    scheduler = EDMDPMSolverMultistepScheduler(
        solver_order=2,
        prediction_type="v_prediction",
        sigma_data=1.0,
        sigma_schedule="exponential",
    )
    return StableAudioPipeline(
        vae=vae,
        text_encoder=text_encoder,
        projection_model=projection,
        tokenizer=char_t5_tokenizer(),
        transformer=transformer,
        scheduler=scheduler,
    )


def build_tiny_pipeline(folder: Path, kind: TinyKind, seed: int) -> None:
    """Build the tiny ``kind`` pipeline with weights drawn from ``seed`` and save it to
    ``folder`` (``save_pretrained``)."""
    import torch

    if kind == "audio":
        from diffusers.utils import logging as diffusers_logging
        from transformers.utils import logging as transformers_logging

        for logging in (diffusers_logging, transformers_logging):
            logging.set_verbosity_error()
            logging.disable_progress_bar()
        torch.manual_seed(seed)
        with warnings.catch_warnings():  # Oobleck's weight_norm: deprecated, still its format
            warnings.simplefilter("ignore", FutureWarning)
            _build_tiny_audio().save_pretrained(folder)
        return
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
