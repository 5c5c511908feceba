"""How our Moshi and Mimi configs map onto Kyutai's reference (``moshi==0.2.13``) arguments.

One place for the correspondence, used by the parity tools (`moshi_parity.py`,
`mimi_parity.py`) and the GPU benchmark (``bench/duplex_engine.py``). Pure
functions of our configs: importing this module neither imports ``moshi`` nor
sets its environment switches (``NO_CUDA_GRAPH`` would slow the benchmark's
reference loop). Scripts import it as ``reference_configs`` with ``tools/`` on
``sys.path`` (a script's own folder is).
"""

from __future__ import annotations

from typing import Any

from duplex.models.moshi._config import MoshiConfig
from duplex.models.moshi._mimi_config import MimiConfig

__all__ = ["UnsupportedByReference", "reference_kwargs", "reference_mimi_config"]


class UnsupportedByReference(Exception):
    """The config has no equivalent in the reference ``LMModel`` / ``LMGen``."""


def _reference_feedforward(dim: int, hidden: int) -> int:
    """A ``dim_feedforward`` whose reference SiLU gating width is ``hidden``."""
    for feedforward in (int(4.125 * dim), (3 * hidden + 1) // 2, 3 * hidden // 2 + 1):
        width = (21 * dim) // 8 if feedforward == 4 * dim else (2 * feedforward) // 3
        if width == hidden:
            return feedforward
    raise UnsupportedByReference(f"no dim_feedforward gives gated hidden {hidden} at dim {dim}")


def reference_kwargs(config: MoshiConfig) -> dict[str, Any]:
    """``LMModel`` keyword arguments equal to ``config`` (every field accounted for).

    Raises:
        UnsupportedByReference: the reference loop cannot run this config.
    """
    if config.user_lag != 0:
        raise UnsupportedByReference(
            "user_lag=1 is PersonaPlex's forked LMGen (it reads column offset - 1 and keeps a "
            "max_delay + 3 cache); moshi 0.2.13's LMGen feeds user codes at offset + delay"
        )
    if config.agent_q != config.dep_q or config.n_q - config.dep_q != config.user_q:
        raise UnsupportedByReference(
            f"moshi 0.2.13's LMGen samples all dep_q={config.dep_q} depth steps and takes "
            f"n_q - dep_q = {config.n_q - config.dep_q} user codebooks; agent_q={config.agent_q} "
            "(PersonaPlex: 16 depth weight sets, 8 sampled) is not modelled"
        )
    if config.norm_eps != 1e-8:
        raise UnsupportedByReference("only rms_norm_f32 (eps 1e-8) is mapped")
    return {
        # name: labels only.
        "dim": config.dim,
        "num_layers": config.num_layers,
        "num_heads": config.num_heads,
        "hidden_scale": _reference_feedforward(config.dim, config.ffn_hidden) / config.dim,
        "context": config.context,
        "card": config.card,
        "text_card": config.text_card,
        "n_q": config.n_q,
        "dep_q": config.dep_q,  # == agent_q, checked above
        "delays": list(config.delays),
        "depformer_dim": config.depformer_dim,
        "depformer_num_layers": config.depformer_num_layers,
        "depformer_num_heads": config.depformer_num_heads,
        "depformer_dim_feedforward": _reference_feedforward(
            config.depformer_dim, config.depformer_ffn_hidden
        ),
        "max_period": config.max_period,
        "norm": "rms_norm_f32",  # norm_eps 1e-8, float32
        # user_lag 0: LMGen's own layout, checked above.
        "existing_text_padding_id": config.text_padding_id,
        # Fixed by the moshi_7b_202409 architecture our MoshiLM implements:
        "causal": True,
        "layer_scale": None,
        "gating": "silu",
        "positional_embedding": "rope",
        "depformer_multi_linear": True,
        "depformer_weights_per_step": True,
        "depformer_pos_emb": "none",
        "depformer_gating": "silu",
        "depformer_layer_scale": None,
        "depformer_max_period": config.max_period,
        "depformer_context": config.dep_q,  # overridden to None by LMModel; kept like the 7B
    }


def reference_mimi_config(config: MimiConfig) -> dict[str, Any]:
    """The ``get_mimi`` config dict of the reference for our ``config``."""
    seanet = {
        "channels": 1,
        "dimension": config.dimension,
        "causal": True,
        "n_filters": config.n_filters,
        "n_residual_layers": config.n_residual_layers,
        "activation": "ELU",
        "compress": config.compress,
        "dilation_base": config.dilation_base,
        "disable_norm_outer_blocks": 0,
        "kernel_size": config.kernel_size,
        "residual_kernel_size": config.residual_kernel_size,
        "last_kernel_size": config.last_kernel_size,
        "norm": "none",
        "pad_mode": "constant",
        "ratios": list(config.ratios),
        "true_skip": True,
    }
    quantizer = {
        "dimension": config.codebook_dim,
        "n_q": config.n_q,
        "bins": config.bins,
        "input_dimension": config.dimension,
        "output_dimension": config.dimension,
    }
    transformer = {
        "d_model": config.dimension,
        "num_heads": config.transformer_heads,
        "num_layers": config.transformer_layers,
        "causal": True,
        "layer_scale": 0.01,
        "context": config.context,
        "conv_layout": True,
        "max_period": config.max_period,
        "gating": "none",
        "norm": "layer_norm",
        "positional_embedding": "rope",
        "dim_feedforward": config.transformer_ffn,
        "input_dimension": config.dimension,
        "output_dimensions": [config.dimension],
    }
    return {
        "sample_rate": config.sample_rate,
        "channels": 1,
        "frame_rate": config.frame_rate,
        "seanet": seanet,
        "quantizer": quantizer,
        "transformer": transformer,
    }
