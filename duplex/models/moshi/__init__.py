"""duplex.models.moshi: our implementation of the Moshi / PersonaPlex speech LM and Mimi codec.

`MoshiConfig` and its presets (``moshi-7b``, ``personaplex-7b``, ``tiny``,
``tiny-personaplex``) describe the architecture; `MoshiLM` is the math
(temporal transformer, text head, depth transformer) under the official
checkpoint tensor names; `load_lm` / `save_random_lm` read and write those
names; `MoshiRunner` owns per-slot state (KV rings, delayed token ring,
sampling generators) and steps any subset of slots at any frame.

The Mimi codec: `MimiConfig` and its presets (``mimi``, ``tiny``), `MimiModel`
(SEANet, transformers, split RVQ) under the official tokenizer tensor names,
`load_mimi` / `save_random_mimi`, and `MimiStreams`, which holds per-slot
streaming state and encodes/decodes one 80 ms frame for any subset of slots.
The runner still speaks codes; its module docstring lists what
``ModelRunner.execute`` needs to join the two.
"""

from ._config import MOSHI_PRESETS, MoshiConfig, moshi_preset
from ._kv import KVRing, ring_attention
from ._lm import MoshiLM, TokenChooser
from ._mimi import MimiModel
from ._mimi_config import MIMI_PRESETS, MimiConfig, mimi_preset
from ._mimi_streams import MimiStreams
from ._mimi_weights import expected_mimi_tensors, load_mimi, random_mimi, save_random_mimi
from ._runner import GREEDY, MoshiRunner, SlotSampling, StepTokens
from ._sampling import SamplingParams, sample_rows
from ._weights import expected_tensors, load_lm, random_lm, save_random_lm

__all__ = [
    "GREEDY",
    "MIMI_PRESETS",
    "MOSHI_PRESETS",
    "KVRing",
    "MimiConfig",
    "MimiModel",
    "MimiStreams",
    "MoshiConfig",
    "MoshiLM",
    "MoshiRunner",
    "SamplingParams",
    "SlotSampling",
    "StepTokens",
    "TokenChooser",
    "expected_mimi_tensors",
    "expected_tensors",
    "load_lm",
    "load_mimi",
    "mimi_preset",
    "moshi_preset",
    "random_lm",
    "random_mimi",
    "ring_attention",
    "sample_rows",
    "save_random_lm",
    "save_random_mimi",
]
