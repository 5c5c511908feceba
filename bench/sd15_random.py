"""A Stable-Diffusion-1.5-sized pipeline with seeded random weights, saved like a checkpoint.

    python3 bench/sd15_random.py OUT_DIR [--seed 0] [--dtype float16]

UNet, VAE and CLIP text encoder at SD 1.5's published sizes (860 M, 84 M and 123 M
parameters), a DDIM scheduler, and the byte-level CLIP tokenizer that
``duplex.models.diffusion`` writes for its tiny pipelines. Saved with
``save_pretrained``, so ``duplex serve --image-model OUT_DIR`` loads it the way it loads a
real checkpoint: the work per step is a real pipeline's, the pictures are noise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def build(out: Path, seed: int, dtype_name: str) -> None:
    import torch
    from diffusers import (
        AutoencoderKL,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from slack import SD15_UNET
    from transformers import CLIPTextConfig, CLIPTextModel

    from duplex.models.diffusion._tiny import byte_clip_tokenizer, sd_scheduler

    tokenizer, vocab_size = byte_clip_tokenizer()
    torch.manual_seed(seed)
    dtype = getattr(torch, dtype_name)
    unet = UNet2DConditionModel(**SD15_UNET).to(dtype)
    vae = AutoencoderKL(
        block_out_channels=(128, 256, 512, 512),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        latent_channels=4,
        layers_per_block=2,
        sample_size=512,
    ).to(dtype)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
            hidden_size=768,
            intermediate_size=3072,
            num_attention_heads=12,
            num_hidden_layers=12,
            vocab_size=vocab_size,
            max_position_embeddings=77,
        )
    ).to(dtype)
    scheduler = sd_scheduler()
    StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    ).save_pretrained(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float16")
    args = parser.parse_args()
    build(args.out, args.seed, args.dtype)
    print(f"saved {args.out}")
