"""Load and write LM weights under the official checkpoint tensor names.

The names are those of ``kyutai/moshiko-pytorch-bf16`` ``model.safetensors``
and ``nvidia/personaplex-7b-v1``: ``text_emb.weight``, ``emb.{q}.weight``,
``transformer.layers.{i}.{norm1,norm2}.alpha``,
``transformer.layers.{i}.self_attn.in_proj_weight`` / ``out_proj.weight``,
``transformer.layers.{i}.gating.{linear_in,linear_out}.weight``, ``out_norm.alpha``,
``text_linear.weight``, ``depformer_in.{s}.weight``, ``depformer_text_emb.weight``,
``depformer_emb.{s}.weight``, ``depformer.layers.{i}.self_attn.in_proj_weight``
(``dep_q`` steps stacked on dim 0), ``depformer.layers.{i}.gating.{s}.*`` and
``linears.{s}.weight``.

A PersonaPlex config (``dep_q`` 16) also loads an 8-step depth checkpoint the
way the PersonaPlex loader does: missing steps 8..15 copy steps 0..7.
`save_random_lm` writes seeded random weights under the same names, so tests
exercise this loader and nothing is downloaded.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from duplex.exceptions import ConfigError

from ._config import MoshiConfig
from ._lm import MoshiLM

__all__ = ["expected_tensors", "load_lm", "random_lm", "save_random_lm"]

_STEP_KEY = re.compile(
    r"^(depformer_in|depformer_emb|linears|depformer\.layers\.\d+\.gating)\.(\d+)\."
)
_STACKED = re.compile(r"^depformer\.layers\.\d+\.self_attn\.(in_proj_weight|out_proj\.weight)$")


def expected_tensors(config: MoshiConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name the LM needs and its shape (built on the meta device, no memory)."""
    with torch.device("meta"):
        model = MoshiLM(config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def _fill_missing_steps(
    tensors: dict[str, torch.Tensor], config: MoshiConfig, expected: dict[str, tuple[int, ...]]
) -> None:
    """Extend a checkpoint with fewer depth steps than ``config.dep_q`` by repeating steps.

    Step ``s`` copies step ``s - stored`` (PersonaPlex's 0..7 -> 8..15). A step
    tensor still missing after that (``depformer_emb.{stored-1}``, the input of
    step ``stored``) is zero: steps at or past ``agent_q`` only predict the
    user's own codebooks, which inference never samples.
    """
    stacked = [n for n in tensors if _STACKED.match(n)]
    if not stacked:
        return
    rows_per_step = 3 * config.depformer_dim
    first = tensors[next(n for n in stacked if n.endswith("in_proj_weight"))]
    stored = first.shape[0] // rows_per_step
    if stored >= config.dep_q:
        return
    if config.dep_q % stored:
        raise ConfigError(f"cannot extend {stored} depth steps to dep_q={config.dep_q}")
    repeat = config.dep_q // stored
    for name in stacked:
        tensors[name] = tensors[name].repeat(repeat, 1)
    for name in list(tensors):
        match = _STEP_KEY.match(name)
        if match is None:
            continue
        step = int(match.group(2))
        for copy in range(1, repeat):
            target = step + copy * stored
            new = f"{match.group(1)}.{target}.{name[match.end() :]}"
            tensors.setdefault(new, tensors[name])
    for name, shape in expected.items():
        match = _STEP_KEY.match(name)
        if name in tensors or match is None:
            continue
        step = int(match.group(2)) + (match.group(1) == "depformer_emb")
        if step >= config.agent_q:
            tensors[name] = torch.zeros(shape, dtype=first.dtype)


def load_lm(
    path: str | Path,
    config: MoshiConfig,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    strict: bool = True,
) -> MoshiLM:
    """Build a `MoshiLM` from a safetensors file with the official names.

    Args:
        path: the LM ``.safetensors`` file.
        config: the architecture it holds.
        device, dtype: where and how to keep the weights.
        strict: refuse tensors the LM does not use (else ignore them).

    Raises:
        ConfigError: a tensor is missing, has the wrong shape, or (strict) is unknown.
    """
    tensors = load_file(str(path), device="cpu")
    expected = expected_tensors(config)
    _fill_missing_steps(tensors, config, expected)
    missing = sorted(set(expected) - set(tensors))
    unknown = sorted(set(tensors) - set(expected))
    if missing:
        raise ConfigError(f"{path}: missing LM tensors {missing[:5]} ({len(missing)} in all)")
    if strict and unknown:
        raise ConfigError(f"{path}: unknown LM tensors {unknown[:5]} ({len(unknown)} in all)")
    state: dict[str, torch.Tensor] = {}
    for name, shape in expected.items():
        tensor = tensors[name]
        if tuple(tensor.shape) != shape:
            raise ConfigError(f"{path}: {name} has shape {tuple(tensor.shape)}, expected {shape}")
        state[name] = tensor.to(device=device, dtype=dtype)
    with torch.device("meta"):
        model = MoshiLM(config)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval().requires_grad_(False)


def random_lm(
    config: MoshiConfig,
    seed: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> MoshiLM:
    """A `MoshiLM` with seeded random weights (std ``1/sqrt(fan_in)``, gains near 1).

    ``device``: draw every tensor in place there, from a generator on that device, so a
    7B model is never held on the CPU (``--random-weights``); same law, another stream.
    ``None``: draw on the CPU, the stream the ``tiny`` checkpoint files are written from.
    """
    if device is not None:
        return _random_lm_on(config, seed, dtype, torch.device(device))
    generator = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        model = MoshiLM(config)
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name.endswith(".alpha"):
            value = 1.0 + 0.1 * torch.randn(tensor.shape, generator=generator)
        else:
            fan_in = tensor.shape[-1]
            value = torch.randn(tensor.shape, generator=generator) / math.sqrt(fan_in)
        state[name] = value.to(dtype)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval().requires_grad_(False)


def _random_lm_on(
    config: MoshiConfig, seed: int, dtype: torch.dtype, device: torch.device
) -> MoshiLM:
    with torch.device("meta"):
        model = MoshiLM(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            if name.endswith(".alpha"):
                tensor.normal_(1.0, 0.1, generator=generator)
            else:
                tensor.normal_(0.0, 1.0 / math.sqrt(tensor.shape[-1]), generator=generator)
    return model.eval().requires_grad_(False)


def save_random_lm(
    path: str | Path, config: MoshiConfig, seed: int, *, dtype: torch.dtype = torch.float32
) -> None:
    """Write seeded random LM weights to ``path`` under the official names."""
    model = random_lm(config, seed, dtype=dtype)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
