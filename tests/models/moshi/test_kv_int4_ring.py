"""A Moshi KV ring stored in 4 bits: writes quantize, reads agree with the dequantized rows,
inactive rows keep their bytes, a cleared slot reads as zeros, and the LM steps on it."""

from __future__ import annotations

import torch

from duplex.kernels.kv_int4 import dequantize_int4, quantize_int4
from duplex.models.moshi import INT4, KVRing

SHAPE = {"num_layers": 2, "max_slots": 3, "num_heads": 2, "context": 8, "head_dim": 64}


def test_writes_quantize_and_reads_see_the_dequantized_rows() -> None:
    ring = KVRing(**SHAPE, dtype=INT4)
    assert ring.keys.dtype == torch.uint8 and ring.keys.shape[-1] == 32
    generator = torch.Generator().manual_seed(5)
    slots, frames = torch.tensor([0, 2]), torch.tensor([0, 9])  # frame 9: row 1
    k = torch.randn(2, 2, 64, generator=generator)
    v = torch.randn(2, 2, 64, generator=generator)
    ring.write(1, slots, frames, k, v)
    want_k = dequantize_int4(*quantize_int4(k))
    assert ring.key_scales is not None
    got_k = dequantize_int4(ring.keys[1, [0, 2], :, [0, 1]], ring.key_scales[1, [0, 2], :, [0, 1]])
    torch.testing.assert_close(got_k, want_k)
    q = torch.randn(2, 2, 64, generator=generator)
    lengths = torch.tensor([1, 2])
    out = ring.attend(1, q, slots, lengths, max_len=2)
    prefix = ring.attend_prefix(1, torch.cat([q[:1], q[:1], q[1:]]), torch.tensor([1, 1, 2]))
    torch.testing.assert_close(out[0], prefix[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1], prefix[2], atol=1e-5, rtol=1e-5)


def test_inactive_rows_keep_their_bytes_and_a_cleared_slot_reads_zero() -> None:
    ring = KVRing(**SHAPE, dtype=INT4)
    generator = torch.Generator().manual_seed(6)
    slots, frames = torch.tensor([0, 1]), torch.tensor([3, 3])
    first = torch.randn(2, 2, 64, generator=generator)
    ring.write(0, slots, frames, first, first)
    before = ring.keys[0, 1, :, 3].clone()
    second = torch.randn(2, 2, 64, generator=generator)
    ring.write(0, slots, frames, second, second, active=torch.tensor([True, False]))
    assert torch.equal(ring.keys[0, 1, :, 3], before)
    assert not torch.equal(ring.keys[0, 0, :, 3], before)
    ring.clear(0)
    assert ring.key_scales is not None
    zeros = dequantize_int4(ring.keys[:, 0], ring.key_scales[:, 0])
    assert bool((zeros == 0).all())
