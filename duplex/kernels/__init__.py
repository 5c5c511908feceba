"""Triton kernels with their torch references (the CPU path and the test oracle).

`ring_attention`: one-query decode attention over per-slot KV rings that
loads only each slot's filled rows, in the ring's stored dtype.

`rms_norm`: RMSNorm over the last axis in one kernel (float32 math); `rms_norm.add_rms_norm`
the residual add before it in the same launch.

`silu_gate`: a gated FFN's ``silu(gate) * value`` in one launch, or quantized to e4m3 in it.

`fp8_rows.quantize_rows_e4m3`: rows to float8 e4m3 with a float32 scale a row (an fp8
projection's activations), in one kernel.

`kv_int4`: KV rows in 4 bits, the ring attention that reads them in place, and the kernel that
quantizes and stores a frame's rows.

`rope`: interleaved rotary embedding of q and k in one launch (float32 math).

`sample`: a stream's whole per-row sampling (counter-based noise, temperature,
top-k, the race, greedy rows) in one launch; `sample_reference` is the same in
torch, composed of `counter_uniform` and `sample_tokens`.
"""

from ._triton import available as triton_available
from .ring_attention import ring_attention, ring_attention_reference
from .rms_norm import rms_norm, rms_norm_reference
from .rope import rope, rope_reference
from .sampling import counter_uniform, sample, sample_reference, sample_tokens

__all__ = [
    "counter_uniform",
    "ring_attention",
    "ring_attention_reference",
    "rms_norm",
    "rms_norm_reference",
    "rope",
    "rope_reference",
    "sample",
    "sample_reference",
    "sample_tokens",
    "triton_available",
]
