"""The RoPE kernel against its torch reference, and the model's dispatch to it.

On a host without a GPU the kernel runs in Triton's interpreter (tests/conftest.py
sets ``TRITON_INTERPRET``); on CUDA the same tests run compiled, plus the 7B's
shape inside a CUDA graph.

Tolerances: on CUDA the kernel's ``exp``/``sin``/``cos`` are libdevice's, the
functions torch's CUDA kernels call, so float32 results agree to rounding at
any position. The interpreter uses numpy's float32 ``exp``, one ulp away from
torch's CPU ``exp`` on some frequencies; the angle error that makes grows with
the position (``position * freq * 2^-24``), so host runs compare small positions
tightly and large ones loosely (a wrong position or pair is off by O(1)).
"""

from __future__ import annotations

import pytest
import torch

from duplex.kernels import rope, rope_reference, triton_available
from duplex.kernels.rope import rope_supports
from duplex.models.moshi import _layers
from duplex.models.moshi._layers import apply_rope

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed")

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
MAX_PERIOD = 10_000.0


def _tolerance(dtype: torch.dtype, max_position: int) -> float:
    if dtype == torch.bfloat16:
        return 1e-2  # one rounding flip of the cast back (1 ulp = 2^-7 relative)
    return 1e-5 if CUDA else 1e-5 + 1e-7 * max_position


def _qkv(
    generator: torch.Generator, leading: tuple[int, ...], heads: int, dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    """q, k, v as `Attention.qkv` makes them: strided views unbound from one projection."""
    projected = torch.randn((*leading, 3 * heads * dim), generator=generator)
    projected = projected.to(dtype).to(DEVICE).unflatten(-1, (3, heads, dim))
    return projected.unbind(-3)


def _check(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> None:
    got_q, got_k = rope(q, k, positions, MAX_PERIOD)
    want_q, want_k = rope_reference(q, k, positions, MAX_PERIOD)
    tolerance = _tolerance(q.dtype, int(positions.max()))
    for got, want in ((got_q, want_q), (got_k, want_k)):
        assert got.dtype == want.dtype and got.shape == want.shape and got.is_contiguous()
        torch.testing.assert_close(got.float(), want.float(), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("batch", "heads", "dim"), [(1, 4, 16), (3, 5, 8), (2, 2, 12)])
def test_per_frame_kernel_equals_reference_on_strided_views(
    dtype: torch.dtype, batch: int, heads: int, dim: int
) -> None:
    """``[B, H, D]`` views with positions ``[B]``: B = 1, a partial head block, D/2 = 6."""
    generator = torch.Generator().manual_seed(batch * 100 + heads * 10 + dim)
    q, k, _ = _qkv(generator, (batch,), heads, dim, dtype)
    assert q.stride(0) == 3 * heads * dim  # a view into the projection (B = 1 looks contiguous)
    positions = torch.randint(0, 50, (batch,), generator=generator).to(DEVICE)
    positions[0] = 0  # the identity rotation
    _check(q, k, positions)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sequence_kernel_equals_reference_for_each_positions_layout(dtype: torch.dtype) -> None:
    """``[B, T, H, D]`` with positions ``[T]`` (forward_sequence), ``[1, T]`` and ``[B, T]``."""
    generator = torch.Generator().manual_seed(11)
    q, k, _ = _qkv(generator, (2, 6), 3, 16, dtype)
    steps = torch.arange(6, device=DEVICE)
    _check(q, k, steps)
    _check(q, k, steps[None] + 7)
    _check(q, k, torch.stack((steps, steps + 20)))


def test_large_positions_read_the_right_angle() -> None:
    """Positions of a long session (the ring wraps, the absolute frame keeps growing)."""
    generator = torch.Generator().manual_seed(12)
    q, k, _ = _qkv(generator, (4,), 2, 32, torch.float32)
    _check(q, k, torch.tensor([1, 2_999, 3_000, 40_000], device=DEVICE))


def test_q_and_k_may_have_different_strides() -> None:
    generator = torch.Generator().manual_seed(13)
    q, _, _ = _qkv(generator, (2,), 4, 16, torch.float32)
    k = torch.randn(2, 4, 16, generator=generator).to(DEVICE)  # contiguous
    _check(q, k, torch.tensor([3, 9], device=DEVICE))


def test_shapes_the_kernel_leaves_to_torch() -> None:
    q = torch.zeros(2, 4, 8)
    assert rope_supports(q, q, torch.zeros(2))
    assert rope_supports(q, q, torch.zeros(1))  # broadcast over rows
    assert not rope_supports(q, torch.zeros(2, 4, 6), torch.zeros(2))  # q, k unlike
    assert not rope_supports(torch.zeros(2, 4, 7), torch.zeros(2, 4, 7), torch.zeros(2))  # odd D
    assert not rope_supports(q, q, torch.zeros(3))  # does not broadcast
    assert not rope_supports(q[:1], q[:1], torch.zeros(2))  # would enlarge the output
    assert not rope_supports(q[0], q[0], torch.zeros(()))  # [H, D]: no leading axis
    assert not rope_supports(q, q, torch.zeros(2, device="meta"))  # positions elsewhere
    with pytest.raises(ValueError, match="even D"):
        rope(q, q, torch.zeros(3), MAX_PERIOD)


def test_apply_rope_keeps_the_torch_path_on_cpu() -> None:
    """On host tensors the model's function is the reference, bit for bit."""
    generator = torch.Generator().manual_seed(14)
    q = torch.randn(2, 4, 16, generator=generator)
    k = torch.randn(2, 4, 16, generator=generator)
    positions = torch.tensor([5, 17])
    for got, want in zip(
        apply_rope(q, k, positions, MAX_PERIOD),
        rope_reference(q, k, positions, MAX_PERIOD),
        strict=True,
    ):
        assert torch.equal(got, want)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_apply_rope_uses_the_kernel_at_the_7b_shape_inside_a_cuda_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bf16 q/k views of 32 heads of 128 at B = 16, captured, replayed with new positions."""
    calls: list[tuple[int, ...]] = []

    def counted(
        q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, max_period: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(tuple(q.shape))
        return rope(q, k, positions, max_period)

    monkeypatch.setattr(_layers, "rope", counted)
    generator = torch.Generator().manual_seed(15)
    q, k, _ = _qkv(generator, (16,), 32, 128, torch.bfloat16)
    frames = torch.arange(16, device="cuda") * 2_500
    with torch.no_grad():
        apply_rope(q, k, frames, MAX_PERIOD)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got_q, got_k = apply_rope(q, k, frames, MAX_PERIOD)
    assert calls == [(16, 32, 128)] * 2
    for step in (1, 2):  # replays read the positions' memory: new frames give new angles
        frames.add_(step)
        graph.replay()
        torch.cuda.synchronize()
        want_q, want_k = rope_reference(q, k, frames, MAX_PERIOD)
        torch.testing.assert_close(got_q.float(), want_q.float(), atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(got_k.float(), want_k.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_float32_angles_match_torch_on_cuda_at_long_session_positions() -> None:
    """libdevice exp/sin/cos: the compiled kernel agrees with torch's CUDA ops to rounding."""
    generator = torch.Generator().manual_seed(16)
    q, k, _ = _qkv(generator, (8,), 32, 128, torch.float32)
    positions = torch.tensor([0, 1, 100, 2_999, 10_000, 40_000, 123_456, 1_000_000])
    _check(q, k, positions.to("cuda"))
