"""The engine bench's bytes floor: what one LM step must read, counted from the model."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pytest

from duplex.models.moshi._config import moshi_preset
from duplex.models.moshi._lm import MoshiLM
from duplex.models.moshi._models import expected_tensors

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def engine_bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # as when run: its siblings import
    spec = importlib.util.spec_from_file_location(
        "engine_bench", ROOT / "bench" / "duplex_engine.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_step_reads_every_weight_but_the_embedding_tables_and_each_rows_filled_kv(
    engine_bench: ModuleType,
) -> None:
    config = moshi_preset("tiny")
    lm = MoshiLM(config)  # float32: 4 bytes a value
    tensors = expected_tensors(config)
    tables = [n for n in tensors if engine_bench.EMBEDDING_TABLE.search(n)]
    assert "text_emb.weight" in tables and "emb.0.weight" in tables
    assert "depformer_text_emb.weight" in tables and "depformer_emb.0.weight" in tables
    assert not any("linear" in n or "layers" in n for n in tables)
    weights = 4 * sum(math.prod(s) for n, s in tensors.items() if n not in tables)
    assert engine_bench.lm_step_bytes(lm, [], 2) == weights
    per_row = 2 * config.num_layers * config.dim * 2  # keys and values, bf16
    assert engine_bench.lm_step_bytes(lm, [10, 30], 2) == weights + 40 * per_row
    # fp8 weights: the temporal linears at a byte and a float32 scale a row
    lm.temporal_to_fp8()
    fp8 = engine_bench.lm_step_bytes(lm, [], 2)
    linears = [n for n in tensors if n.startswith("transformer.") and n.endswith("weight")]
    linears = [n for n in linears if len(tensors[n]) == 2]
    saved = sum(3 * math.prod(tensors[n]) - 4 * tensors[n][0] for n in linears)
    assert fp8 == weights - saved


def test_the_floor_is_the_bytes_at_the_measured_read_bandwidth(engine_bench: ModuleType) -> None:
    lm = MoshiLM(moshi_preset("tiny"))
    nbytes = engine_bench.lm_step_bytes(lm, [100] * 4, 0.5625)
    entry = {"split_median_ms": {"lm_step": 3.0}}
    floor = engine_bench.bytes_floor(lm, [100] * 4, 0.5625, entry, 1000.0)  # 1 TB/s
    assert floor["lm_floor_ms"] == round(nbytes / 1e9, 2)
    assert floor["lm_over_floor"] == round(3.0 / (nbytes / 1e9), 2)
    assert "lm_floor_ms" not in engine_bench.bytes_floor(lm, [1], 1, entry, None)  # no GPU
