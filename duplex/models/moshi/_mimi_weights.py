"""Load and write Mimi weights under the official checkpoint tensor names.

The names are those of Kyutai's ``tokenizer-e351c8d8-checkpoint125.safetensors``
(weight norm already folded into plain convolutions):
``encoder.model.{i}.conv.conv.{weight,bias}``, ``encoder.model.{i}.block.{1,3}.conv.conv.*``,
``decoder.model.{i}.convtr.convtr.*``, ``{encoder,decoder}_transformer.transformer.layers.{i}.``
``{self_attn.in_proj_weight, self_attn.out_proj.weight, norm1.*, norm2.*, linear1.weight,``
``linear2.weight, layer_scale_1.scale, layer_scale_2.scale}``,
``quantizer.{rvq_first,rvq_rest}.{input_proj,output_proj}.weight``,
``quantizer.*.vq.layers.{q}._codebook.{_initialized,cluster_usage,embedding_sum}``,
``downsample.conv.conv.conv.weight`` and ``upsample.convtr.convtr.convtr.weight``.
`save_random_mimi` writes seeded random weights under the same names, so tests
exercise this loader and nothing is downloaded.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from duplex.exceptions import ConfigError

from ._mimi import MimiModel
from ._mimi_config import MimiConfig

__all__ = [
    "cast_mimi",
    "expected_mimi_tensors",
    "is_codebook",
    "load_mimi",
    "random_mimi",
    "save_random_mimi",
]


def is_codebook(name: str) -> bool:
    """A codebook statistic: kept float32 in any Mimi dtype (the quantizer measures
    distances between near centroids)."""
    return "._codebook." in name


def expected_mimi_tensors(config: MimiConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name Mimi needs and its shape (built on the meta device, no memory)."""
    with torch.device("meta"):
        model = MimiModel(config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:8])
    return f"{shown}{', ...' if len(names) > 8 else ''} ({len(names)} in all)"


def load_mimi(
    path: str | Path,
    config: MimiConfig,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    strict: bool = True,
) -> MimiModel:
    """Build a `MimiModel` from a safetensors file with the official names.

    Args:
        path: the Mimi ``.safetensors`` file.
        config: the architecture it holds.
        device, dtype: where and how to keep the weights (codebook statistics stay float32).
        strict: refuse tensors Mimi does not use (else ignore them).

    Raises:
        ConfigError: tensors are missing, mis-shaped, or (strict) unknown; the message lists them.
    """
    tensors = load_file(str(path), device="cpu")
    expected = expected_mimi_tensors(config)
    missing = sorted(set(expected) - set(tensors))
    unknown = sorted(set(tensors) - set(expected))
    misshapen = sorted(
        f"{name} {tuple(tensors[name].shape)} != {shape}"
        for name, shape in expected.items()
        if name in tensors and tuple(tensors[name].shape) != shape
    )
    problems = []
    if missing:
        problems.append(f"missing Mimi tensors {_listing(missing)}")
    if strict and unknown:
        problems.append(f"unknown Mimi tensors {_listing(unknown)}")
    if misshapen:
        problems.append(f"Mimi tensors with the wrong shape: {_listing(misshapen)}")
    if problems:
        raise ConfigError(f"{path} does not hold Mimi {config.name!r}: " + "; ".join(problems))
    state: dict[str, torch.Tensor] = {}
    for name in expected:
        keep = torch.float32 if is_codebook(name) else dtype
        state[name] = tensors[name].to(device=device, dtype=keep)
    with torch.device("meta"):
        model = MimiModel(config)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval().requires_grad_(False)


def cast_mimi(model: MimiModel, dtype: torch.dtype) -> MimiModel:
    """``model`` in ``dtype`` (in place), but for its codebook statistics, which stay float32
    as `load_mimi` keeps them (`is_codebook`)."""
    kept = {n: b for n, b in model.named_buffers() if is_codebook(n)}
    model.to(dtype)
    for name, buffer in kept.items():
        owner, leaf = name.rsplit(".", 1)
        setattr(model.get_submodule(owner), leaf, buffer)
    return model


def random_mimi(config: MimiConfig, seed: int) -> MimiModel:
    """A float32 `MimiModel` with seeded random weights that keep activations near unit scale.

    Convolutions and linears: normal with std ``1/sqrt(fan_in)``; biases ``0.1 N``;
    LayerNorm gains ``1 + 0.1 N``; layer scales ``0.1 (1 + 0.1 N)``; codebook
    usage in ``[0.5, 1.5)`` with unit-normal centroids.
    """
    generator = torch.Generator().manual_seed(seed)

    def normal(shape: torch.Size) -> torch.Tensor:
        return torch.randn(shape, generator=generator)

    with torch.device("meta"):
        model = MimiModel(config)
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        shape = tensor.shape
        if name.endswith("._initialized"):
            value = torch.ones(shape)
        elif name.endswith(".cluster_usage"):
            value = 0.5 + torch.rand(shape, generator=generator)
        elif name.endswith(".embedding_sum"):
            usage = state[name.replace("embedding_sum", "cluster_usage")]
            value = normal(shape) * usage[:, None]
        elif name.endswith(".scale"):
            value = 0.1 * (1 + 0.1 * normal(shape))
        elif name.endswith((".norm1.weight", ".norm2.weight")):
            value = 1 + 0.1 * normal(shape)
        elif name.endswith(".bias"):
            value = 0.1 * normal(shape)
        elif ".convtr." in name:  # [in, out / groups, kernel]; stride kernel / 2
            inputs = 1 if name.startswith("upsample.") else shape[0]  # upsample: channel-wise
            value = normal(shape) / math.sqrt(inputs * shape[2] / 2)
        else:
            value = normal(shape) / math.sqrt(math.prod(shape[1:]))
        state[name] = value
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval().requires_grad_(False)


def save_random_mimi(path: str | Path, config: MimiConfig, seed: int) -> None:
    """Write seeded random Mimi weights (float32) to ``path`` under the official names."""
    model = random_mimi(config, seed)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
