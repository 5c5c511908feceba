#!/usr/bin/env bash
# The first call on a lent GPU host after a kernel or engine change, in one script (one call):
# the GPU tests of the kernels and the 7B's GPU paths, then the engine's step at full context
# at the card's batch (256 on an H200, 128 on an H100; int4 KV, fp8 weights, bf16 Mimi), each
# with a time limit so that one hang leaves the rest. Needs .whl/ (bench/device_wheels.sh)
# carried. Results go to $OUT (the run tool's folder; out/ here when unset). Usage:
#
#   bash bench/device_checks.sh [extra duplex_engine.py arguments, e.g. --int4-kernel NAME]
set -uo pipefail
# (pytest without -q: the project's addopts give -q already, and -qq drops the summary line)
cd "$(dirname "$0")/.."
# shellcheck source=bench/_device_env.sh
source bench/_device_env.sh || exit 1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "tree $(python3 bench/_source.py)"
start=$SECONDS
timeout 240 python3 -m pytest -p no:cacheprovider tests/kernels \
    tests/models/moshi/test_fp8_weights.py tests/models/moshi/test_mimi_graph.py \
    tests/models/moshi/test_kv_int4_ring.py tests/models/moshi/test_static_step.py \
    tests/bench/test_engine_int4_kernel.py -rfE 2>&1 | grep -E "FAILED|ERROR|passed|failed|skipped" | tail -12
echo "GPU tests: $((SECONDS - start)) s"
timeout 150 python3 bench/duplex_engine.py --phases ours-int4 --batches "$card_batch" --steps 20 \
    --weight-dtype fp8 --codec-dtype bf16 --out "$OUT/engine-int4-full-$card_batch" "$@" 2>&1 |
    grep -E "median|error|Error" | head -4 | cut -c1-400
rm -f "$OUT"/*.png "$OUT"/*.md  # the run tool returns 8 files a call: keep the JSON
echo "engine: $((SECONDS - start)) s"
