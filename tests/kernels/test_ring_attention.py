"""The ring decode attention kernel against its torch reference.

On a host without a GPU the kernel runs in Triton's interpreter (tests/conftest.py
sets ``TRITON_INTERPRET``), so CI checks the kernel's own code; on CUDA the same
tests run compiled, plus one at the 7B's shape.
"""

from __future__ import annotations

import pytest
import torch

from duplex.kernels import ring_attention, ring_attention_reference, triton_available
from duplex.kernels.ring_attention import SPLIT_ROWS, _value_words_fit

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def _rings(
    generator: torch.Generator, layers: int, slots: int, heads: int, context: int, dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (layers, slots, heads, context, dim)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


@pytest.mark.parametrize("ring_dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
def test_kernel_equals_reference_on_filled_rows_of_a_strided_pool(
    ring_dtype: torch.dtype, q_dtype: torch.dtype
) -> None:
    """Lengths on and around split edges, one layer of a pool, garbage (NaN) past each fill."""
    generator = torch.Generator().manual_seed(7)
    context = SPLIT_ROWS + 44  # two splits, the second one partial
    keys, values = _rings(generator, 2, 6, 2, context, 16)
    lengths = torch.tensor([1, SPLIT_ROWS - 1, SPLIT_ROWS, SPLIT_ROWS + 1, context, 65])
    for slot, length in enumerate(lengths.tolist()):
        keys[:, slot, :, length:] = float("nan")  # never loaded by the kernel
        values[:, slot, :, length:] = float("inf")
    keys, values = keys.to(ring_dtype).to(DEVICE), values.to(ring_dtype).to(DEVICE)
    lengths = lengths.to(DEVICE)
    q = torch.randn(6, 2, 16, generator=generator).to(q_dtype).to(DEVICE)
    layer_keys, layer_values = keys[1], values[1]  # strided views, as the engine passes them
    got = ring_attention(q, layer_keys, layer_values, lengths)
    want = ring_attention_reference(q.float(), layer_keys, layer_values, lengths)
    assert got.dtype == q_dtype and got.shape == q.shape
    assert bool(torch.isfinite(got).all())
    # on CUDA, tensor cores take the query in the ring's 16-bit operand type
    rounded = DEVICE.type == "cuda" and ring_dtype != torch.float32
    tolerance = TOLERANCE[torch.bfloat16 if rounded else q_dtype]
    torch.testing.assert_close(got.float(), want, atol=tolerance, rtol=tolerance)


def test_kernel_reads_the_slot_each_row_names() -> None:
    """Rows map to any slots (slot-indexed), in any order, and rows never mix."""
    generator = torch.Generator().manual_seed(8)
    keys, values = _rings(generator, 1, 5, 2, 96, 8)
    keys, values = keys[0].to(DEVICE), values[0].to(DEVICE)
    fills = torch.tensor([4, 96, 30, 1, 50], device=DEVICE)
    slots = torch.tensor([4, 0, 2], device=DEVICE)
    q = torch.randn(3, 2, 8, generator=generator).to(DEVICE)
    got = ring_attention(q, keys, values, fills[slots], slots)
    want = ring_attention_reference(q, keys, values, fills[slots], slots)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    # row 1 alone (slot 0) gives the same answer as inside the batch
    alone = ring_attention(q[1:2], keys, values, fills[0:1], slots[1:2])
    torch.testing.assert_close(alone, got[1:2], atol=1e-6, rtol=1e-6)


def test_kernel_reads_queries_in_place_from_a_projection() -> None:
    """q as the engine has it (one third of a ``[B, 3, H, D]`` projection, rows strided) reads
    the same as a contiguous copy: no copy is made for it."""
    generator = torch.Generator().manual_seed(9)
    keys, values = _rings(generator, 1, 3, 2, 40, 16)
    keys, values = keys[0].to(DEVICE), values[0].to(DEVICE)
    projected = torch.randn(3, 3, 2, 16, generator=generator).to(DEVICE)
    q = projected.unbind(1)[0]
    assert not q.is_contiguous()
    lengths = torch.tensor([40, 7, 21], device=DEVICE)
    got = ring_attention(q, keys, values, lengths)
    assert got.is_contiguous() and got.shape == q.shape
    assert torch.equal(got, ring_attention(q.contiguous(), keys, values, lengths))
    want = ring_attention_reference(q, keys, values, lengths)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_kernel_rejects_layouts_it_cannot_read() -> None:
    keys = torch.zeros(2, 1, 8, 6)  # head_dim 6: not a power of two
    with pytest.raises(ValueError, match="power-of-two"):
        ring_attention(torch.zeros(2, 1, 6), keys, keys, torch.ones(2, dtype=torch.long))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("ring_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_kernel_at_the_7b_shape_on_cuda(ring_dtype: torch.dtype) -> None:
    """32 heads of 128, a 3000-row ring, fills spread over the ring, inside a CUDA graph."""
    generator = torch.Generator(device="cuda").manual_seed(9)
    shape = (16, 32, 3000, 128)
    keys = torch.randn(shape, generator=generator, device="cuda").to(ring_dtype)
    values = torch.randn(shape, generator=generator, device="cuda").to(ring_dtype)
    lengths = torch.linspace(1, 3000, 16, device="cuda").long()
    q = torch.randn(16, 32, 128, generator=generator, device="cuda").to(torch.bfloat16)
    want = ring_attention_reference(q, keys, values, lengths)
    ring_attention(q, keys, values, lengths)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = ring_attention(q, keys, values, lengths)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_tensor_core_form_equals_reference() -> None:
    """The ``tl.dot`` form (CUDA's default) on a float32 ring, which the interpreter runs."""
    generator = torch.Generator().manual_seed(10)
    keys, values = _rings(generator, 1, 3, 2, 100, 16)
    keys, values = keys[0].to(DEVICE), values[0].to(DEVICE)
    lengths = torch.tensor([1, 33, 100], device=DEVICE)
    q = torch.randn(3, 2, 16, generator=generator).to(DEVICE)
    got = ring_attention(q, keys, values, lengths, dot=True)
    want = ring_attention_reference(q, keys, values, lengths)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("odd_rows", [False, True], ids=["value-words", "value-bytes"])
def test_tensor_core_form_on_an_fp8_ring(odd_rows: bool) -> None:
    """The fp8 ring's values read as 16-bit words of two (each word's bytes their own
    product), or a byte at a time where its rows start on odd bytes: the same sums, in
    float32 on the host, float16 on CUDA."""
    generator = torch.Generator().manual_seed(11)
    keys, values = _rings(generator, 2, 4, 2, 150, 32)
    keys, values = keys.to(torch.float8_e4m3fn), values.to(torch.float8_e4m3fn)
    keys, values = keys[1].to(DEVICE), values[1].to(DEVICE)  # strided views of one layer
    if odd_rows:  # rows 33 bytes apart
        padded = torch.empty(*values.shape[:-1], 33, dtype=values.dtype, device=DEVICE)
        padded[..., :32].copy_(values)
        values = padded[..., :32]
    assert _value_words_fit(values) != odd_rows
    lengths = torch.tensor([150, 1, 77, 64], device=DEVICE)
    q = torch.randn(4, 2, 32, generator=generator).to(DEVICE)
    got = ring_attention(q, keys, values, lengths, dot=True)
    want = ring_attention_reference(q, keys, values, lengths)
    tolerance = TOLERANCE[torch.bfloat16 if DEVICE.type == "cuda" else torch.float32]
    torch.testing.assert_close(got.float(), want, atol=tolerance, rtol=tolerance)


def test_values_read_as_words_only_from_fp8_rows_on_even_bytes() -> None:
    pool = torch.zeros(2, 3, 4, 10, 32).to(torch.float8_e4m3fn)
    assert _value_words_fit(pool[1])
    assert not _value_words_fit(pool[1].to(torch.bfloat16))  # 16-bit rows need no words
    assert not _value_words_fit(pool[1, ..., :16])  # 8 words: under a product's 16 columns
    odd = torch.zeros(3, 4, 10, 33).to(torch.float8_e4m3fn)[..., :32]
    assert not _value_words_fit(odd)  # rows 33 bytes apart


def test_a_skipped_row_is_left_out_of_its_query_only() -> None:
    """``skip`` leaves one row out of one query (as if past its length), none out of a -1."""
    generator = torch.Generator().manual_seed(12)
    keys, values = _rings(generator, 1, 3, 2, 40, 16)
    keys, values = keys[0].to(DEVICE), values[0].to(DEVICE)
    keys[1, :, 7] = float("nan")  # the skipped row is never read
    values[1, :, 7] = float("inf")
    q = torch.randn(3, 2, 16, generator=generator).to(DEVICE)
    lengths = torch.tensor([40, 40, 25], device=DEVICE)
    skip = torch.tensor([-1, 7, 24], device=DEVICE)
    got = ring_attention(q, keys, values, lengths, skip=skip)
    clean = keys.clone(), values.clone()
    clean[0][1, :, 7] = 0.0
    clean[1][1, :, 7] = 0.0
    want = ring_attention_reference(q, *clean, torch.tensor([40, 40, 24], device=DEVICE))
    kept = [r for r in range(40) if r != 7]  # row 1 without its row 7
    want[1] = ring_attention_reference(
        q[1:2], clean[0][1:2, :, kept], clean[1][1:2, :, kept], torch.tensor([39], device=DEVICE)
    )[0]
    assert bool(torch.isfinite(got).all())
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
