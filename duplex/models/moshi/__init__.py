"""duplex.models.moshi: our implementation of the Moshi / PersonaPlex speech LM.

`MoshiConfig` and its presets (``moshi-7b``, ``personaplex-7b``, ``tiny``,
``tiny-personaplex``) describe the architecture; `MoshiLM` is the math
(temporal transformer, text head, depth transformer) under the official
checkpoint tensor names; `load_lm` / `save_random_lm` read and write those
names; `MoshiRunner` owns per-slot state (KV rings, delayed token ring,
sampling generators) and steps any subset of slots at any frame.

The Mimi codec is not here yet, so the runner speaks codes, not PCM; its
module docstring lists what ``ModelRunner.execute`` still needs.
"""

from ._config import MOSHI_PRESETS, MoshiConfig, moshi_preset
from ._kv import KVRing, ring_attention
from ._lm import MoshiLM, TokenChooser
from ._runner import GREEDY, MoshiRunner, SlotSampling, StepTokens
from ._sampling import SamplingParams, sample_rows
from ._weights import expected_tensors, load_lm, random_lm, save_random_lm

__all__ = [
    "GREEDY",
    "MOSHI_PRESETS",
    "KVRing",
    "MoshiConfig",
    "MoshiLM",
    "MoshiRunner",
    "SamplingParams",
    "SlotSampling",
    "StepTokens",
    "TokenChooser",
    "expected_tensors",
    "load_lm",
    "moshi_preset",
    "random_lm",
    "ring_attention",
    "sample_rows",
    "save_random_lm",
]
