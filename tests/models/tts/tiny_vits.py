"""A tiny seeded random-weight VITS checkpoint, made locally: a character vocabulary, a
small `VitsConfig`, saved with ``save_pretrained`` so it loads through the same code
path as a real MMS-TTS checkpoint folder."""

from __future__ import annotations

import json
import string
from pathlib import Path

VOCAB = ["<pad>", " ", "'", "-", *string.ascii_lowercase]


def save_tiny_vits(
    folder: Path, *, seed: int = 0, speakers: int = 1, noise: bool = False, rate: int = 16000
) -> Path:
    """Write a tiny VITS (``noise=False``: deterministic sampling, noise scales 0) to ``folder``."""
    import torch
    from transformers import VitsConfig, VitsModel, VitsTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab_file = folder / "vocab.json"
    vocab_file.write_text(json.dumps({c: i for i, c in enumerate(VOCAB)}))
    tokenizer = VitsTokenizer(str(vocab_file), add_blank=True, normalize=True, phonemize=False)
    tokenizer.save_pretrained(folder)
    config = VitsConfig(
        vocab_size=len(VOCAB),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        ffn_dim=32,
        flow_size=8,
        spectrogram_bins=9,
        upsample_initial_channel=16,
        upsample_rates=[4, 4],
        upsample_kernel_sizes=[8, 8],
        resblock_kernel_sizes=[3],
        resblock_dilation_sizes=[[1]],
        duration_predictor_filter_channels=16,
        duration_predictor_num_flows=1,
        prior_encoder_num_flows=1,
        prior_encoder_num_wavenet_layers=1,
        posterior_encoder_num_wavenet_layers=1,
        num_speakers=speakers,
        speaker_embedding_size=8 if speakers > 1 else 0,
        noise_scale=0.667 if noise else 0.0,
        noise_scale_duration=0.8 if noise else 0.0,
        sampling_rate=rate,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = VitsModel(config).eval()
    model.save_pretrained(folder)
    return folder
