"""duplex.models.moshi: our implementation of the Moshi / PersonaPlex speech LM and Mimi codec.

`MoshiConfig` and its presets (``moshi-7b``, ``personaplex-7b``, ``tiny``,
``tiny-personaplex``) describe the architecture; `MoshiLM` is the math
(temporal transformer, text head, depth transformer) under the official
checkpoint tensor names; `load_lm` / `save_random_lm` read and write those
names; `MoshiRunner` owns per-slot state (KV rings, delayed token ring,
sampling seeds) and steps any subset of slots at any frame, with one static-shape
step over the slot prefix (`duplex.kernels.sample` on counter-based noise,
`prefix_attention` over the rings in place) that `CudaGraphStep` replays as a
CUDA graph per prefix bucket on the GPU.

The Mimi codec: `MimiConfig` and its presets (``mimi``, ``tiny``), `MimiModel`
(SEANet, transformers, split RVQ) under the official tokenizer tensor names,
`load_mimi` / `save_random_mimi`, and `MimiStreams`, which holds per-slot
streaming state and encodes/decodes one 80 ms frame for any subset of slots.

Behind the engine: `MoshiEngineRunner` is the `ModelRunner` (PCM in, Mimi
encode, one LM step, Mimi decode, text pieces out). Checkpoint folders in the
official layout are found with `find_checkpoint` (Hugging Face cache, a path),
checked with `check_checkpoint` and loaded with `load_checkpoint`;
`build_tiny_checkpoint` / `tiny_checkpoint` write the seeded ``tiny`` one;
`resolve_moshi` turns a ``--model`` value into a registry entry.
"""

from ._checkpoint import (
    CHECKPOINT_FILES,
    HF_REPOS,
    LM_FILE,
    MIMI_FILE,
    TOKENIZER_FILE,
    LoadedMoshi,
    MoshiCheckpoint,
    build_tiny_checkpoint,
    check_checkpoint,
    find_checkpoint,
    hf_hub_cache,
    load_checkpoint,
    tiny_checkpoint,
)
from ._config import MOSHI_PRESETS, MoshiConfig, moshi_preset
from ._cuda_graph import CudaGraphStep
from ._engine_runner import MoshiEngineRunner, stream_seed
from ._kv import INT4, KVDtype, KVRing, prefix_attention
from ._lm import MoshiLM, TokenChooser
from ._mimi import MimiModel
from ._mimi_config import MIMI_PRESETS, MimiConfig, mimi_preset
from ._mimi_streams import MimiStreams
from ._mimi_weights import (
    cast_mimi,
    expected_mimi_tensors,
    load_mimi,
    random_mimi,
    save_random_mimi,
)
from ._models import MOSHI_MODEL_NAMES, moshi_spec, resolve_moshi
from ._runner import GREEDY, MoshiRunner, SlotSampling, StepTokens
from ._sampling import SamplingParams
from ._text import text_pieces, write_tiny_tokenizer
from ._weights import expected_tensors, load_lm, random_lm, save_random_lm

__all__ = [
    "CHECKPOINT_FILES",
    "GREEDY",
    "HF_REPOS",
    "INT4",
    "LM_FILE",
    "MIMI_FILE",
    "MIMI_PRESETS",
    "MOSHI_MODEL_NAMES",
    "MOSHI_PRESETS",
    "TOKENIZER_FILE",
    "CudaGraphStep",
    "KVDtype",
    "KVRing",
    "LoadedMoshi",
    "MimiConfig",
    "MimiModel",
    "MimiStreams",
    "MoshiCheckpoint",
    "MoshiConfig",
    "MoshiEngineRunner",
    "MoshiLM",
    "MoshiRunner",
    "SamplingParams",
    "SlotSampling",
    "StepTokens",
    "TokenChooser",
    "build_tiny_checkpoint",
    "cast_mimi",
    "check_checkpoint",
    "expected_mimi_tensors",
    "expected_tensors",
    "find_checkpoint",
    "hf_hub_cache",
    "load_checkpoint",
    "load_lm",
    "load_mimi",
    "mimi_preset",
    "moshi_preset",
    "moshi_spec",
    "prefix_attention",
    "random_lm",
    "random_mimi",
    "resolve_moshi",
    "save_random_lm",
    "save_random_mimi",
    "stream_seed",
    "text_pieces",
    "tiny_checkpoint",
    "write_tiny_tokenizer",
]
