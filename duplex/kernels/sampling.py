"""Per-row token sampling from counter-based noise: the torch reference and a fused Triton kernel.

Noise. A ``torch.Generator`` per slot cannot live inside a captured CUDA graph
(its state advances on the host) and costs one kernel per row. Instead every
uniform is a hash of ``(slot seed, slot frame, stream, vocabulary index)``:
``key = mix(mix(mix(seed) + frame * G) + (stream + 1) * G)`` and the draw for
index ``i`` is ``mix(key + (i + 1) * G)``: the splitmix64 sequence seeded with
``key`` (``G`` is the golden-ratio increment, ``mix`` the splitmix64
finaliser). Its top 24 bits ``b`` give ``U = (b + 1/2) / 2^24`` in (0, 1).
Int64 multiplication wraps modulo 2^64 in torch on CPU and CUDA, and shifts
are made logical by masking, so the bits equal the unsigned reference (the
kernel computes in uint64). A slot's noise depends on nothing but its own seed
and frame counter: it is the same whatever other rows share the batch, and a
session replays exactly.

Sampling. A sampled row (temperature ``T > 0``) keeps the logits ``>=`` its
k-th largest logit (ties at the k-th value are kept; ``top_k == 0`` keeps
everything) and draws the Gumbel race ``argmax_i(logit_i - T * log(-log U_i))``.
That is the log of the exponential race ``argmax_i(softmax(logits / T)_i / -log U_i)``,
times ``T``: the same token for the same noise, without a softmax. Working in
logit space is what lets the kernel equal the reference token for token. The
kept set is an exact comparison on the float32 logits, not on probabilities
whose rounding depends on a sum's order; the race scores are computed in
float64 from exact inputs (float32 logits and temperature, 24-bit uniforms),
so two ``log`` implementations (each within an ulp of float64; Triton's
float32 ``log`` is an approximation) can disagree only on scores that tie to
about 1e-16. Greedy rows (``T <= 0``) are exactly ``argmax(logits)``, the
first index on ties.

`sample_reference` is the torch path (the CPU implementation and the test
oracle). `sample` runs one program per row in a single launch: an exact k-th
largest search by bisection over the float32 order keys (no sort; at most 32
counting passes, about 13 on real logits), then one pass that hashes, scores
and races. No host sync and shapes fixed by the inputs, so a CUDA graph can
capture either.
"""

from __future__ import annotations

import torch

from . import _triton

if _triton.available():
    import triton
    import triton.language as tl

__all__ = [
    "as_int64",
    "counter_uniform",
    "mix64",
    "sample",
    "sample_reference",
    "sample_tokens",
]

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
BLOCK = 4096
"""Vocabulary entries per kernel tile (fewer, larger tiles also keep the interpreter fast)."""


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


def sample_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    uniform: torch.Tensor,
    top_k_cap: int,
) -> torch.Tensor:
    """Pick one token per row, with shapes fixed by ``logits`` and ``top_k_cap`` only.

    Args:
        logits: ``[B, V]`` float32.
        temperature: ``[B]``; rows with ``<= 0`` are greedy.
        top_k: ``[B]``; 0 keeps the whole vocabulary.
        uniform: ``[B, V]`` noise in (0, 1) (see `counter_uniform`).
        top_k_cap: at least every sampled row's effective k (a host constant, so
            ``topk`` has a static width; the result does not depend on it).

    Returns:
        ``[B]`` int64 tokens.
    """
    vocab = logits.shape[-1]
    cap = max(1, min(top_k_cap, vocab))
    k = torch.where(top_k > 0, top_k, vocab).clamp(1, cap)
    kth = logits.topk(cap, dim=-1).values.gather(-1, (k - 1)[:, None])
    log_e = torch.log(-torch.log(uniform.double()))  # log of the race's Exp(1) draws
    score = logits.double() - temperature.double()[:, None] * log_e
    score = torch.where(logits >= kth, score, float("-inf"))
    return torch.where(temperature > 0, score.argmax(dim=-1), logits.argmax(dim=-1))


def sample_reference(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    seeds: torch.Tensor,
    frames: torch.Tensor,
    stream: int,
    top_k_cap: int,
) -> torch.Tensor:
    """`sample_tokens` on `counter_uniform` noise: what `sample` computes, in torch.

    Args:
        logits: ``[B, V]`` float32.
        temperature: ``[B]``; rows with ``<= 0`` are greedy.
        top_k: ``[B]``; 0 keeps the whole vocabulary.
        seeds: ``[B]`` int64 slot seeds.
        frames: ``[B]`` int64 slot frame counters.
        stream: which draw of the frame (0: text, ``s + 1``: depth step ``s``).
        top_k_cap: at least every sampled row's effective k (host constant).

    Returns:
        ``[B]`` int64 tokens.
    """
    uniform = counter_uniform(seeds, frames, stream, logits.shape[-1])
    return sample_tokens(logits, temperature, top_k, uniform, top_k_cap)


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    seeds: torch.Tensor,
    frames: torch.Tensor,
    stream: int,
    top_k_cap: int,
) -> torch.Tensor:
    """`sample_reference` as one Triton launch (CUDA; interpreted for host tensors).

    The 1-D arguments may be strided views (a column of the per-slot state).
    Rows whose logits hold NaN get some token in ``[0, V)``.
    """
    batch, vocab = logits.shape
    if logits.dtype != torch.float32:
        raise ValueError("sample needs float32 logits (the order keys are float32 bits)")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    out = torch.empty(batch, dtype=torch.int64, device=logits.device)
    _sample[(batch,)](
        logits,
        temperature,
        top_k,
        seeds,
        frames,
        out,
        logits.stride(0),
        temperature.stride(0),
        top_k.stride(0),
        seeds.stride(0),
        frames.stride(0),
        vocab,
        max(1, min(top_k_cap, vocab)),
        stream,
        BLOCK=min(BLOCK, triton.next_power_of_2(vocab)),
        num_warps=8,
    )
    return out


if _triton.available():

    @triton.jit
    def _mix64(x):
        """splitmix64's finaliser on uint64 (logical shifts, wrapping multiplies)."""
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB
        return x ^ (x >> 31)

    @triton.jit
    def _row_key(seed, frame, stream):
        """The splitmix64 seed of one row's draws (`counter_uniform`'s ``key``)."""
        key = _mix64(seed.to(tl.uint64, bitcast=True))
        key = _mix64(key + frame.to(tl.uint64, bitcast=True) * 0x9E3779B97F4A7C15)
        return _mix64(key + tl.cast(stream + 1, tl.uint64) * 0x9E3779B97F4A7C15)

    @triton.jit
    def _uniform(key, index):
        """float32 uniforms for vocabulary ``index`` (int32), bit-equal to `counter_uniform`."""
        bits = _mix64(key + (index + 1).to(tl.uint64) * 0x9E3779B97F4A7C15)
        return ((bits >> 40).to(tl.float32) + 0.5) * (1.0 / 16777216.0)

    @triton.jit
    def _key(x):
        """A float32's order key: its int32 bits, ``bits ^ 0x7FFFFFFF`` below zero, 0 for -0.0."""
        bits = x.to(tl.int32, bitcast=True)
        return tl.where(x == 0.0, 0, tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)).to(tl.int64)

    @triton.jit
    def _value(key):
        """The float32 of an order key (`_key`'s inverse)."""
        bits = key.to(tl.int32)
        return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.float32, bitcast=True)

    @triton.jit
    def _kth_largest(base, vocab, k, BLOCK: tl.constexpr):
        """The row's k-th largest logit, by bisection over the float32 order keys.

        Keeps ``count(logits >= value(lo)) >= k`` and ``kth <= value(hi)``. Each
        step counts the logits ``>= value(mid)`` and moves ``lo`` up to the
        smallest of them or ``hi`` down to the largest logit below, so both ends
        are logits: ties cost no steps, exactly ``k`` above ends the search, and
        the key interval at least halves (at most 32 steps, NaN rows included).
        """
        lo = tl.full([], -2139095041, tl.int64)  # -inf
        hi = tl.full([], 2139095040, tl.int64)  # +inf
        while lo < hi:
            mid = lo + (hi - lo + 1) // 2
            value = _value(mid)
            counts = tl.zeros([BLOCK], tl.int32)
            above = tl.full([BLOCK], float("inf"), tl.float32)
            below = tl.full([BLOCK], float("-inf"), tl.float32)
            for start in range(0, vocab, BLOCK):
                offsets = start + tl.arange(0, BLOCK)
                # -inf padding is never counted: every probed value is above -inf
                logits = tl.load(base + offsets, mask=offsets < vocab, other=float("-inf"))
                kept = logits >= value
                counts += kept.to(tl.int32)
                above = tl.minimum(above, tl.where(kept, logits, float("inf")))
                below = tl.maximum(below, tl.where(kept, float("-inf"), logits))
            count = tl.sum(counts, axis=0)
            up = tl.maximum(_key(tl.min(above, axis=0)), mid)
            down = tl.minimum(_key(tl.max(below, axis=0)), mid - 1)
            lo = tl.where(count >= k, up, lo)
            hi = tl.where(count == k, up, tl.where(count > k, hi, down))
        return _value(lo)

    @triton.jit
    def _sample(
        logits_ptr,
        temp_ptr,
        top_k_ptr,
        seed_ptr,
        frame_ptr,
        out_ptr,
        stride_l,
        stride_t,
        stride_k,
        stride_s,
        stride_f,
        vocab,
        cap,
        stream,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        base = logits_ptr + row.to(tl.int64) * stride_l
        temperature = tl.load(temp_ptr + row * stride_t).to(tl.float64)
        top_k = tl.load(top_k_ptr + row * stride_k)
        sampled = temperature > 0
        k = tl.minimum(tl.maximum(tl.where(top_k > 0, top_k, vocab), 1), cap)
        threshold = tl.full([], float("-inf"), tl.float32)  # keeps every entry
        if sampled & (k < vocab):
            threshold = _kth_largest(base, vocab, k, BLOCK)
        seed = tl.load(seed_ptr + row * stride_s)
        key = _row_key(seed, tl.load(frame_ptr + row * stride_f), stream)
        # per lane: the best score so far and its first index; greedy rows race the
        # bare logits, so they get the argmax, first index on ties
        best = tl.full([BLOCK], float("-inf"), tl.float64)
        first = tl.zeros([BLOCK], tl.int32)
        for start in range(0, vocab, BLOCK):
            offsets = start + tl.arange(0, BLOCK)
            valid = offsets < vocab
            logits = tl.load(base + offsets, mask=valid, other=float("-inf"))
            score = logits.to(tl.float64)
            if sampled:
                log_e = tl.log(-tl.log(_uniform(key, offsets).to(tl.float64)))
                score = score - temperature * log_e
            score = tl.where(valid & (logits >= threshold), score, float("-inf"))
            better = score > best
            first = tl.where(better, offsets, first)
            best = tl.where(better, score, best)
        top = tl.max(best, axis=0)
        token = tl.min(tl.where(best == top, first, vocab), axis=0)
        tl.store(out_ptr + row, token.to(tl.int64))
