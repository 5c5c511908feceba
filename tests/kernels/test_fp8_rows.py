"""Rows to e4m3 with a scale a row: the kernel against its torch form, bit for bit
(Triton's interpreter on a host without a GPU)."""

from __future__ import annotations

import pytest
import torch

from duplex.kernels import triton_available
from duplex.kernels.fp8_rows import MAX_DIM, quantize_rows_e4m3, quantize_rows_e4m3_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dim", [4096, 11264, 96])
def test_the_kernel_gives_the_torch_values_and_scales(dtype: torch.dtype, dim: int) -> None:
    """Widths of the 7B's projections (11264 is no power of two: a masked tail) and a small
    one; a row of zeros (its scale the floor, its values 0), a row of one huge value, a row
    with values on e4m3 rounding ties."""
    generator = torch.Generator().manual_seed(18)
    x = torch.randn(6, dim, generator=generator) * 4
    x[1] = 0.0
    x[2] = 0.0
    x[2, 7] = -3.0e4
    x[3, :3] = torch.tensor([448.0, 17.0, 19.0])  # scale 1: 17 and 19 tie between e4m3 levels
    x = x.to(dtype)
    want_values, want_scale = quantize_rows_e4m3_reference(x, 1e-12)
    got_values, got_scale = quantize_rows_e4m3(x.to(DEVICE), 1e-12)
    assert torch.equal(got_scale.cpu(), want_scale)
    assert torch.equal(got_values.cpu().view(torch.uint8), want_values.view(torch.uint8))
    assert float(want_scale[1]) == pytest.approx(1e-12 / 448)
    assert float(want_values[3, 1].float()) == 16.0 and float(want_values[3, 2].float()) == 20.0


def test_a_row_wider_than_a_program_holds_is_refused() -> None:
    with pytest.raises(ValueError, match="registers"):
        quantize_rows_e4m3(torch.zeros(1, MAX_DIM + 1, device=DEVICE), 1e-12)


def test_every_value_rounds_to_the_e4m3_level_torch_gives() -> None:
    """Rows of scale 1 (448 first) through the whole range: the normal levels, the carries
    into the next binade (-124.4 to -128), the subnormals below 2**-6 and -0.0."""
    generator = torch.Generator().manual_seed(19)
    normal = torch.linspace(-448.0, 448.0, 64 * 1023)
    small = (torch.rand(64 * 1023, generator=generator) - 0.5) * 0.04
    x = torch.cat([normal, small]).reshape(128, 1023)
    x = torch.cat([torch.full((128, 1), 448.0), x], dim=1)
    want_values, want_scale = quantize_rows_e4m3_reference(x, 1e-12)
    assert bool((want_scale == 1.0).all())
    got_values, _ = quantize_rows_e4m3(x.to(DEVICE), 1e-12)
    assert torch.equal(got_values.cpu().view(torch.uint8), want_values.view(torch.uint8))
