"""Counter-based sampling noise: a pure function of device tensors, so a CUDA graph can replay it.

A ``torch.Generator`` per slot cannot live inside a captured graph (its state
advances on the host) and costs one kernel per row. Instead every uniform is a
hash of ``(slot seed, slot frame, stream, vocabulary index)``:
``key = mix(mix(mix(seed) + frame * G) + (stream + 1) * G)`` and the draw for
index ``i`` is ``mix(key + (i + 1) * G)``: the splitmix64 sequence seeded with
``key`` (``G`` is the golden-ratio increment, ``mix`` the splitmix64 finaliser).
Int64 multiplication wraps modulo 2^64 in torch on CPU and CUDA, and shifts are
made logical by masking, so the bits equal the unsigned reference.

A slot's noise depends on nothing but its own seed and frame counter: it is the
same whatever other rows share the batch, and a session replays exactly.
"""

from __future__ import annotations

import torch

__all__ = ["as_int64", "counter_uniform", "mix64"]

_MASK64 = (1 << 64) - 1


def as_int64(value: int) -> int:
    """Any Python int as the int64 with the same low 64 bits (seeds, hash constants)."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = as_int64(0x9E3779B97F4A7C15)
_MUL1 = as_int64(0xBF58476D1CE4E5B9)
_MUL2 = as_int64(0x94D049BB133111EB)
_UNIFORM_BITS = 24
"""float32 holds 24 bits exactly; ``(bits + 0.5) / 2^24`` is never 0 or 1."""


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """The splitmix64 finaliser on int64 tensors (wrapping multiplies)."""
    x = (x ^ _shr(x, 30)) * _MUL1
    x = (x ^ _shr(x, 27)) * _MUL2
    return x ^ _shr(x, 31)


def counter_uniform(
    seeds: torch.Tensor, frames: torch.Tensor, stream: int, vocab: int
) -> torch.Tensor:
    """``[B, vocab]`` float32 uniforms in (0, 1), one row per ``(seed, frame)`` pair.

    Args:
        seeds: ``[B]`` int64 slot seeds.
        frames: ``[B]`` int64 slot frame counters.
        stream: which draw of the frame (0: text, ``s + 1``: depth step ``s``).
        vocab: draws per row.
    """
    key = mix64(seeds)
    key = mix64(key + frames * _GOLDEN)
    key = mix64(key + as_int64((stream + 1) * _GOLDEN))
    index = torch.arange(1, vocab + 1, device=seeds.device, dtype=torch.int64)
    bits = mix64(key[:, None] + index * _GOLDEN)
    top = _shr(bits, 64 - _UNIFORM_BITS).to(torch.float32)
    return (top + 0.5) * (1.0 / (1 << _UNIFORM_BITS))
