"""Record a parity fixture of Kyutai's reference Mimi codec (``moshi==0.2.13``) for ours.

What it does:

1. Maps one of our `MimiConfig` presets (default ``tiny``) onto the reference
   ``loaders.get_mimi`` config dict (``_seanet_kwargs`` / ``_quantizer_kwargs`` /
   ``_transformer_kwargs`` with the preset's widths; everything else as the real
   Mimi: causal, ELU, true skip, LayerNorm, RoPE, layer scale, conv resampling).
2. Fills the reference model with seeded random weights drawn here (not by our
   `random_mimi`): normal with std ``1/sqrt(fan_in)``, biases ``0.1 N``,
   LayerNorm gains ``1 + 0.1 N``, layer scales ``0.1 (1 + 0.1 N)``, codebook usage
   in ``[0.5, 1.5)`` with unit-normal centroids. It writes them under the official
   checkpoint names (``self_attn.in_proj_weight`` / ``self_attn.out_proj.weight``,
   not the reference module's ``in_projs.0`` / ``out_projs.0``) and rebuilds the
   reference *from that file* with ``get_mimi``, so the file is proven to load in
   both implementations.
3. Streams ``--frames`` frames (1920 samples each) of a seeded chirp plus noise at
   24 kHz through ``mimi.encode`` under ``mimi.streaming(1)``, then the codes
   through ``mimi.decode`` frame by frame under a fresh ``streaming(1)``; it also
   records the non-streaming ``encode`` of the whole signal and the non-streaming
   ``decode`` of the streamed codes. The smallest gap between the nearest and
   second-nearest centroid over every code choice is recorded too: it says how
   far float rounding is from flipping a code.

Regenerate (from the repository root, with ``path/to/moshi-ref`` a folder holding the
``moshi`` package of ``moshi==0.2.13``; never import ``moshi.server``)::

    PYTHONPATH=path/to/moshi-ref .venv/bin/python tools/mimi_parity.py \\
        --out tests/fixtures/mimi_tiny

Outputs in ``--out``: ``mimi.safetensors`` (float32, official names), ``trace.npz``
(``pcm [N]`` input, ``codes_stream [T, K]``, ``pcm_stream [N]``, ``codes_offline
[T, K]``, ``pcm_offline [N]``) and ``meta.json`` (preset, seeds, versions, margin,
tolerance). ``tests/models/moshi/test_mimi.py`` loads the weights with our
`load_mimi`, streams the same frames through `MimiStreams` (in a shared batch
with another slot) and requires the same codes exactly and every PCM sample
within ``PCM_ATOL`` = 1e-5 absolute of the reference's (decoded peak ~0.97).
Measured: codes identical; PCM max difference 3e-7 (tiny, 12 frames) and
1.3e-6 (the full ``mimi`` preset, 4 frames, same procedure, not committed:
its weights are 385 MB). The two implementations differ only in float
operation order; the recorded code margin (2.6e-3 for the tiny fixture) is
three orders of magnitude above that rounding.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("NO_TORCH_COMPILE", "1")  # before moshi is imported: plain eager ops
os.environ.setdefault("NO_CUDA_GRAPH", "1")

import numpy as np
import torch
from reference_configs import reference_mimi_config
from safetensors.torch import save_file

from duplex.models.moshi import MimiConfig, mimi_preset

PCM_ATOL = 1e-5
"""Absolute PCM tolerance the test uses (decoded amplitudes are of order 0.1-1)."""


def official_name(name: str) -> str:
    """Reference module key -> checkpoint key (the reverse of its ``_load_hook``)."""
    name = name.replace(".self_attn.in_projs.0.weight", ".self_attn.in_proj_weight")
    return name.replace(".self_attn.out_projs.0.weight", ".self_attn.out_proj.weight")


def random_weights(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Seeded random tensors for every entry of the reference ``state_dict``, official names."""
    generator = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    usage: torch.Tensor | None = None
    for name, tensor in model.state_dict().items():
        shape = tensor.shape
        if name.endswith("._initialized"):
            value = torch.ones(shape)
        elif name.endswith(".cluster_usage"):
            value = usage = 0.5 + torch.rand(shape, generator=generator)
        elif name.endswith(".embedding_sum"):
            assert usage is not None
            value = torch.randn(shape, generator=generator) * usage[:, None]
        elif name.endswith(".scale"):
            value = 0.1 * (1 + 0.1 * torch.randn(shape, generator=generator))
        elif name.endswith((".norm1.weight", ".norm2.weight")):
            value = 1 + 0.1 * torch.randn(shape, generator=generator)
        elif name.endswith(".bias"):
            value = 0.1 * torch.randn(shape, generator=generator)
        elif ".convtr." in name:
            inputs = 1 if name.startswith("upsample.") else shape[0]
            value = torch.randn(shape, generator=generator) / math.sqrt(inputs * shape[2] / 2)
        else:
            value = torch.randn(shape, generator=generator) / math.sqrt(math.prod(shape[1:]))
        out[official_name(name)] = value.float().contiguous()
    return out


def test_signal(config: MimiConfig, frames: int, seed: int) -> torch.Tensor:
    """``[frames * frame_size]`` chirp (80 Hz -> 4 kHz, amplitude 0.5) plus 0.05 N noise."""
    samples = frames * config.frame_size
    t = torch.arange(samples, dtype=torch.float64) / config.sample_rate
    duration = samples / config.sample_rate
    f0, f1 = 80.0, 4000.0
    phase = 2 * math.pi * (f0 * t + (f1 - f0) * t**2 / (2 * duration))
    noise = torch.randn(samples, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (0.5 * torch.sin(phase) + 0.05 * noise).float()


def code_margin(mimi: Any, pcm: torch.Tensor) -> float:
    """Smallest (second-nearest - nearest) centroid distance over every streamed code choice."""
    frame = mimi.frame_size
    smallest = math.inf
    with mimi.streaming(1):
        for start in range(0, pcm.shape[-1], frame):
            latent = mimi._encode_to_unquantized_latent(pcm[None, None, start : start + frame])
            quantizer = mimi.quantizer
            for rvq, count in (
                (quantizer.rvq_first, 1),
                (quantizer.rvq_rest, mimi.num_codebooks - 1),
            ):
                residual = rvq.input_proj(latent).transpose(1, 2).reshape(-1, rvq.dimension)
                for layer in list(rvq.vq.layers)[:count]:
                    centroids = layer._codebook.embedding
                    dists = torch.cdist(residual[None], centroids[None])[0]
                    best = dists.topk(2, largest=False).values
                    smallest = min(smallest, float((best[:, 1] - best[:, 0]).min()))
                    residual = residual - centroids[dists.argmin(-1)]
    return smallest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--frames", type=int, default=12)
    parser.add_argument("--weight-seed", type=int, default=1234)
    parser.add_argument("--signal-seed", type=int, default=5)
    args = parser.parse_args(argv)

    from moshi.models import loaders

    torch.set_num_threads(1)
    config = mimi_preset(args.preset)
    ref_config = reference_mimi_config(config)
    args.out.mkdir(parents=True, exist_ok=True)
    weights_path = args.out / "mimi.safetensors"
    blank = loaders.get_mimi(None, ref_config, num_codebooks=config.num_codebooks)
    save_file(random_weights(blank, args.weight_seed), str(weights_path))
    mimi = loaders.get_mimi(weights_path, ref_config, num_codebooks=config.num_codebooks)
    frame = mimi.frame_size
    assert frame == config.frame_size, (frame, config.frame_size)

    pcm = test_signal(config, args.frames, args.signal_seed)
    with torch.no_grad():
        codes = []
        with mimi.streaming(1):
            for start in range(0, pcm.shape[-1], frame):
                codes.append(mimi.encode(pcm[None, None, start : start + frame]))
        codes_stream = torch.cat(codes, dim=-1)  # [1, K, T]
        decoded = []
        with mimi.streaming(1):
            for t in range(codes_stream.shape[-1]):
                decoded.append(mimi.decode(codes_stream[:, :, t : t + 1]))
        pcm_stream = torch.cat(decoded, dim=-1)[0, 0]
        codes_offline = mimi.encode(pcm[None, None])
        pcm_offline = mimi.decode(codes_stream)[0, 0]
        margin = code_margin(mimi, pcm)

    np.savez_compressed(
        args.out / "trace.npz",
        pcm=pcm.numpy(),
        codes_stream=codes_stream[0].T.numpy().astype(np.int64),
        pcm_stream=pcm_stream.numpy(),
        codes_offline=codes_offline[0].T.numpy().astype(np.int64),
        pcm_offline=pcm_offline.numpy(),
    )
    meta = {
        "preset": config.name,
        "frames": args.frames,
        "weight_seed": args.weight_seed,
        "signal_seed": args.signal_seed,
        "num_codebooks": config.num_codebooks,
        "min_code_margin": margin,
        "pcm_atol": PCM_ATOL,
        "pcm_stream_peak": float(pcm_stream.abs().max()),
        "moshi": importlib.metadata.version("moshi"),
        "torch": torch.__version__,
    }
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
