"""Linear weights in float8 e4m3 with a float32 scale a row (``weight_dtype = "fp8"``).

Why: the 7B's temporal transformer is 6.6 G of its 7.7 G values; at one byte each they free
about 6.6 GB of device memory for KV slots and halve the weight bytes a step reads. Each
output row keeps its own scale (its largest magnitude maps to e4m3's 448), so a block of
rows is itself a quantized matrix with its scales.

Activations are quantized per token at each call (a dynamic scale a row, as the weights'; on
CUDA one Triton launch, `duplex.kernels.fp8_rows`),
and on a CUDA device with fp8 tensor cores the product is one ``torch._scaled_mm`` with
row-wise scales (its operands: the activations row-major, the weight column-major, both
sides multiples of 16). Anywhere else (the CPU, other shapes) the same arithmetic is
emulated in float32, the quantized operands dequantized and multiplied, so tests and the
quality bench see the rounding the GPU does (up to the order of the sums).
"""

from __future__ import annotations

import functools
from typing import final

import torch
from torch import nn

from duplex.kernels import triton_available
from duplex.kernels.fp8_rows import quantize_rows_e4m3, quantize_rows_e4m3_reference

__all__ = [
    "E4M3",
    "FP8_CAPABILITY",
    "FP8_EPS",
    "Fp8Linear",
    "fp8_linear",
    "probe_tensor_cores",
    "quantize_rows",
    "quantized_product",
    "scaled_product",
]

E4M3 = torch.float8_e4m3fn
FP8_EPS = 1e-12
"""An all-zero row's scale floor (its values stay 0)."""


def quantize_rows(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` -> its e4m3 values ``[N, K]`` and float32 scales ``[N]`` (value * scale)."""
    values, scale = quantize_rows_e4m3_reference(matrix, FP8_EPS)
    return values, scale[:, 0]


FP8_CAPABILITY = (8, 9)
"""The first CUDA compute capability with fp8 tensor cores (Ada, Hopper and on)."""


@functools.cache
def _has_fp8_tensor_cores(device: torch.device) -> bool:
    """Asked once a device (every projection asks)."""
    return torch.cuda.get_device_capability(device) >= FP8_CAPABILITY


def _tensor_cores(x8: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``torch._scaled_mm`` takes these operands here (for a bf16 result)."""
    if not x8.is_cuda:
        return False
    if weight.shape[0] % 16 or weight.shape[1] % 16:
        return False
    return _has_fp8_tensor_cores(x8.device)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x @ (weight * scale).T`` with ``x`` quantized to e4m3 a row; out in ``x``'s dtype.

    Args:
        x: ``[..., K]`` activations (bf16 on a GPU, float32 on the CPU).
        weight: ``[N, K]`` e4m3 values, row-major.
        scale: ``[N]`` float32 scales.
    """
    flat = x.reshape(-1, x.shape[-1])
    if x.is_cuda and triton_available() and flat.stride(-1) == 1:
        x8, x_scale = quantize_rows_e4m3(flat, FP8_EPS)  # one launch, the same values
    else:
        x8, x_scale = quantize_rows_e4m3_reference(flat, FP8_EPS)
    out = quantized_product(x8, x_scale, weight, scale, x.dtype)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def quantized_product(
    x8: torch.Tensor,
    x_scale: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """`fp8_linear` of activations already quantized (``x8`` ``[M, K]`` e4m3, ``x_scale``
    ``[M, 1]``): on tensor cores where they take the operands, else emulated."""
    if out_dtype == torch.bfloat16 and _tensor_cores(x8, weight):
        return scaled_product(x8, x_scale, weight, scale, out_dtype)
    return ((x8.float() * x_scale) @ (weight.float() * scale[:, None]).t()).to(out_dtype)


def scaled_product(
    x8: torch.Tensor,
    x_scale: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``(x8 * x_scale) @ (weight * scale).T`` in one ``torch._scaled_mm`` (row-wise scales:
    ``x_scale`` ``[M, 1]``, ``scale`` ``[N]``; the weight's transpose is the column-major
    operand it wants). torch's CPU build runs the same call, so its layout is tested there."""
    return torch._scaled_mm(
        x8, weight.t(), scale_a=x_scale, scale_b=scale[None, :], out_dtype=out_dtype
    )


def probe_tensor_cores(device: torch.device) -> str | None:
    """Run one small `scaled_product` on ``device`` against the emulation, before a model
    depends on it (and before graphs capture it): ``None`` when it agrees, else what went
    wrong (a torch or cuBLAS build without row-wise scaling for this card, say)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(32, 64, generator=generator).to(device)
    x = torch.randn(16, 64, generator=generator).to(device)
    values, scale = quantize_rows(weight)
    x_values, x_scale = quantize_rows(x)
    try:
        got = scaled_product(x_values, x_scale[:, None], values, scale, torch.bfloat16)
    except RuntimeError as exc:
        return f"torch._scaled_mm failed: {exc}"
    want = (x_values.float() * x_scale[:, None]) @ (values.float() * scale[:, None]).t()
    error = float((got.float() - want).abs().max() / want.abs().max())
    return None if error < 0.02 else f"torch._scaled_mm is off by {error:.2g} of its range"


@final
class Fp8Linear(nn.Module):
    """A bias-free linear layer stored as e4m3 values and a scale a row.

    Args:
        weight: the ``[N, K]`` weight to quantize (its device is kept; the caller drops it).
    """

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        values, scale = quantize_rows(weight.detach())
        self.weight: torch.Tensor
        self.scale: torch.Tensor
        self.register_buffer("weight", values)
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.weight, self.scale)

    def rows(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """The product with rows ``start:stop`` only (one step of stacked weights)."""
        return fp8_linear(x, self.weight[start:stop], self.scale[start:stop])

    def quantized(
        self, x8: torch.Tensor, x_scale: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """The product with ``[M, K]`` activations a kernel already quantized (the values
        `fp8_linear` would make of them), ``[M, N]`` in ``dtype``."""
        return quantized_product(x8, x_scale, self.weight, self.scale, dtype)
